"""Bench-only loss kernels: what the loss benchmark compares the production kernel with.

Nothing in production imports this module. ``scripts/bench.py loss`` measures the naive [N, V]
loss, :func:`chunked_token_divergence` (row chunks on given logits, analytic backward) and
:func:`fused_linear_token_divergence` (the lm_head inside the chunk, recomputed in backward) against
the production kernel ``recipe.opsd.core.losses.fused_linear_weighted_divergence``, which forms its
gradients in forward. All three share the per-entry formulas and the row kernel of
``recipe.opsd.core.losses``; the tests use them to check that kernel from two more sides.
"""

from __future__ import annotations

import torch

from recipe.opsd.core.losses import (
    _accumulate_input_grads,
    _check_fused_inputs,
    _fused_chunk,
    _logit_inputs,
    _Opts,
    _row_chunks,
    _rows_value_and_grad,
    _Workspace,
)

__all__ = ["chunked_token_divergence", "fused_linear_token_divergence"]


class _ChunkedDivergence(torch.autograd.Function):
    """Row-chunked divergence on given logits; backward recomputes each chunk analytically."""

    @staticmethod
    def forward(ctx, student_NV, teacher_NV, o: _Opts, chunk_size: int, cdt: torch.dtype):
        values_N = torch.empty(student_NV.shape[0], dtype=cdt, device=student_NV.device)
        workspace = _Workspace(student_NV.device)
        for rows in _row_chunks(student_NV.shape[0], chunk_size):
            values_N[rows], _ = _rows_value_and_grad(student_NV[rows], teacher_NV[rows], o, cdt, False, workspace)
        ctx.save_for_backward(student_NV, teacher_NV)
        ctx.o, ctx.chunk_size, ctx.cdt = o, chunk_size, cdt
        return values_N

    @staticmethod
    def backward(ctx, grad_N):
        student_NV, teacher_NV = ctx.saved_tensors
        grad_NV = torch.empty_like(student_NV)
        workspace = _Workspace(student_NV.device)
        for rows in _row_chunks(student_NV.shape[0], ctx.chunk_size):
            _, g = _rows_value_and_grad(student_NV[rows], teacher_NV[rows], ctx.o, ctx.cdt, True, workspace)
            grad_NV[rows] = g.mul_(grad_N[rows, None].to(ctx.cdt))
        return grad_NV, None, None, None, None




class _FusedLinearDivergence(torch.autograd.Function):
    """Row-chunked divergence with the lm_head matmul inside the chunk; no [N, V] tensor is kept."""

    @staticmethod
    def forward(ctx, hs_NH, ws_VH, bs_V, ht_NH, wt_VH, bt_V, o: _Opts, chunk_size: int, cdt: torch.dtype):
        values_N = torch.empty(hs_NH.shape[0], dtype=cdt, device=hs_NH.device)
        workspace = _Workspace(hs_NH.device)
        for rows in _row_chunks(hs_NH.shape[0], chunk_size):
            values_N[rows], _ = _fused_chunk(hs_NH, ws_VH, bs_V, ht_NH, wt_VH, bt_V, rows, o, cdt, False, workspace)
        ctx.save_for_backward(hs_NH, ws_VH, bs_V, ht_NH, wt_VH, bt_V)
        ctx.o, ctx.chunk_size, ctx.cdt = o, chunk_size, cdt
        return values_N

    @staticmethod
    def backward(ctx, grad_N):
        hs_NH, ws_VH, bs_V, ht_NH, wt_VH, bt_V = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        cdt = ctx.cdt
        grad_h = torch.empty_like(hs_NH) if need_h else None
        # weight / bias gradients accumulate over chunks in the compute dtype (fp32 for bf16 weights)
        grad_w = torch.zeros(ws_VH.shape, dtype=cdt, device=ws_VH.device) if need_w else None
        grad_b = torch.zeros(bs_V.shape, dtype=cdt, device=bs_V.device) if need_b and bs_V is not None else None
        workspace = _Workspace(hs_NH.device)
        for rows in _row_chunks(hs_NH.shape[0], ctx.chunk_size):
            _, g = _fused_chunk(hs_NH, ws_VH, bs_V, ht_NH, wt_VH, bt_V, rows, ctx.o, cdt, True, workspace)
            _accumulate_input_grads(g.mul_(grad_N[rows, None].to(cdt)), hs_NH, ws_VH, rows, grad_h, grad_w, grad_b,
                                    workspace)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(ws_VH.dtype),
            None if grad_b is None else grad_b.to(bs_V.dtype),
            None, None, None, None, None, None,
        )




def fused_linear_token_divergence(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    topk: int | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``token_divergence(hs @ Ws.T + bs, ht @ Wt.T + bt)`` without materialising [N, V].

    The lm_head matmul runs per row chunk in the input dtype (as the model's lm_head
    would), the divergence in float32 (float64 for float64 inputs); backward recomputes
    each chunk. Gradients go to ``student_hidden_NH``, ``student_weight_VH`` and
    ``student_bias``; the teacher side is a constant. Returns ``Tensor[N]``.
    """
    o, cdt = _check_fused_inputs(
        student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, student_bias, teacher_bias,
        beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
        teacher_temperature=teacher_temperature, topk=topk, chunk_size=chunk_size,
    )
    return _FusedLinearDivergence.apply(
        student_hidden_NH, student_weight_VH, student_bias,
        teacher_hidden_NH.detach(), teacher_weight_VH.detach(),
        None if teacher_bias is None else teacher_bias.detach(),
        o, chunk_size, cdt,
    )




def chunked_token_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    beta: float = 0.0,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    topk: int | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``token_divergence`` on given logits, row chunk by row chunk with the analytic gradient
    (recomputed in backward): extra memory O(chunk_size x V) plus the gradient of the input."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1; got {chunk_size!r}")
    student_NV, teacher_NV, o, cdt = _logit_inputs(student_logits, teacher_logits, beta=beta, clip_tau=clip_tau,
                                                   student_temperature=student_temperature,
                                                   teacher_temperature=teacher_temperature, topk=topk,
                                                   chunk_size=chunk_size)
    return _ChunkedDivergence.apply(student_NV, teacher_NV, o, chunk_size, cdt).reshape(student_logits.shape[:-1])
