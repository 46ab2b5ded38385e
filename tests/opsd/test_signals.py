"""Token-level signals of recipe.opsd.core.signals against hand-written 3-entry distributions and
float64 references (the unclipped beta=0 term of paper eq:opsd_clipped / eq:generalized_jsd,
sampled-token advantage, paper table columns, position windows, HE20 shares).

Run: python -m pytest tests/opsd/test_signals.py
"""

import math

import pytest
import torch

from recipe.opsd.core.signals import (
    SIGNAL_KEYS,
    TOP_PUSH_KEYS,
    divergence_mass_by_token,
    divergence_mass_by_token_from_hidden,
    entropy_tail_shares,
    position_windows,
    summarize_signals,
    token_signals,
    token_signals_from_hidden,
    top_push_summary,
)
from recipe.opsd.core.losses import token_divergence

LN2 = math.log(2.0)
# rows 0, 1: pS = (1/2, 1/4, 1/4), pT = (1/4, 1/2, 1/4); row 2: pS = pT = (0.7, 0.2, 0.1)
PS = torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.7, 0.2, 0.1]], dtype=torch.float64)
PT = torch.tensor([[0.25, 0.5, 0.25], [0.25, 0.5, 0.25], [0.7, 0.2, 0.1]], dtype=torch.float64)
Y = torch.tensor([1, 0, 2])


@pytest.mark.parametrize("chunk_size", [1, 2, 1024])
def test_token_signals_by_hand(chunk_size):
    sig = token_signals(PS.log(), PT.log(), Y, clip_tau=0.05, chunk_size=chunk_size)
    assert set(sig) == set(SIGNAL_KEYS)
    h_ps = 1.5 * LN2  # 1/2 ln 2 + 2 * 1/4 ln 4
    h_row2 = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    expect = {
        # d = (1/4 ln 1/2, 1/2 ln 2, 0) -> ln2/4; identical distributions -> 0
        "fwd_kl": [LN2 / 4, LN2 / 4, 0.0],
        "student_entropy": [h_ps, h_ps, h_row2],
        "teacher_entropy": [h_ps, h_ps, h_row2],
        "top1_agree": [0.0, 0.0, 1.0],
        # a = log pT(y) - log pS(y): y=1: ln(1/2) - ln(1/4) = ln2; y=0: ln(1/4) - ln(1/2) = -ln2; 0
        "adv": [LN2, -LN2, 0.0],
        # y=1 is the teacher argmax; y=0 has one strictly larger teacher entry; 0.1 is third
        "teacher_rank": [0.0, 1.0, 2.0],
        "student_logp": [math.log(0.25), math.log(0.5), math.log(0.1)],
        "teacher_logp": [math.log(0.5), math.log(0.25), math.log(0.1)],
        # only d_1 = 0.3466 exceeds 0.05: 1 of 3 entries, teacher mass 1/2
        "clip_frac": [1 / 3, 1 / 3, 0.0],
        "clipped_teacher_mass": [0.5, 0.5, 0.0],
    }
    for key, values in expect.items():
        torch.testing.assert_close(sig[key], torch.tensor(values, dtype=torch.float64), msg=key)


def test_ties_share_the_best_teacher_rank_and_no_clip_gives_zeros():
    sig = token_signals(PS.log(), PT.log(), torch.tensor([2, 2, 0]), clip_tau=None)
    torch.testing.assert_close(sig["teacher_rank"], torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    assert torch.equal(sig["clip_frac"], torch.zeros(3, dtype=torch.float64))


def test_summarize_signals_by_hand():
    s = summarize_signals(token_signals(PS.log(), PT.log(), Y, clip_tau=0.05))
    assert s["fwd_kl"] == pytest.approx(LN2 / 6)          # (ln2/4 + ln2/4 + 0) / 3
    assert s["d_gt_005"] == pytest.approx(200 / 3)        # 2 of 3 positions have KL 0.173 > 0.05
    assert s["abs_adv"] == pytest.approx(2 * LN2 / 3)
    assert s["adv"] == pytest.approx(0.0, abs=1e-12)
    assert s["agree"] == pytest.approx(100 / 3)
    assert s["enc"] == pytest.approx(100 / 3) and s["disc"] == pytest.approx(100 / 3)  # the tie is neither
    assert s["clip_frac"] == pytest.approx(2 / 9)
    assert s["clipped_teacher_mass"] == pytest.approx(1 / 3)
    # HE20 keeps ceil(0.2 * 3) = 1 position: row 0 (entropy 1.04 ties row 1, earlier index wins)
    assert s["he20_kl"] == pytest.approx(50.0) and s["he20_abs_adv"] == pytest.approx(50.0)
    assert s["n_positions"] == 3
    with_windows = summarize_signals(token_signals(PS.log(), PT.log(), Y), positions_N=torch.tensor([0, 130, 5000]))
    assert with_windows["fwd_kl_w0_128_mean"] == pytest.approx(LN2 / 4)
    assert with_windows["fwd_kl_w4096_6144_mean"] == 0.0
    assert math.isnan(with_windows["fwd_kl_w256_512_mean"])


def test_summarize_empty_and_missing_keys():
    empty = {k: torch.zeros(0) for k in SIGNAL_KEYS}
    s = summarize_signals(empty)
    assert math.isnan(s["fwd_kl"]) and s["n_positions"] == 0
    with pytest.raises(ValueError, match="missing keys"):
        summarize_signals({"fwd_kl": torch.zeros(2)})


def test_position_windows_by_hand():
    values = torch.tensor([1.0, 3.0, 5.0, 100.0])
    positions = torch.tensor([0, 127, 128, 5000])
    out = position_windows(values, positions, windows=((0, 128), (128, 256), (256, 512), (4096, 6144)))
    assert out[0] == {"lo": 0, "hi": 128, "mean": 2.0, "std": 1.0, "snr": 2.0, "count": 2}  # population std
    assert out[1]["mean"] == 5.0 and out[1]["count"] == 1 and math.isnan(out[1]["snr"])   # std 0
    assert out[2]["count"] == 0 and math.isnan(out[2]["mean"])
    assert out[3]["mean"] == 100.0
    assert [(w["lo"], w["hi"]) for w in position_windows(values, positions)] == [
        (0, 128), (128, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 6144)]


def test_entropy_tail_shares_by_hand():
    kl = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    adv = torch.tensor([-1.0, 1.0, 0.0, 0.0, 2.0])
    ent = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    # fraction 0.4 of 5 = 2 highest-entropy positions (indices 0, 1): KL 3 of 20, |adv| 2 of 4
    shares = entropy_tail_shares(kl, adv, ent, fraction=0.4)
    assert shares == {"kl_share": pytest.approx(15.0), "abs_adv_share": pytest.approx(50.0)}
    assert entropy_tail_shares(kl, adv, ent, fraction=0.2)["kl_share"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="fraction"):
        entropy_tail_shares(kl, adv, ent, fraction=0.0)


def test_divergence_mass_by_token_by_hand_and_accumulation():
    mass = divergence_mass_by_token(PS.log(), PT.log(), chunk_size=2)
    # two rows with d = (-ln2/4, ln2/2, 0) and one row with d = 0
    torch.testing.assert_close(mass, torch.tensor([-LN2 / 2, LN2, 0.0], dtype=torch.float64))
    assert mass.dtype == torch.float64
    again = divergence_mass_by_token(PS.log(), PT.log(), mass_V=mass)
    assert again is mass
    torch.testing.assert_close(mass, torch.tensor([-LN2, 2 * LN2, 0.0], dtype=torch.float64))


def _hidden_case(seed=0, n=10, h=8, v=60):
    g = torch.Generator().manual_seed(seed)
    hs, ht = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    ws = torch.randn(v, h, generator=g) * 0.7
    wt = ws + 0.2 * torch.randn(v, h, generator=g)
    bs, bt = torch.randn(v, generator=g), torch.randn(v, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    return hs, ws, ht, wt, bs, bt, y


def test_from_hidden_equals_from_logits_and_chunking_is_invisible():
    hs, ws, ht, wt, bs, bt, y = _hidden_case()
    opts = dict(student_temperature=1.1, teacher_temperature=0.9, clip_tau=0.05)
    ref = token_signals(hs @ ws.T + bs, ht @ wt.T + bt, y, chunk_size=1024, **opts)
    for cs in (1, 3, 7):
        got = token_signals_from_hidden(hs, ws, ht, wt, y, student_bias=bs, teacher_bias=bt, chunk_size=cs, **opts)
        for k in SIGNAL_KEYS:
            torch.testing.assert_close(got[k], ref[k], msg=k)
    # float64 inputs: float32 logits of a chunked matmul round differently with the thread count (ulps)
    hs64, ws64, ht64, wt64, bs64, bt64 = (t.double() for t in (hs, ws, ht, wt, bs, bt))
    m1 = divergence_mass_by_token(hs64 @ ws64.T + bs64, ht64 @ wt64.T + bt64, student_temperature=1.1)
    m2 = divergence_mass_by_token_from_hidden(hs64, ws64, ht64, wt64, student_bias=bs64, teacher_bias=bt64,
                                              student_temperature=1.1, chunk_size=4)
    torch.testing.assert_close(m1, m2, rtol=1e-12, atol=1e-14)
    fwd_kl = token_signals(hs64 @ ws64.T + bs64, ht64 @ wt64.T + bt64, y, student_temperature=1.1)["fwd_kl"]
    torch.testing.assert_close(m1.sum(), fwd_kl.sum(), rtol=1e-12, atol=1e-14)


def test_float32_signals_match_float64_reference():
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(6, 400, generator=g) * 3, torch.randn(6, 400, generator=g) * 3
    y = torch.randint(0, 400, (6,), generator=g)
    sig = token_signals(s.bfloat16(), t.bfloat16(), y, student_temperature=1.1, chunk_size=4)
    assert sig["fwd_kl"].dtype == torch.float32
    ls = torch.log_softmax(s.bfloat16().double() / 1.1, -1)
    lt = torch.log_softmax(t.bfloat16().double() / 1.1, -1)
    ref_kl = (lt.exp() * (lt - ls)).sum(-1)
    assert (sig["fwd_kl"].double() - ref_kl).abs().max() <= 1e-5 * ref_kl.abs().max()
    torch.testing.assert_close(sig["student_entropy"].double(), torch.distributions.Categorical(logits=ls).entropy(), rtol=1e-5, atol=1e-6)
    ref_rank = (lt > lt.gather(1, y[:, None])).sum(1).double()
    assert torch.equal(sig["teacher_rank"].double(), ref_rank)


def test_signals_have_no_grad_and_validate_inputs():
    s = torch.randn(3, 5, requires_grad=True)
    sig = token_signals(s, torch.randn(3, 5), torch.tensor([0, 1, 2]))
    assert all(not v.requires_grad for v in sig.values())
    with pytest.raises(ValueError, match="sampled_ids_N"):
        token_signals(s, torch.randn(3, 5), torch.tensor([0, 1, 5]))
    with pytest.raises(ValueError, match="sampled_ids_N"):
        token_signals(s, torch.randn(3, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="student_temperature"):
        token_signals(s, torch.randn(3, 5), torch.tensor([0, 1, 2]), student_temperature=0.0)
    with pytest.raises(ValueError, match="clip_tau"):
        token_signals(s, torch.randn(3, 5), torch.tensor([0, 1, 2]), clip_tau=-1.0)


# ----------------------------------------------------------------- signals from the loss's own pass
def _pass_case(n=13, h=7, v=29, seed=4):
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(n, h, generator=g, dtype=torch.float64).requires_grad_(True)
    ws = (torch.randn(v, h, generator=g, dtype=torch.float64) * 0.7).requires_grad_(True)
    ht = hs.detach() + 0.6 * torch.randn(n, h, generator=g, dtype=torch.float64)
    wt = ws.detach() + 0.2 * torch.randn(v, h, generator=g, dtype=torch.float64)
    bs = torch.randn(v, generator=g, dtype=torch.float64) * 0.3
    ids = torch.randint(0, v, (n,), generator=g)
    # weights as the actor sets them: 0 outside the loss positions
    w = torch.rand(n, generator=g, dtype=torch.float64) * (torch.rand(n, generator=g) > 0.4)
    return hs, ws, ht, wt, bs, ids, w


@pytest.mark.parametrize("opts", [
    dict(beta=0.0, clip_tau=0.05, student_temperature=1.1),
    dict(beta=0.5, clip_tau=None, student_temperature=0.9, teacher_temperature=1.2),
    dict(beta=1.0, clip_tau=0.01, student_temperature=1.0),
], ids=str)
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_signals_from_the_loss_pass_equal_token_signals(opts, chunk_size):
    """float64: every signal of the fused pass equals signals.token_signals on the full logits; the
    loss and gradients equal losses.fused_linear_weighted_divergence's (rows of weight 0 included)."""
    from recipe.opsd.core.losses import fused_linear_weighted_divergence
    from recipe.opsd.core.signals import weighted_divergence_and_signals

    hs, ws, ht, wt, bs, ids, w = _pass_case()
    assert 0 < int((w == 0).sum()) < len(w)
    loss, values, sig = weighted_divergence_and_signals(
        hs, ws, ht, wt, ids, row_weights_N=w, student_bias=bs, chunk_size=chunk_size, **opts
    )
    temps = {k: v for k, v in opts.items() if k.endswith("temperature")}
    ref = token_signals((hs @ ws.T + bs).detach(), ht @ wt.T, ids, clip_tau=opts["clip_tau"], **temps)
    assert set(sig) == set(SIGNAL_KEYS)
    for key in SIGNAL_KEYS:
        torch.testing.assert_close(sig[key], ref[key], rtol=1e-12, atol=1e-13, msg=key)
    grads = torch.autograd.grad(loss, (hs, ws))
    ref_loss, ref_values = fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=w, student_bias=bs,
                                                            chunk_size=chunk_size, **opts)
    ref_grads = torch.autograd.grad(ref_loss, (hs, ws))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(values, ref_values, rtol=1e-13, atol=1e-14)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert torch.all(grads[0][w == 0] == 0)


def test_student_entropy_from_hidden_equals_the_signal():
    from recipe.opsd.core.signals import student_entropy_from_hidden

    hs, ws, ht, wt, bs, ids, _ = _pass_case(seed=9)
    ref = token_signals_from_hidden(hs, ws, ht, wt, ids, student_bias=bs, student_temperature=1.1, chunk_size=5)
    got = student_entropy_from_hidden(hs, ws, bias=bs, temperature=1.1, chunk_size=3)
    torch.testing.assert_close(got, ref["student_entropy"], rtol=1e-13, atol=1e-14)


def test_the_fused_pass_refuses_a_top_k_support():
    from recipe.opsd.core.losses import fused_linear_weighted_divergence

    hs, ws, ht, wt, _, _, w = _pass_case()
    with pytest.raises(ValueError, match="on_chunk needs the full vocabulary"):
        fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=w, topk=4, on_chunk=lambda *a: None)


# ------------------------------------------------------------------ the teacher's top token under one descent step
def test_top_push_by_hand_the_clip_reverses_the_decisive_position():
    # the worked example of docs/core_math.md in three entries: the teacher puts 0.7 on entry 0, the student 0.05
    ps = torch.tensor([[0.05, 0.9, 0.05], [0.7, 0.2, 0.1]], dtype=torch.float64)
    pt = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]], dtype=torch.float64)
    sig = token_signals(ps.log(), pt.log(), torch.tensor([1, 0]), clip_tau=0.05, top_push=True)
    assert set(sig) == set(SIGNAL_KEYS) | set(TOP_PUSH_KEYS)
    # row 0: d = (0.7 ln 14, 0.2 ln(2/9), 0.1 ln 2): only entry 1 is kept, M = 0.2, sum_K pS pT = 0.18,
    # sum pS^2 = 0.815: clipped -0.05 * 0.2 - 0.18 + 0.2 * 0.815 = -0.027; unclipped 0.7 - 0.05 - 0.22 + 0.815
    assert sig["top_push"][0].item() == pytest.approx(-0.027, abs=1e-15)
    assert sig["top_push_unclipped"][0].item() == pytest.approx(1.245, abs=1e-15)
    assert sig["decisive"].tolist() == [1.0, 0.0]  # row 1: both put the most on entry 0
    assert top_push_summary(sig) == {"decisive": 50.0, "clip_reversal": 100.0}
    no_clip = token_signals(ps.log(), pt.log(), torch.tensor([1, 0]), clip_tau=None, top_push=True)
    assert torch.equal(no_clip["top_push"], no_clip["top_push_unclipped"])
    assert top_push_summary(no_clip)["clip_reversal"] == 0.0
    assert "top_push" not in token_signals(ps.log(), pt.log(), torch.tensor([1, 0]))  # opt-in
    with pytest.raises(ValueError, match="top_push=True"):
        top_push_summary({"top_push": sig["top_push"]})


@pytest.mark.parametrize(("clip_tau", "temperature"), [(None, 1.0), (0.05, 1.0), (0.05, 1.1), (0.01, 0.7)])
def test_top_push_is_the_first_order_change_under_the_losss_own_descent_step(clip_tau, temperature):
    """Against autograd: the loss's gradient (token_divergence) as the step, the directional derivative of
    log_softmax(s / T)[argmax teacher] along it (a forward-mode jvp), in float64."""
    torch.manual_seed(3)
    s = torch.randn(12, 17, dtype=torch.float64) * 2
    t = torch.randn(12, 17, dtype=torch.float64) * 2
    sig = token_signals(s, t, torch.zeros(12, dtype=torch.long), clip_tau=clip_tau, student_temperature=temperature,
                        teacher_temperature=temperature, chunk_size=5, top_push=True)
    top = torch.log_softmax(t / temperature, -1).argmax(-1)
    for tau, key in ((clip_tau, "top_push"), (None, "top_push_unclipped")):
        s_ = s.clone().requires_grad_()
        loss = token_divergence(s_, t, clip_tau=tau, student_temperature=temperature, teacher_temperature=temperature)
        (grad,) = torch.autograd.grad(loss.sum(), s_)
        _, change = torch.func.jvp(lambda x: torch.log_softmax(x / temperature, -1).gather(1, top[:, None])[:, 0],
                                   (s,), (-grad,))
        torch.testing.assert_close(sig[key], change, rtol=1e-12, atol=1e-14)
