"""The pre-flight gate's model-level part, its pure pieces (``recipe.opsd.core.preflight``): windows,
window means (float64, by hand), the per-position values against the float64 reference on logits,
the none control's verdict and the report's table and metrics. The worker path itself runs in the
e2e launches (tests/e2e/test_opsd_e2e.py)."""

import math

import pytest
import torch

from recipe.opsd.core.losses import token_divergence
from recipe.opsd.core.preflight import (
    PreflightError,
    divergence_report,
    first_position_values,
    none_control_tolerance,
    position_window_edges,
    teacher_is_student,
    window_means,
)
from recipe.opsd.core.signals import token_signals


def test_window_edges_cut_at_k():
    assert position_window_edges(16) == ((0, 4), (4, 16))
    assert position_window_edges(32) == ((0, 4), (4, 16), (16, 32))
    assert position_window_edges(5) == ((0, 4), (4, 5))
    assert position_window_edges(3) == ((0, 3),)
    assert position_window_edges(1) == ((0, 1),)
    for bad in (0, -1, 2.5, True, "16"):
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            position_window_edges(bad)


def test_window_means_by_hand():
    # 2 rows x 6 positions; row 1 has 3 response tokens (the rest masked, values there must not count)
    values_RK = torch.tensor([[1.0, 2.0, 3.0, 4.0, 10.0, 20.0],
                              [5.0, 6.0, 7.0, 99.0, 99.0, 99.0]], dtype=torch.float64)
    mask_RK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    means = window_means(values_RK, mask_RK, windows=((0, 4), (4, 6)))
    assert means == [(1 + 2 + 3 + 4 + 5 + 6 + 7) / 7, (10 + 20) / 2]
    empty = window_means(values_RK, mask_RK, windows=((0, 1), (6, 8)))
    assert empty[0] == 3.0 and math.isnan(empty[1])
    with pytest.raises(ValueError, match="same shape"):
        window_means(values_RK, mask_RK[:, :3], windows=((0, 4),))


def _case(seed=0, n=5, h=6, v=11, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    hs, ht = torch.randn(n, h, generator=gen, dtype=dtype), torch.randn(n, h, generator=gen, dtype=dtype)
    ws, wt = torch.randn(v, h, generator=gen, dtype=dtype), torch.randn(v, h, generator=gen, dtype=dtype)
    ids = torch.randint(0, v, (n,), generator=gen)
    return hs, ws, ht, wt, ids


@pytest.mark.parametrize("beta,clip_tau,t_s,t_t,topk", [(0.0, 0.05, 1.1, None, None), (0.5, None, 1.0, 0.7, None),
                                                        (0.0, 0.05, 1.0, 1.3, 4)])
def test_first_position_values_are_the_loss_divergence_float64(beta, clip_tau, t_s, t_t, topk):
    hs, ws, ht, wt, ids = _case()
    out = first_position_values(hs, ws, ht, wt, ids, beta=beta, clip_tau=clip_tau, student_temperature=t_s,
                                teacher_temperature=t_t, topk=topk, chunk_size=2)
    logits_s, logits_t = hs @ ws.T, ht @ wt.T
    reference = token_divergence(logits_s, logits_t, beta=beta, clip_tau=clip_tau, student_temperature=t_s,
                                 teacher_temperature=t_t, topk=topk)
    torch.testing.assert_close(out["divergence"], reference, rtol=1e-12, atol=1e-12)
    kl = token_signals(logits_s, logits_t, ids, student_temperature=t_s, teacher_temperature=t_t, clip_tau=clip_tau)
    torch.testing.assert_close(out["fwd_kl"], kl["fwd_kl"], rtol=1e-12, atol=1e-12)
    # the control: the teacher at the student's temperature
    control = token_divergence(logits_s, logits_t, beta=beta, clip_tau=clip_tau, student_temperature=t_s,
                               teacher_temperature=t_s, topk=topk)
    torch.testing.assert_close(out["control"], control, rtol=1e-12, atol=1e-12)


def test_identical_inputs_give_an_exactly_zero_control_whatever_the_temperatures():
    hs, ws, _, _, ids = _case(dtype=torch.float32)
    out = first_position_values(hs, ws, hs.clone(), ws.clone(), ids, beta=0.0, clip_tau=0.05, student_temperature=1.1,
                                teacher_temperature=0.6, chunk_size=3)
    assert torch.equal(out["control"], torch.zeros(5))
    assert (out["divergence"] != 0).all()  # the configured temperatures differ: not zero (capped d_t can be < 0)


def _values(control_none):
    """2 rows of the configured context then 2 of none, 3 positions (row 1 and 3 have 2 tokens)."""
    divergence = torch.tensor([[0.4, 0.2, 0.6], [0.8, 0.0, 9.0], [0.0, 0.0, 0.0], [0.0, 0.0, 9.0]], dtype=torch.float64)
    fwd_kl = divergence * 2
    control = torch.zeros(4, 3, dtype=torch.float64)
    control[2:] = control_none
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    return {"divergence": divergence, "fwd_kl": fwd_kl, "control": control}, mask


def _report(control_none=0.0, kind="frozen_initial", weights_equal=True, dtype="float32"):
    values, mask = _values(control_none)
    return divergence_report(values, mask_RK=mask, is_none_R=[False, False, True, True], k=3,
                             teacher_context="full_solution", teacher_kind=kind, weights_equal=weights_equal,
                             dtype=dtype, settings="beta 0.0", seconds=0.5)


def test_report_table_metrics_and_a_zero_control():
    report = _report()
    assert report.ok and report.windows == ((0, 3),) and report.rows == 2
    # window 0-2 of the context rows: (0.4 + 0.2 + 0.6 + 0.8 + 0.0) / 5 (the masked 9.0 does not count)
    assert report.table["context"]["divergence"] == [pytest.approx(2.0 / 5, abs=1e-15)]
    assert report.table["context"]["fwd_kl"] == [pytest.approx(4.0 / 5, abs=1e-15)]
    assert report.table["none"]["divergence"] == [0.0]
    metrics = report.metrics()
    assert metrics["preflight/context/divergence_p0_2"] == pytest.approx(0.4)
    assert metrics["preflight/none/fwd_kl_p0_2"] == 0.0 and metrics["preflight/none_control_max"] == 0.0
    assert metrics["preflight/seconds"] == 0.5
    lines = report.lines()
    assert all(line.startswith("[opsd] preflight positions: ") for line in lines)
    assert "divergence of the first 3 response positions (2 rows" in lines[0]
    assert lines[1].split()[-1] == "0-2"
    assert lines[2].split()[3:] == ["full_solution", "divergence", "0.4"]
    assert lines[-1].startswith("[opsd] preflight positions: ok: none control max divergence 0 <= 1e-06")


def test_a_nonzero_control_fails_when_the_teacher_has_the_students_weights_and_is_reported_otherwise():
    failing = _report(control_none=1e-3)
    assert not failing.ok and failing.control_max == 1e-3
    assert "position ids, padding" in failing.verdict() and failing.lines()[-1].startswith(
        "[opsd] preflight positions: FAILED: none control max divergence 0.001 > 1e-06")
    assert not _report(control_none=float("nan")).ok  # a NaN control fails too
    assert _report(control_none=1e-7).ok  # within the float32 tolerance
    assert _report(control_none=1e-3, dtype="bfloat16").ok
    checkpoint = _report(control_none=0.3, kind="checkpoint", weights_equal=False)
    assert checkpoint.ok and "reported only" in checkpoint.verdict()
    assert issubclass(PreflightError, ValueError)


def test_tolerances_and_which_teachers_have_the_students_weights():
    assert none_control_tolerance("torch.float32") == 1e-6 and none_control_tolerance("bfloat16") == 2e-2
    with pytest.raises(ValueError, match="no none-control tolerance for dtype 'int8'"):
        none_control_tolerance("int8")
    assert teacher_is_student("frozen_initial", resumed=False) and teacher_is_student("ema", resumed=False)
    assert teacher_is_student("live", resumed=True) and not teacher_is_student("frozen_initial", resumed=True)
    assert not teacher_is_student("checkpoint", resumed=False)


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "16"])
def test_preflight_positions_is_validated(value):
    from recipe.opsd.core.config import OPSDConfig

    assert OPSDConfig().diagnostics.preflight_positions == 16
    with pytest.raises(ValueError, match="opsd.diagnostics.preflight_positions must be an integer >= 1"):
        OPSDConfig(diagnostics={"preflight_positions": value})


def test_the_workers_stand_in_loss_scores_each_row_where_its_response_is():
    """``worker._preflight_loss`` (the actor's loss function during the gate): values scattered
    to each micro-batch row's response positions, tagged with the row index; the live head (teacher
    weight None) is the student's; the returned loss is 0."""
    from recipe.opsd.core.config import LossConfig
    from recipe.opsd.worker import PREFLIGHT_ROW_KEY, _preflight_loss

    gen = torch.Generator().manual_seed(3)
    hidden_bRH, teacher_bRH = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 3, 4, generator=gen)
    weight_VH = torch.randn(7, 4, generator=gen)
    mask_bR = torch.tensor([[1, 1, 1], [1, 0, 0]])
    responses_bR = torch.tensor([[1, 2, 3], [4, 0, 0]])
    data = {"response_mask": mask_bR, "responses": responses_bR, "teacher_hidden": teacher_bRH,
            PREFLIGHT_ROW_KEY: torch.tensor([5, 2])}
    store = {"rows": []}
    loss_config = LossConfig()
    loss, metrics = _preflight_loss({"student_hidden": hidden_bRH, "student_weight": weight_VH, "student_bias": None},
                                    data, loss_config=loss_config, teacher_weight_VH=None, store=store)
    assert float(loss) == 0.0 and metrics == {} and store["dtype"] == "float32"
    (rows_b, values), = store["rows"]
    assert rows_b.tolist() == [5, 2]
    mask = mask_bR.bool()
    expected = first_position_values(hidden_bRH[mask], weight_VH, teacher_bRH[mask], weight_VH, responses_bR[mask],
                                     beta=loss_config.beta, clip_tau=loss_config.clip_tau,
                                     student_temperature=loss_config.student_temperature,
                                     teacher_temperature=loss_config.effective_teacher_temperature)
    for key in ("divergence", "fwd_kl", "control"):
        assert values[key].dtype == torch.float64 and values[key].shape == (2, 3)
        assert torch.equal(values[key][mask], expected[key].double()) and not values[key][~mask].any()
