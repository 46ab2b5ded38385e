"""Gradients of the chunked (custom autograd Function, analytic backward) and fused
(lm_head inside the chunk) paths of the divergence (recipe.opsd.core.losses, and the bench-only
kernels of benchmarks.loss_variants that share its row kernel): gradcheck in float64, chunked ==
unchunked autograd, fused == unfused (paper eq:opsd_clipped / eq:generalized_jsd).

Run: python -m pytest tests/opsd/test_fused_loss.py
"""

import pytest
import torch

from benchmarks.loss_variants import chunked_token_divergence, fused_linear_token_divergence
from recipe.opsd.core.losses import fused_linear_weighted_divergence
from recipe.opsd.core.losses import token_divergence as reference_divergence


def token_divergence(student_logits, teacher_logits, *, chunk_size=None, **options):
    """The reference on full logits (``chunk_size`` None) or the same divergence through the chunked
    analytic-gradient row kernel the production loss uses (``benchmarks.loss_variants``)."""
    if chunk_size is None:
        return reference_divergence(student_logits, teacher_logits, **options)
    return chunked_token_divergence(student_logits, teacher_logits, chunk_size=chunk_size, **options)

BRANCHES = [
    dict(beta=0.0), dict(beta=0.0, clip_tau=0.02), dict(beta=1.0), dict(beta=1.0, clip_tau=0.02),
    dict(beta=0.3), dict(beta=0.3, clip_tau=0.005), dict(beta=0.5, clip_tau=0.005),
    dict(beta=0.0, topk=3), dict(beta=1.0, topk=3, clip_tau=0.02), dict(beta=0.5, topk=3),
    dict(beta=0.0, clip_tau=0.02, student_temperature=1.3, teacher_temperature=0.8),
    dict(beta=1.0, student_temperature=0.9, teacher_temperature=1.2),
]


def _pair(n=5, v=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(n, v, generator=g, dtype=dtype) * 2).requires_grad_(True)
    t = torch.randn(n, v, generator=g, dtype=dtype) * 2
    return s, t


@pytest.mark.slow
@pytest.mark.parametrize("opts", BRANCHES, ids=str)
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_gradcheck_float64(opts, chunk_size):
    s, t = _pair()
    assert torch.autograd.gradcheck(lambda x: token_divergence(x, t, chunk_size=chunk_size, **opts), (s,))
    if opts.get("clip_tau"):  # the clip is active on some entries, so its gradient rule is exercised
        unclipped = token_divergence(s, t, **{**opts, "clip_tau": None})
        assert (token_divergence(s, t, **opts) < unclipped - 1e-6).any()


def test_clipped_entry_still_gets_gradient_through_the_normaliser():
    # pS = (1/2, 1/4, 1/4), pT = (1/4, 1/2, 1/4); clip 0.05 caps entry 1 (d_1 = ln2/2 = 0.347)
    s = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64).log().requires_grad_(True)
    t = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64).log()
    for cs in (None, 1):
        (g,) = torch.autograd.grad(token_divergence(s, t, clip_tau=0.05, chunk_size=cs).sum(), s)
        # g_v = dL/dlog pS_v = -pT_v * 1[d_v <= tau] = (-1/4, 0, -1/4); sum g = -1/2
        # dL/ds_j = g_j - pS_j sum g = (-1/4 + 1/4, 0 + 1/8, -1/4 + 1/8) = (0, 1/8, -1/8)
        torch.testing.assert_close(g, torch.tensor([[0.0, 0.125, -0.125]], dtype=torch.float64))


@pytest.mark.parametrize("opts", BRANCHES, ids=str)
def test_chunked_equals_unchunked_values_and_grads(opts):
    g = torch.Generator().manual_seed(4)
    s = (torch.randn(2, 5, 40, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    t = torch.randn(2, 5, 40, generator=g, dtype=torch.float64) * 3
    w = torch.randn(2, 5, generator=g, dtype=torch.float64)  # arbitrary upstream gradient
    ref = token_divergence(s, t, **opts)
    (ref_g,) = torch.autograd.grad((ref * w).sum(), s)
    for cs in (1, 3, 4, 7, 10, 64):  # 3, 4, 7 do not divide N = 10
        v = token_divergence(s, t, chunk_size=cs, **opts)
        (gv,) = torch.autograd.grad((v * w).sum(), s)
        torch.testing.assert_close(v, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(gv, ref_g, rtol=1e-12, atol=1e-14)


def test_chunked_float32_grads_match_float64_within_1e5():
    s64, t64 = _pair(n=9, v=500, seed=5)
    w = torch.randn(9, dtype=torch.float64)
    s32 = s64.detach().float().requires_grad_(True)
    for opts in (dict(beta=0.0, clip_tau=0.05, student_temperature=1.1), dict(beta=0.5), dict(beta=1.0, clip_tau=0.05)):
        (g64,) = torch.autograd.grad((token_divergence(s64, t64, **opts) * w).sum(), s64)
        for cs in (2, 4, 9):
            (g32,) = torch.autograd.grad((token_divergence(s32, t64.float(), chunk_size=cs, **opts) * w.float()).sum(), s32)
            assert (g32.double() - g64).abs().max() <= 1e-5 * g64.abs().max()


# ----------------------------------------------------------------------------- fused
def _linear_case(dtype=torch.float64, n=11, h=6, v=13, seed=6, bias=True):
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(n, h, generator=g, dtype=dtype).requires_grad_(True)
    ws = (torch.randn(v, h, generator=g, dtype=dtype) * 0.8).requires_grad_(True)
    bs = (torch.randn(v, generator=g, dtype=dtype) * 0.5).requires_grad_(True) if bias else None
    ht = hs.detach() + 0.5 * torch.randn(n, h, generator=g, dtype=dtype)
    wt = ws.detach() + 0.1 * torch.randn(v, h, generator=g, dtype=dtype)
    bt = torch.randn(v, generator=g, dtype=dtype) * 0.5 if bias else None
    return hs, ws, bs, ht, wt, bt


@pytest.mark.parametrize("opts", BRANCHES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_equals_unfused_values_and_grads(opts, dtype):
    hs, ws, bs, ht, wt, bt = _linear_case(dtype)
    w = torch.randn(hs.shape[0], dtype=dtype, generator=torch.Generator().manual_seed(7))
    ref = token_divergence(hs @ ws.T + bs, ht @ wt.T + bt, **opts)
    ref_grads = torch.autograd.grad((ref * w).sum(), (hs, ws, bs))
    # float32: both sides round differently; gradients are O(10) here (weights x upstream 3)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    for cs in (1, 4, 11, 32):
        v = fused_linear_token_divergence(hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, chunk_size=cs, **opts)
        assert v.shape == (hs.shape[0],)
        grads = torch.autograd.grad((v * w).sum(), (hs, ws, bs))
        torch.testing.assert_close(v, ref, **tol)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b, **tol)


def test_fused_gradcheck_float64_without_bias():
    hs, ws, _, ht, wt, _ = _linear_case(n=4, h=3, v=6, bias=False)
    for opts in (dict(beta=0.0, clip_tau=0.02), dict(beta=0.4, topk=3), dict(beta=1.0, clip_tau=0.02)):
        assert torch.autograd.gradcheck(
            lambda a, b: fused_linear_token_divergence(a, b, ht, wt, chunk_size=3, **opts), (hs, ws)
        )


def test_fused_teacher_side_is_constant_and_bf16_is_accurate():
    hs, ws, bs, ht, wt, bt = _linear_case(torch.float32, n=8, h=16, v=300)
    wt.requires_grad_(True)
    fused_linear_token_divergence(hs, ws, ht, wt, chunk_size=3).sum().backward()
    assert wt.grad is None and hs.grad is not None and ws.grad is not None
    hb, wb, htb, wtb = (x.detach().bfloat16() for x in (hs, ws, ht, wt))
    hb.requires_grad_(True)
    v = fused_linear_token_divergence(hb, wb, htb, wtb, clip_tau=0.05, student_temperature=1.1, chunk_size=3)
    assert v.dtype == torch.float32
    # float64 reference on the same bf16-rounded logits (the lm_head matmul runs in bf16, like the model's)
    ref = token_divergence((hb.detach() @ wb.T).double(), (htb @ wtb.T).double(), clip_tau=0.05, student_temperature=1.1)
    assert (v.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    v.sum().backward()
    assert hb.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kwargs, name",
    [({"beta": 2.0}, "beta"), ({"clip_tau": -0.1}, "clip_tau"), ({"topk": 14}, "topk"),
     ({"student_temperature": 0}, "student_temperature"), ({"teacher_temperature": -1.0}, "teacher_temperature"),
     ({"chunk_size": 0}, "chunk_size"), ({"student_bias": torch.zeros(5)}, "student_bias")],
)
def test_fused_invalid_arguments(kwargs, name):
    hs, ws, _, ht, wt, _ = _linear_case(bias=False)
    with pytest.raises(ValueError, match=name):
        fused_linear_token_divergence(hs, ws, ht, wt, **kwargs)
    with pytest.raises(ValueError, match="student_weight_VH"):
        fused_linear_token_divergence(hs, ws[:, :3], ht, wt)


def test_fused_mixed_dtypes_student_fp32_teacher_bf16():
    hs, ws, _, ht, wt, _ = _linear_case(torch.float32, n=9, h=8, v=50, bias=False)
    htb, wtb = ht.bfloat16(), wt.bfloat16()
    for beta in (0.0, 0.5, 1.0):
        v = fused_linear_token_divergence(hs, ws, htb, wtb, beta=beta, clip_tau=0.05, chunk_size=4)
        ref = token_divergence(hs @ ws.T, htb @ wtb.T, beta=beta, clip_tau=0.05)
        grads = torch.autograd.grad(v.sum(), (hs, ws))
        ref_grads = torch.autograd.grad(ref.sum(), (hs, ws))
        torch.testing.assert_close(v, ref, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", BRANCHES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_weighted_fused_equals_weighted_unfused(opts, dtype):
    """Gradients formed in forward == autograd through sum_n w_n d_n on full logits, any chunking."""
    hs, ws, bs, ht, wt, bt = _linear_case(dtype)
    w = torch.randn(hs.shape[0], dtype=dtype, generator=torch.Generator().manual_seed(7))
    ref = token_divergence(hs @ ws.T + bs, ht @ wt.T + bt, **opts)
    ref_loss = (ref * w).sum()
    ref_grads = torch.autograd.grad(3.0 * ref_loss, (hs, ws, bs))  # a non-unit upstream gradient
    # float32: both sides round differently; gradients are O(10) here (weights x upstream 3)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    for cs in (1, 4, 11, 32):
        loss, values = fused_linear_weighted_divergence(
            hs, ws, ht, wt, row_weights_N=w, student_bias=bs, teacher_bias=bt, chunk_size=cs, **opts
        )
        assert loss.shape == () and not values.requires_grad
        torch.testing.assert_close(values, ref.detach(), **tol)
        torch.testing.assert_close(loss, ref_loss.detach(), **tol)
        for a, b in zip(torch.autograd.grad(3.0 * loss, (hs, ws, bs)), ref_grads):
            torch.testing.assert_close(a, b, **tol)


def test_weighted_fused_second_backward_and_bad_weights():
    hs, ws, _, ht, wt, _ = _linear_case(n=4, h=3, v=6, bias=False)
    w = torch.tensor([0.5, 0.0, 2.0, -1.0], dtype=torch.float64)
    loss, _ = fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=w, clip_tau=0.02, chunk_size=3)
    ref = (token_divergence(hs @ ws.T, ht @ wt.T, clip_tau=0.02) * w).sum()
    loss.backward(retain_graph=True)  # the stored gradients are handed over to .grad
    ref_grads = torch.autograd.grad(ref, (hs, ws))
    torch.testing.assert_close(hs.grad, ref_grads[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ws.grad, ref_grads[1], rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="backward through the same graph twice"):
        loss.backward()
    with pytest.raises(ValueError, match="row_weights_N"):
        fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=w[:3])
    with pytest.raises(ValueError, match="clip_tau"):
        fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=w, clip_tau=-1.0)


def test_weighted_fused_bf16_weights_get_bf16_grads():
    hs, ws, _, ht, wt, _ = _linear_case(torch.float32, n=8, h=16, v=300, bias=False)
    hb, wb = hs.detach().bfloat16().requires_grad_(True), ws.detach().bfloat16().requires_grad_(True)
    w = torch.full((8,), 0.125)
    loss, values = fused_linear_weighted_divergence(hb, wb, ht.bfloat16(), wt.bfloat16(), row_weights_N=w,
                                                    clip_tau=0.05, chunk_size=3)
    ref = fused_linear_token_divergence(hb, wb, ht.bfloat16(), wt.bfloat16(), clip_tau=0.05, chunk_size=3)
    ref_grads = torch.autograd.grad((ref * w).sum(), (hb, wb))
    (2.0 * loss).backward()
    assert hb.grad.dtype == wb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(values, ref.detach())
    torch.testing.assert_close(hb.grad, 2.0 * ref_grads[0])
    torch.testing.assert_close(wb.grad, 2.0 * ref_grads[1])
