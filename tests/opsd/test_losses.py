"""Values of recipe.opsd.core.losses.token_divergence against hand-computed and float64 references
(paper eq:opsd_clipped and eq:generalized_jsd), plus argument validation and aggregation.

Run: python -m pytest tests/opsd/test_losses.py
"""

import math

import pytest
import torch

from benchmarks.loss_variants import chunked_token_divergence
from recipe.opsd.core.losses import LOSS_AGG_MODES, aggregation_weights
from recipe.opsd.core.losses import token_divergence as reference_divergence


def token_divergence(student_logits, teacher_logits, *, chunk_size=None, **options):
    """The reference on full logits (``chunk_size`` None) or the same divergence through the chunked
    analytic-gradient row kernel the production loss uses (``benchmarks.loss_variants``)."""
    if chunk_size is None:
        return reference_divergence(student_logits, teacher_logits, **options)
    return chunked_token_divergence(student_logits, teacher_logits, chunk_size=chunk_size, **options)


LN2 = math.log(2.0)


def _logits(*probs):
    """Logits whose softmax is exactly ``probs`` (one row per argument)."""
    return torch.tensor(probs, dtype=torch.float64).log()


# pS = (1/2, 1/4, 1/4), pT = (1/4, 1/2, 1/4)
PS = (0.5, 0.25, 0.25)
PT = (0.25, 0.5, 0.25)


@pytest.mark.parametrize("chunk_size", [None, 1])
def test_forward_kl_by_hand(chunk_size):
    # d_v = pT (log pT - log pS) = (1/4 ln(1/2), 1/2 ln 2, 0) = (-0.1733, 0.3466, 0); sum = ln2 / 4
    v = token_divergence(_logits(PS), _logits(PT), beta=0.0, chunk_size=chunk_size)
    assert v.shape == (1,)
    torch.testing.assert_close(v, torch.tensor([0.25 * LN2], dtype=torch.float64))


@pytest.mark.parametrize("chunk_size", [None, 1])
def test_clipped_forward_kl_is_negative_by_hand(chunk_size):
    # min(d_v, 0.05) = (-0.1733, 0.05, 0); sum = 0.05 - ln2 / 4 = -0.1233 < 0 (no lower clip)
    v = token_divergence(_logits(PS), _logits(PT), beta=0.0, clip_tau=0.05, chunk_size=chunk_size)
    torch.testing.assert_close(v, torch.tensor([0.05 - 0.25 * LN2], dtype=torch.float64))
    assert v.item() < 0


@pytest.mark.parametrize("chunk_size", [None, 1])
def test_the_clip_turns_the_gradient_of_a_clipped_entry_away_from_the_teacher_by_hand(chunk_size):
    # Forward KL: d loss / d z_S = pS - pT = (1/4, -1/4, 0): a descent step raises entry 1 (the teacher's favourite).
    # Clipped at 0.05, entry 1's term (ln2 / 2 = 0.35) is the constant 0.05; the kept entries U = {0, 2} give
    # d / d z_j = pS_j * sum_U pT - pT_j [j in U] = (1/2 * 1/2 - 1/4, 1/4 * 1/2, 1/4 * 1/2 - 1/4) = (0, 1/8, -1/8):
    # a descent step LOWERS entry 1, the one the teacher prefers most (docs/real_model.md §5a measures this on SmolLM2).
    for clip_tau, expected in ((None, (0.25, -0.25, 0.0)), (0.05, (0.0, 0.125, -0.125))):
        student = _logits(PS).requires_grad_(True)
        token_divergence(student, _logits(PT), beta=0.0, clip_tau=clip_tau, chunk_size=chunk_size).sum().backward()
        torch.testing.assert_close(student.grad, torch.tensor([expected], dtype=torch.float64))


@pytest.mark.parametrize("chunk_size", [None, 1])
def test_reverse_kl_by_hand(chunk_size):
    # pS = (1/2, 1/4, 1/4), pT = (1/8, 1/2, 3/8)
    # d_v = pS (log pS - log pT) = (1/2 ln 4, 1/4 ln(1/2), 1/4 ln(2/3)) = (0.6931, -0.1733, -0.1014)
    ps, pt = (0.5, 0.25, 0.25), (0.125, 0.5, 0.375)
    expect = 0.5 * math.log(4) + 0.25 * math.log(0.5) + 0.25 * math.log(2 / 3)  # 0.41847
    v = token_divergence(_logits(ps), _logits(pt), beta=1.0, chunk_size=chunk_size)
    torch.testing.assert_close(v, torch.tensor([expect], dtype=torch.float64))
    # clipped at 0.1: (0.1, -0.1733, -0.1014) -> -0.1747
    v = token_divergence(_logits(ps), _logits(pt), beta=1.0, clip_tau=0.1, chunk_size=chunk_size)
    torch.testing.assert_close(v, torch.tensor([0.1 + 0.25 * math.log(0.5) + 0.25 * math.log(2 / 3)], dtype=torch.float64))


@pytest.mark.parametrize("chunk_size", [None, 1])
def test_jsd_by_hand(chunk_size):
    # beta = 0.5: m = (3/8, 3/8, 1/4); KL(pT||m) = KL(pS||m) = 1/4 ln(2/3) + 1/2 ln(4/3) = 0.04248
    v = token_divergence(_logits(PS), _logits(PT), beta=0.5, chunk_size=chunk_size)
    torch.testing.assert_close(v, torch.tensor([0.25 * math.log(2 / 3) + 0.5 * math.log(4 / 3)], dtype=torch.float64))
    # beta = 0.25: m = 0.75 pS + 0.25 pT = (7/16, 5/16, 1/4)
    # d_0 = 0.25 * 1/4 ln((1/4)/(7/16)) + 0.75 * 1/2 ln((1/2)/(7/16)) = -0.034976 + 0.050074 = 0.015098
    # d_1 = 0.25 * 1/2 ln((1/2)/(5/16)) + 0.75 * 1/4 ln((1/4)/(5/16)) =  0.058750 - 0.041840 = 0.016911
    # d_2 = 0
    d0 = 0.0625 * math.log(4 / 7) + 0.375 * math.log(8 / 7)
    d1 = 0.125 * math.log(1.6) + 0.1875 * math.log(0.8)
    v = token_divergence(_logits(PS), _logits(PT), beta=0.25, chunk_size=chunk_size)
    torch.testing.assert_close(v, torch.tensor([d0 + d1], dtype=torch.float64))
    assert abs(d0 + d1 - 0.032009) < 1e-5
    # clip at 0.016: min(0.015098, .016) + min(0.016911, .016) = 0.031098
    v = token_divergence(_logits(PS), _logits(PT), beta=0.25, clip_tau=0.016, chunk_size=chunk_size)
    torch.testing.assert_close(v, torch.tensor([d0 + 0.016], dtype=torch.float64))


def test_endpoints_are_not_jsd_limits():
    # beta=0 is forward KL (0.1733 here), while the JSD near beta=0 tends to 0
    near_zero = token_divergence(_logits(PS), _logits(PT), beta=1e-6).item()
    assert near_zero < 1e-5
    assert token_divergence(_logits(PS), _logits(PT), beta=0.0).item() == pytest.approx(0.25 * LN2)


def test_temperatures_are_applied_separately():
    # student logits 2 log pS at T_S = 2 and teacher logits 0.5 log pT at T_T = 0.5 give pS and pT
    v = token_divergence(2 * _logits(PS), 0.5 * _logits(PT), student_temperature=2.0, teacher_temperature=0.5)
    torch.testing.assert_close(v, torch.tensor([0.25 * LN2], dtype=torch.float64))
    # teacher_temperature=None reuses the student's
    v = token_divergence(2 * _logits(PS), 2 * _logits(PT), student_temperature=2.0)
    torch.testing.assert_close(v, torch.tensor([0.25 * LN2], dtype=torch.float64))


def test_topk_supports_by_hand():
    ps, pt = (0.1, 0.2, 0.3, 0.4), (0.4, 0.3, 0.2, 0.1)
    # forward KL, teacher top-2 = ids {0, 1}: pT' = (4/7, 3/7), pS' = (1/3, 2/3)
    fwd = 4 / 7 * math.log((4 / 7) / (1 / 3)) + 3 / 7 * math.log((3 / 7) / (2 / 3))  # 0.11836
    for cs in (None, 1):
        v = token_divergence(_logits(ps), _logits(pt), beta=0.0, topk=2, chunk_size=cs)
        torch.testing.assert_close(v, torch.tensor([fwd], dtype=torch.float64))
    # reverse KL, STUDENT top-2 = ids {2, 3}: pS' = (3/7, 4/7), pT' = (2/3, 1/3)
    rev = 3 / 7 * math.log((3 / 7) / (2 / 3)) + 4 / 7 * math.log((4 / 7) / (1 / 3))
    # on the teacher's ids it would be 1/3 ln(7/12) + 2/3 ln(14/9) = 0.1149: a different number
    rev_on_teacher_ids = 1 / 3 * math.log(7 / 12) + 2 / 3 * math.log(14 / 9)
    assert abs(rev - rev_on_teacher_ids) > 1e-3
    for cs in (None, 1):
        v = token_divergence(_logits(ps), _logits(pt), beta=1.0, topk=2, chunk_size=cs)
        torch.testing.assert_close(v, torch.tensor([rev], dtype=torch.float64))
    # topk = V is the full vocabulary
    full = token_divergence(_logits(ps), _logits(pt), beta=0.5)
    torch.testing.assert_close(token_divergence(_logits(ps), _logits(pt), beta=0.5, topk=4), full)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("clip_tau", [None, 0.01])
@pytest.mark.parametrize("topk", [None, 2])
def test_uniform_teacher_equals_uniform_student_gives_zero(beta, clip_tau, topk):
    logits = torch.zeros(4, 5)
    for cs in (None, 3):
        v = token_divergence(logits, logits.clone(), beta=beta, clip_tau=clip_tau, topk=topk, chunk_size=cs)
        assert torch.equal(v, torch.zeros(4))


# ----------------------------------------------------------------------------- float64 reference
def _reference(s, t, *, beta, clip_tau, ts, tt, topk):
    """Independent float64 implementation: probabilities first, plain logs, explicit mixture."""
    s, t = s.double() / ts, t.double() / tt
    if topk is not None:
        ids = (s if beta == 1.0 else t).topk(topk, dim=-1).indices
        s, t = s.gather(-1, ids), t.gather(-1, ids)
    ps, pt = torch.softmax(s, -1), torch.softmax(t, -1)
    if beta == 0.0:
        d = pt * (pt.log() - ps.log())
    elif beta == 1.0:
        d = ps * (ps.log() - pt.log())
    else:
        m = (1 - beta) * ps + beta * pt
        d = beta * pt * (pt.log() - m.log()) + (1 - beta) * ps * (ps.log() - m.log())
    if clip_tau is not None:
        d = torch.minimum(d, torch.tensor(clip_tau, dtype=d.dtype))
    return d.sum(-1)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("clip_tau", [None, 0.05])
@pytest.mark.parametrize("topk", [None, 7])
@pytest.mark.parametrize("temps", [(1.0, None), (1.1, 0.7)])
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_float32_matches_float64_reference(beta, clip_tau, topk, temps, chunk_size):
    g = torch.Generator().manual_seed(1)
    s = torch.randn(3, 4, 50, generator=g) * 3
    t = s + torch.randn(3, 4, 50, generator=g)
    ts, tt = temps
    v = token_divergence(s, t, beta=beta, clip_tau=clip_tau, student_temperature=ts, teacher_temperature=tt,
                         topk=topk, chunk_size=chunk_size)
    assert v.shape == (3, 4) and v.dtype == torch.float32
    ref = _reference(s, t, beta=beta, clip_tau=clip_tau, ts=ts, tt=tt if tt is not None else ts, topk=topk)
    assert (v.double() - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-7
    if clip_tau is not None:  # the clip really bites in this configuration
        assert (ref < _reference(s, t, beta=beta, clip_tau=None, ts=ts, tt=tt or ts, topk=topk) - 1e-3).any()


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_bfloat16_inputs_give_float32_accurate_output(beta, chunk_size):
    g = torch.Generator().manual_seed(2)
    s = (torch.randn(6, 300, generator=g) * 3).bfloat16().requires_grad_(True)
    t = (torch.randn(6, 300, generator=g) * 3).bfloat16()
    v = token_divergence(s, t, beta=beta, clip_tau=0.05, student_temperature=1.1, chunk_size=chunk_size)
    assert v.dtype == torch.float32
    # the reference sees the same bf16-rounded logits, upcast exactly to float64
    ref = _reference(s.detach(), t, beta=beta, clip_tau=0.05, ts=1.1, tt=1.1, topk=None)
    assert (v.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    v.sum().backward()
    assert s.grad.dtype == torch.bfloat16 and torch.isfinite(s.grad.float()).all()


def test_teacher_gets_no_gradient():
    s = torch.randn(2, 5, requires_grad=True)
    t = torch.randn(2, 5, requires_grad=True)
    for cs in (None, 1):
        token_divergence(s, t, chunk_size=cs).sum().backward()
        assert t.grad is None and s.grad is not None


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"beta": -0.1}, "beta"), ({"beta": 1.5}, "beta"), ({"beta": float("nan")}, "beta"),
        ({"clip_tau": 0.0}, "clip_tau"), ({"clip_tau": -1.0}, "clip_tau"),
        ({"topk": 0}, "topk"), ({"topk": 6}, "topk"), ({"topk": 2.0}, "topk"),
        ({"student_temperature": 0.0}, "student_temperature"), ({"student_temperature": -1.0}, "student_temperature"),
        ({"teacher_temperature": 0.0}, "teacher_temperature"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        token_divergence(torch.zeros(2, 5), torch.zeros(2, 5), **kwargs)


def test_shape_and_dtype_errors():
    with pytest.raises(ValueError, match="same shape"):
        token_divergence(torch.zeros(2, 5), torch.zeros(2, 6))
    with pytest.raises(ValueError, match="student_logits"):
        token_divergence(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5))


# ----------------------------------------------------------------------------- aggregation
# Rollouts of 3, 1 and 2 loss positions (6 in all), values written out by hand.
AGG_VALUES = torch.tensor([[1.0, 2.0, 3.0, 0.0], [10.0, 0.0, 0.0, 0.0], [4.0, 8.0, 0.0, 0.0]], dtype=torch.float64)
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)


def _agg(mode, mask=AGG_MASK, values=AGG_VALUES, *, tokens=6, sequences=3, horizon=4):
    w = aggregation_weights(mask, mode=mode, global_tokens=tokens, global_sequences=sequences, horizon=horizon)
    return float(torch.where(mask, values * w, torch.zeros(())).sum()), w


@pytest.mark.parametrize("mode, expected", [
    # the paper's eq. opd_obj: (mean(1, 2, 3) + mean(10) + mean(4, 8)) / 3 = (2 + 10 + 6) / 3
    ("seq-mean-token-mean", 6.0),
    ("token-mean", 28.0 / 6),  # (1 + 2 + 3 + 10 + 4 + 8) / 6: the 1-token rollout weighs 1/6, not 1/3
    ("seq-mean-token-sum", 28.0 / 3),
    ("seq-mean-token-sum-norm", 28.0 / 12),  # / (3 rollouts x horizon 4)
    ("token-sum", 28.0),
])
def test_aggregation_modes_by_hand(mode, expected):
    value, w = _agg(mode)
    assert value == pytest.approx(expected, rel=1e-15)
    assert torch.all(w[~AGG_MASK] == 0) and w.dtype == torch.float64


def test_aggregation_over_micro_batches_and_ranks_equals_the_mini_batch():
    """Any split of whole rollouts into micro-batches (and ranks) sums to the mini-batch value,
    because the weights use the mini-batch's global counts; the official code's per-micro-batch token
    mean (averaged over micro-batches) is a different number."""
    for mode in LOSS_AGG_MODES:
        full, _ = _agg(mode)
        parts = [_agg(mode, AGG_MASK[rows], AGG_VALUES[rows])[0] for rows in (slice(0, 1), slice(1, 3))]
        assert sum(parts) == pytest.approx(full, rel=1e-15), mode
    per_micro_batch = ((1 + 2 + 3 + 10) / 4 + (4 + 8) / 2) / 2  # micro-batches {0, 1}, {2}: 5.0
    assert per_micro_batch != pytest.approx(_agg("token-mean")[0]) and per_micro_batch != pytest.approx(6.0)


def test_a_rollout_without_loss_positions_is_not_counted():
    """AdvT can reject every position of a rollout: it gets no weight and is not one of the S rollouts."""
    mask = AGG_MASK.clone()
    mask[1] = False
    value, w = _agg("seq-mean-token-mean", mask, tokens=5, sequences=2)
    assert value == pytest.approx((2.0 + 6.0) / 2) and torch.all(w[1] == 0)
    value, _ = _agg("seq-mean-token-mean", torch.zeros_like(mask), tokens=0, sequences=0)
    assert value == 0.0  # nothing selected anywhere: 0, no NaN


def test_aggregation_refuses_local_counts_above_the_global_ones_and_unknown_modes():
    with pytest.raises(ValueError, match="global_tokens=5 / global_sequences=3 are smaller than this micro-batch's 6"):
        _agg("token-mean", tokens=5)
    with pytest.raises(ValueError, match="smaller"):
        _agg("seq-mean-token-mean", sequences=2)
    with pytest.raises(ValueError, match="must be one of"):
        _agg("seq-mean")
    with pytest.raises(ValueError, match="horizon"):
        _agg("seq-mean-token-sum-norm", horizon=None)
