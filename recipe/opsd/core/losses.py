"""OPSD per-position divergences over the full vocabulary (pure torch): the one copy of every loss formula.

The per-entry terms of forward KL (``beta=0``, the default), reverse KL (``beta=1``) and the generalized JSD,
each capped at ``clip_tau`` before the vocabulary sum, the ``topk`` support and the compute dtype:
docs/core_math.md, "The loss". :func:`token_divergence` is the readable reference on full logits;
:func:`fused_linear_weighted_divergence`, what training runs, forms the logits and the analytic gradient
(``_rows_value_and_grad``) of one row chunk at a time from hidden states and lm_head weights, never [N, V];
:func:`aggregation_weights` weights the positions by verl's ``loss_agg_mode`` names. Example::

    per_pos_BT = token_divergence(student_logits_BTV, teacher_logits_BTV, beta=0.0, clip_tau=0.05)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

__all__ = [
    "token_divergence",
    "fused_linear_weighted_divergence",
    "LOSS_AGG_MODES",
    "aggregation_weights",
    "log_probs",
    "entry_terms",
    "forward_kl_terms",
    "entropy",
    "compute_dtype",
]


# --------------------------------------------------------------------------- formulas
# The optional ``out`` / ``scratch`` buffers let the chunked kernels reuse [chunk, V] memory:
# a fresh multi-100-MB CPU allocation page-faults on every chunk and costs more than the math.
# Without buffers the helpers allocate and are differentiable (the autograd reference path).
def log_probs(logits: torch.Tensor, *, temperature: float, dtype: torch.dtype, out=None, scratch=None) -> torch.Tensor:
    """log softmax(logits / temperature) over the last dim, computed in ``dtype``.

    With buffers (no autograd): ``scratch`` receives the scaled logits (it may be ``logits``
    itself when the caller owns it) and ``out`` the result.
    """
    if out is None:
        return F.log_softmax(logits.to(dtype) / temperature, dim=-1)
    scaled = scratch.copy_(logits)
    if temperature != 1.0:
        scaled.div_(temperature)
    return torch._log_softmax(scaled, -1, False, out=out)


def forward_kl_terms(logp_t: torch.Tensor, logp_s: torch.Tensor, *, out=None, scratch=None) -> torch.Tensor:
    """Per-entry forward-KL contributions d_v = pT_v (log pT_v - log pS_v) (eq:opsd_clipped)."""
    return torch.sub(logp_t, logp_s, out=out).mul_(torch.exp(logp_t, out=scratch))


def _log_mixture(logp_s, logp_t, beta: float, *, out=None, scratch=None) -> torch.Tensor:
    """log m with m = (1 - beta) pS + beta pT, computed in log space (0 < beta < 1)."""
    log_student_part = torch.add(logp_s, math.log1p(-beta), out=out)  # log((1 - beta) pS)
    log_teacher_part = torch.add(logp_t, math.log(beta), out=scratch)  # log(beta pT)
    return torch.logaddexp(log_student_part, log_teacher_part, out=out)


def entry_terms(logp_s: torch.Tensor, logp_t: torch.Tensor, *, beta: float, out=None, scratch=None, scratch2=None) -> torch.Tensor:
    """Unclipped per-vocabulary-entry terms d_v of the beta-divergence (docs/core_math.md, "The loss"; the paper's
    eq:opsd_clipped for beta 0, eq:generalized_jsd between); the endpoints are their own branches, not limits."""
    if beta == 0.0:
        return forward_kl_terms(logp_t, logp_s, out=out, scratch=scratch)
    if beta == 1.0:
        return torch.sub(logp_s, logp_t, out=out).mul_(torch.exp(logp_s, out=scratch))
    logm = _log_mixture(logp_s, logp_t, beta, out=scratch, scratch=scratch2)
    teacher_part = torch.sub(logp_t, logm, out=out).mul_(torch.exp(logp_t, out=scratch2)).mul_(beta)
    student_part = torch.sub(logp_s, logm, out=scratch2)
    student_part.mul_(torch.exp(logp_s, out=scratch)).mul_(1.0 - beta)  # logm is no longer needed
    return teacher_part.add_(student_part)


def _entry_grad(logp_s, logp_t, *, beta: float, out=None, scratch=None, scratch2=None) -> torch.Tensor:
    """g_v = dd_v / dl_v for each entry, l = log pS (before the clip mask and the softmax normaliser):

    - forward KL:  g_v = -pT_v
    - reverse KL:  g_v = pS_v (l_v - log pT_v + 1)
    - JSD_beta:    g_v = (1 - beta) pS_v (l_v - log m_v)
    """
    if beta == 0.0:
        return torch.exp(logp_t, out=out).neg_()
    if beta == 1.0:
        return torch.sub(logp_s, logp_t, out=out).add_(1.0).mul_(torch.exp(logp_s, out=scratch))
    logm = _log_mixture(logp_s, logp_t, beta, out=scratch, scratch=scratch2)
    grad = torch.sub(logp_s, logm, out=out)
    return grad.mul_(torch.exp(logp_s, out=scratch2)).mul_(1.0 - beta)


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy -sum_v p_v log p_v over the last dim."""
    return -(logp.exp() * logp).sum(-1)


# --------------------------------------------------------------------------- options
@dataclass(frozen=True)
class _Opts:
    beta: float
    clip_tau: float | None
    student_temperature: float
    teacher_temperature: float
    topk: int | None


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_loss_options(*, beta, clip_tau, student_temperature, teacher_temperature, topk, chunk_size,
                          vocab_size: int | None, unchunked: bool = True, prefix: str = "") -> _Opts:
    """The one check of the loss options, for every entry point: the loss functions on raw arguments
    (``vocab_size``: the logits' V) and ``opsd.loss`` (``LossConfig``: ``prefix="opsd.loss."``,
    ``vocab_size=None``: V is not known yet). ``unchunked``: ``chunk_size=None`` (one chunk) is allowed.
    Each error names the option (``prefix`` + its name) and its allowed values."""

    def fail(name: str, allowed: str, value):
        raise ValueError(f"{prefix}{name} must be {allowed}; got {value!r}")

    if not _is_number(beta) or not 0.0 <= beta <= 1.0:
        fail("beta", "a number in [0, 1] (0 forward KL, 1 reverse KL, else generalized JSD)", beta)
    if clip_tau is not None and (not isinstance(clip_tau, (int, float)) or isinstance(clip_tau, bool) or not clip_tau > 0):
        fail("clip_tau", "None (no clip) or a number > 0", clip_tau)
    if not _is_number(student_temperature) or student_temperature <= 0:
        fail("student_temperature", "a finite number > 0", student_temperature)
    if teacher_temperature is None:
        teacher_temperature = student_temperature
    elif not _is_number(teacher_temperature) or teacher_temperature <= 0:
        fail("teacher_temperature", "None (= student_temperature) or a finite number > 0", teacher_temperature)
    if topk is not None and (not isinstance(topk, int) or isinstance(topk, bool) or topk < 1
                             or (vocab_size is not None and topk > vocab_size)):
        ints = ">= 1" if vocab_size is None else f"in [1, V={vocab_size}]"
        fail("topk", f"None (full vocabulary) or an int {ints}", topk)
    if (chunk_size is not None or not unchunked) and (
            not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1):
        fail("chunk_size", "None (unchunked) or an int >= 1" if unchunked else "an int >= 1", chunk_size)
    return _Opts(float(beta), None if clip_tau is None else float(clip_tau), float(student_temperature), float(teacher_temperature), topk)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype every divergence is computed in: float64 if an input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# --------------------------------------------------------------------------- row kernels
def _support_ids(student_logits, teacher_logits, opts: _Opts) -> torch.Tensor:
    """Top-k support ids [rows, k]: the teacher's for forward KL / JSD, the student's for reverse KL (both
    distributions are then renormalised on it, no tail bucket)."""
    ranked = student_logits if opts.beta == 1.0 else teacher_logits
    return ranked.topk(opts.topk, dim=-1, sorted=False).indices


class _Workspace:
    """Named [rows, V] buffers reused across the chunks of one forward or backward call."""

    def __init__(self, device: torch.device):
        self.device, self._buffers = device, {}

    def __call__(self, name: str, rows: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape[0] < rows or buffer.shape[1] != vocab or buffer.dtype != dtype:
            buffer = self._buffers[name] = torch.empty(rows, vocab, dtype=dtype, device=self.device)
        return buffer[:rows]


def _rows_value_and_grad(student_logits, teacher_logits, opts: _Opts, calc_dtype: torch.dtype, want_grad: bool,
                         workspace: _Workspace, owned: bool = False, need_values: bool = False, on_chunk=None):
    """Per-row values [rows] or, if ``want_grad``, (values or None, d value / d student_logits [rows, V]).

    With ``want_grad`` the values are computed only if there is a clip or ``need_values``.
    ``on_chunk(logp_s, logp_t)`` (full vocabulary, no top-k) is called with the chunk's two
    log-softmaxes before anything else uses the buffers; it must not modify them.

    Works on the raw logits of one chunk; everything inside is in ``calc_dtype``. ``owned`` means
    the raw logits are scratch buffers of the caller that may be overwritten. The
    returned gradient is a workspace view: consume it before the next chunk.

    The analytic gradient (derived per branch, gradchecked in the tests): with l = log pS (l_v = s_v / tau_S
    - lse(s / tau_S) of the student logits s), g_v = dL/dl_v from ``_entry_grad`` times the clip's
    subgradient k_v = 1[d_v <= clip_tau] (as ``torch.clamp``), dL/ds_j = (g_j - pS_j sum_v g_v) / tau_S. The
    softmax normaliser couples every entry, so a clipped entry still gets gradient through the
    ``- pS_j sum_v g_v`` part.

    Workspace buffers: ``student_logp`` / ``teacher_logp``; ``scratch`` / ``scratch2`` (the raw logits
    when the caller put them there, then temporaries, then pS); ``per_entry`` (the terms d_v, then their
    gradient); ``clipped`` (bool: d_v > clip_tau).
    """
    rows, vocab = student_logits.shape
    support_ids = None
    if opts.topk is not None:
        support_ids = _support_ids(student_logits, teacher_logits, opts)
        student_logits, teacher_logits = student_logits.gather(-1, support_ids), teacher_logits.gather(-1, support_ids)
        owned = True

    def buffer(name, dtype=calc_dtype):  # top-k rows are small: plain allocation
        return None if support_ids is not None else workspace(name, rows, vocab, dtype)

    logp_s = log_probs(student_logits, temperature=opts.student_temperature, dtype=calc_dtype,
                       out=buffer("student_logp"),
                       scratch=student_logits if owned and student_logits.dtype == calc_dtype else buffer("scratch"))
    logp_t = log_probs(teacher_logits, temperature=opts.teacher_temperature, dtype=calc_dtype,
                       out=buffer("teacher_logp"),
                       scratch=teacher_logits if owned and teacher_logits.dtype == calc_dtype else buffer("scratch"))
    del student_logits, teacher_logits
    if on_chunk is not None:
        on_chunk(logp_s, logp_t)
    values, clipped = None, None
    if not want_grad or opts.clip_tau is not None or need_values:  # backward needs the terms only for the clip mask
        terms = entry_terms(logp_s, logp_t, beta=opts.beta, out=buffer("per_entry"), scratch=buffer("scratch"),
                            scratch2=buffer("scratch2"))
        if opts.clip_tau is not None:
            if want_grad:  # min(d, tau) passes gradient where d <= tau (as torch.clamp does)
                clipped = torch.gt(terms, opts.clip_tau, out=buffer("clipped", torch.bool))
            terms.clamp_(max=opts.clip_tau)
        values = terms.sum(-1)
    if not want_grad:
        return values, None
    grad = _entry_grad(logp_s, logp_t, beta=opts.beta, out=buffer("per_entry"), scratch=buffer("scratch"),
                       scratch2=buffer("scratch2"))
    if clipped is not None:
        grad.masked_fill_(clipped, 0.0)
    grad_sum = grad.sum(-1, keepdim=True)
    p_s = torch.exp(logp_s, out=buffer("scratch"))
    grad.sub_(p_s.mul_(grad_sum))
    if opts.student_temperature != 1.0:
        grad.div_(opts.student_temperature)
    if support_ids is None:
        return values, grad
    return values, workspace("full_vocab_grad", rows, vocab, calc_dtype).zero_().scatter_(-1, support_ids, grad)


def _autograd_values(student_logits, teacher_logits, opts: _Opts, calc_dtype: torch.dtype) -> torch.Tensor:
    """Unchunked reference path: plain autograd through the same per-entry formulas."""
    teacher_logits = teacher_logits.detach()
    if opts.topk is not None:
        support_ids = _support_ids(student_logits.detach(), teacher_logits, opts)
        student_logits, teacher_logits = student_logits.gather(-1, support_ids), teacher_logits.gather(-1, support_ids)
    logp_s = log_probs(student_logits, temperature=opts.student_temperature, dtype=calc_dtype)
    logp_t = log_probs(teacher_logits, temperature=opts.teacher_temperature, dtype=calc_dtype)
    terms = entry_terms(logp_s, logp_t, beta=opts.beta)
    if opts.clip_tau is not None:
        terms = terms.clamp(max=opts.clip_tau)
    return terms.sum(-1)


def _row_chunks(n_rows: int, chunk_size: int):
    for start in range(0, n_rows, chunk_size):
        yield slice(start, min(start + chunk_size, n_rows))


# --------------------------------------------------------------------------- autograd Functions
def _chunk_logits(hidden_NH, weight_VH, bias_V, rows: slice, out: torch.Tensor) -> torch.Tensor:
    """lm_head logits of one row chunk (in the input dtype, like the model's lm_head) into ``out``."""
    if bias_V is None:
        return torch.mm(hidden_NH[rows], weight_VH.T, out=out)
    return torch.addmm(bias_V, hidden_NH[rows], weight_VH.T, out=out)


def _fused_chunk(student_hidden_NH, student_weight_VH, student_bias_V, teacher_hidden_NH, teacher_weight_VH,
                 teacher_bias_V, rows, opts, calc_dtype, want_grad, workspace: _Workspace, need_values=False,
                 on_chunk=None):
    n_rows, vocab = rows.stop - rows.start, student_weight_VH.shape[0]
    # raw logits go straight into the kernel's scratch buffers when they already have the compute dtype
    student_name = "scratch" if student_weight_VH.dtype == calc_dtype else "student_logits"
    teacher_name = "scratch2" if teacher_weight_VH.dtype == calc_dtype else "teacher_logits"
    student_logits = _chunk_logits(student_hidden_NH, student_weight_VH, student_bias_V, rows,
                                   workspace(student_name, n_rows, vocab, student_weight_VH.dtype))
    teacher_logits = _chunk_logits(teacher_hidden_NH, teacher_weight_VH, teacher_bias_V, rows,
                                   workspace(teacher_name, n_rows, vocab, teacher_weight_VH.dtype))
    return _rows_value_and_grad(student_logits, teacher_logits, opts, calc_dtype, want_grad, workspace, owned=True,
                                need_values=need_values, on_chunk=on_chunk)


def _accumulate_input_grads(grad_logits, student_hidden_NH, student_weight_VH, rows, grad_h, grad_w, grad_b,
                            workspace: _Workspace) -> None:
    """Chain one chunk's logit gradient [rows, V] through logits = hidden @ weight.T + bias (the student's).

    ``rows``: a slice of the chunk's rows, or an index tensor (the rows of a chunk with a nonzero
    weight; the other rows' ``grad_h`` must already be zero)."""
    if grad_h is not None:
        grad_in_weight_dtype = grad_logits
        if student_weight_VH.dtype != grad_logits.dtype:
            grad_in_weight_dtype = workspace("grad_in_weight_dtype", grad_logits.shape[0], grad_logits.shape[1],
                                             student_weight_VH.dtype).copy_(grad_logits)
        if isinstance(rows, slice):
            torch.mm(grad_in_weight_dtype, student_weight_VH, out=grad_h[rows])
        else:
            grad_h[rows] = torch.mm(grad_in_weight_dtype, student_weight_VH)
    if grad_w is not None:
        grad_w.addmm_(grad_logits.T, student_hidden_NH[rows].to(grad_logits.dtype))
    if grad_b is not None:
        grad_b += grad_logits.sum(0)


class _FusedLinearWeightedDivergence(torch.autograd.Function):
    """sum_n w_n d_n with the lm_head inside the chunk; every gradient is formed in forward.

    The weights are known in forward, so each chunk is visited once (values and gradient
    together) and the lm_head-sized matmuls are 4 (two logits, two gradients) instead of the
    6 of a kernel that recomputes both logits in backward. Backward only
    scales the stored [N, H] / [V, H] gradients by the incoming scalar.
    """

    @staticmethod
    def forward(ctx, student_hidden_NH, student_weight_VH, student_bias_V, teacher_hidden_NH, teacher_weight_VH,
                teacher_bias_V, row_weights_N, opts: _Opts, chunk_size: int, calc_dtype: torch.dtype, on_chunk):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        device = student_hidden_NH.device
        values_N = torch.empty(student_hidden_NH.shape[0], dtype=calc_dtype, device=device)
        grad_h = torch.zeros_like(student_hidden_NH) if need_h else None
        grad_w = (torch.zeros(student_weight_VH.shape, dtype=calc_dtype, device=student_weight_VH.device)
                  if need_w else None)
        grad_b = (torch.zeros(student_bias_V.shape, dtype=calc_dtype, device=student_bias_V.device)
                  if need_b and student_bias_V is not None else None)
        row_weights_N = row_weights_N.to(calc_dtype)
        workspace = _Workspace(device)
        want_grad = need_h or need_w or grad_b is not None
        for rows in _row_chunks(student_hidden_NH.shape[0], chunk_size):
            nonzero = row_weights_N[rows] != 0  # rows with weight 0 (diagnostics only) get no gradient work
            chunk_grad = want_grad and bool(nonzero.any())
            hook = None if on_chunk is None else partial(on_chunk, rows)
            values_N[rows], grad_logits = _fused_chunk(
                student_hidden_NH, student_weight_VH, student_bias_V, teacher_hidden_NH, teacher_weight_VH,
                teacher_bias_V, rows, opts, calc_dtype, chunk_grad, workspace, need_values=True, on_chunk=hook)
            if chunk_grad:
                if bool(nonzero.all()):
                    _accumulate_input_grads(grad_logits.mul_(row_weights_N[rows, None]), student_hidden_NH,
                                            student_weight_VH, rows, grad_h, grad_w, grad_b, workspace)
                else:
                    keep = nonzero.nonzero().squeeze(1)
                    _accumulate_input_grads(grad_logits[keep].mul_(row_weights_N[rows][keep, None]), student_hidden_NH,
                                            student_weight_VH, keep + rows.start, grad_h, grad_w, grad_b, workspace)
        ctx.grads = (grad_h, grad_w, grad_b)
        ctx.dtypes = (student_hidden_NH.dtype, student_weight_VH.dtype,
                      None if student_bias_V is None else student_bias_V.dtype)
        ctx.mark_non_differentiable(values_N)
        return (values_N * row_weights_N).sum(), values_N

    @staticmethod
    def backward(ctx, grad_loss, _grad_values):
        # hand the stored gradients over (no second [V, H] copy): scaled in place, cast if needed
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError(
                "fused_linear_weighted_divergence: backward through the same graph twice (retain_graph) is not "
                "supported (its gradients are formed once, in forward)"
            )
        out = []
        for grad, dtype in zip(grads, ctx.dtypes):
            if grad is not None:
                if float(grad_loss) != 1.0:
                    grad.mul_(grad_loss.to(grad.dtype))
                grad = grad.to(dtype)
            out.append(grad)
        return (*out, None, None, None, None, None, None, None, None)


# --------------------------------------------------------------------------- public API
def _check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor; got {getattr(t, 'dtype', type(t))}")


def token_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    beta: float = 0.0,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    topk: int | None = None,
) -> torch.Tensor:
    """Per-position (optionally clipped) beta-divergence on full logits, shape ``logits.shape[:-1]``:
    the readable reference (plain autograd through the per-entry formulas) that the fused kernel
    (:func:`fused_linear_weighted_divergence`) is tested against.

    Differentiable w.r.t. ``student_logits`` only; the teacher is a constant. Returns float32
    (float64 if an input is float64).
    """
    student_NV, teacher_NV, opts, calc_dtype = _logit_inputs(
        student_logits, teacher_logits, beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
        teacher_temperature=teacher_temperature, topk=topk, chunk_size=None)
    return _autograd_values(student_NV, teacher_NV, opts, calc_dtype).reshape(student_logits.shape[:-1])


def _logit_inputs(student_logits, teacher_logits, *, beta, clip_tau, student_temperature, teacher_temperature, topk,
                  chunk_size):
    """Validated [N, V] views of two logit tensors, the options and the compute dtype."""
    _check_float("student_logits", student_logits)
    _check_float("teacher_logits", teacher_logits)
    if student_logits.shape != teacher_logits.shape or student_logits.dim() < 1:
        raise ValueError(
            f"student_logits and teacher_logits must have the same shape [..., V]; got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    vocab = student_logits.shape[-1]
    opts = validate_loss_options(beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
                                 teacher_temperature=teacher_temperature, topk=topk, chunk_size=chunk_size,
                                 vocab_size=vocab)
    calc_dtype = compute_dtype(student_logits, teacher_logits)
    return student_logits.reshape(-1, vocab), teacher_logits.detach().reshape(-1, vocab), opts, calc_dtype


def _check_fused_inputs(student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, student_bias,
                        teacher_bias, *, beta, clip_tau, student_temperature, teacher_temperature, topk, chunk_size):
    """Validate the fused functions' inputs; returns (options, compute dtype)."""
    names = ("student_hidden_NH", "student_weight_VH", "teacher_hidden_NH", "teacher_weight_VH")
    tensors = (student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH)
    for name, t in zip(names, tensors):
        _check_float(name, t)
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D; got shape {tuple(t.shape)}")
    n, h = student_hidden_NH.shape
    vocab = student_weight_VH.shape[0]
    if student_weight_VH.shape[1] != h:
        raise ValueError(f"student_weight_VH must be [V, H={h}]; got {tuple(student_weight_VH.shape)}")
    if teacher_hidden_NH.shape[0] != n:
        raise ValueError(f"teacher_hidden_NH must have N={n} rows; got {tuple(teacher_hidden_NH.shape)}")
    if teacher_weight_VH.shape != (vocab, teacher_hidden_NH.shape[1]):
        raise ValueError(
            f"teacher_weight_VH must be [V={vocab}, H_teacher={teacher_hidden_NH.shape[1]}]; got {tuple(teacher_weight_VH.shape)}"
        )
    for name, bias in (("student_bias", student_bias), ("teacher_bias", teacher_bias)):
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (vocab,)):
            raise ValueError(
                f"{name} must be None or a tensor of shape [V={vocab}]; got {getattr(bias, 'shape', type(bias))}")
    opts = validate_loss_options(beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
                                 teacher_temperature=teacher_temperature, topk=topk, chunk_size=chunk_size,
                                 vocab_size=vocab, unchunked=False)
    calc_dtype = compute_dtype(*tensors)
    return opts, calc_dtype


def fused_linear_weighted_divergence(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    *,
    row_weights_N: torch.Tensor,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    topk: int | None = None,
    chunk_size: int = 1024,
    on_chunk=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_n row_weights_N[n] * d_n, d_N.detach())`` with d_N = ``token_divergence(hs @ Ws.T + bs,
    ht @ Wt.T + bt, ...)``, without materialising [N, V].

    The lm_head matmul runs per row chunk in the input dtype (as the model's lm_head would), the
    divergence in float32 (float64 for float64 inputs). Gradients go to ``student_hidden_NH``,
    ``student_weight_VH`` and ``student_bias``; the teacher side is a constant. The weights are
    known up front (the aggregation of the mini-batch loss), so every gradient is formed in the
    forward pass: the vocabulary is visited once and the lm_head-sized matmuls are 4 (two logits,
    two gradients; a loss that recomputes in backward needs 6). The stored gradients ([N, H], [V, H]) live until backward, which hands them
    over without a copy; a second backward through the same graph raises. Rows of weight 0 cost
    no gradient work (their values are still computed).

    ``on_chunk(rows, logp_s, logp_t)``: called once per row chunk (``rows`` a slice of N) with the
    two log-softmaxes [rows, V] at their temperatures, read-only views of reused buffers: the
    diagnostics of the same vocabulary pass (``signals.weighted_divergence_and_signals``). Needs
    ``topk=None`` (with a top-k support the pass never forms the full-vocabulary distributions).
    """
    opts, calc_dtype = _check_fused_inputs(
        student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, student_bias, teacher_bias,
        beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
        teacher_temperature=teacher_temperature, topk=topk, chunk_size=chunk_size,
    )
    n = student_hidden_NH.shape[0]
    if not isinstance(row_weights_N, torch.Tensor) or row_weights_N.shape != (n,):
        raise ValueError(f"row_weights_N must be a tensor of shape [N={n}]; got {getattr(row_weights_N, 'shape', type(row_weights_N))}")
    if on_chunk is not None and topk is not None:
        raise ValueError("on_chunk needs the full vocabulary: topk must be None")
    return _FusedLinearWeightedDivergence.apply(
        student_hidden_NH, student_weight_VH, student_bias,
        teacher_hidden_NH.detach(), teacher_weight_VH.detach(),
        None if teacher_bias is None else teacher_bias.detach(),
        row_weights_N.detach().to(student_hidden_NH.device), opts, chunk_size, calc_dtype, on_chunk,
    )


# --------------------------------------------------------------------------- aggregation
# verl's names (verl/trainer/ppo/core_algos.py agg_loss); the first is the paper's eq. opd_obj /
# opsd_clipped: 1/N over a rollout's loss positions, then the mean over rollouts.
LOSS_AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")


def aggregation_weights(
    loss_mask_BT: torch.Tensor,
    *,
    mode: str,
    global_tokens: int,
    global_sequences: int,
    horizon: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Weight w_bt of each loss position in the mini-batch loss ``L = sum_bt w_bt d_bt``.

    ``loss_mask_BT`` holds whole rollouts (rows) of one micro-batch; ``global_tokens`` /
    ``global_sequences`` count the loss positions / the rollouts with at least one loss position in
    the WHOLE mini-batch (all micro-batches, all data-parallel ranks). The weights depend only on a
    row's own count and these totals, so summing ``sum_bt w_bt d_bt`` over the micro-batches (and
    ranks) of a mini-batch gives the same loss and gradient however it is split:

    - ``seq-mean-token-mean`` (the paper): ``1 / (n_b S)``, n_b = loss positions of rollout b, S = ``global_sequences``;
    - ``token-mean``: ``1 / T``, T = ``global_tokens`` (every position weighs the same: long rollouts weigh more);
    - ``seq-mean-token-sum``: ``1 / S``;
    - ``seq-mean-token-sum-norm``: ``1 / (S * horizon)`` (verl's default horizon: the padded response length);
    - ``token-sum``: ``1``.

    Zero outside the mask. Rollouts without any loss position (e.g. AdvT rejected every position)
    are not counted in S (as verl's ``agg_loss`` does when it counts the batch itself). Returns
    ``dtype`` [B, T].
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss aggregation mode must be one of {list(LOSS_AGG_MODES)}, got {mode!r}")
    mask_BT = loss_mask_BT.bool()
    counts_B = mask_BT.sum(-1)
    local_tokens, local_sequences = int(counts_B.sum()), int((counts_B > 0).sum())
    if int(global_tokens) < local_tokens or int(global_sequences) < local_sequences:
        raise ValueError(
            f"global_tokens={global_tokens} / global_sequences={global_sequences} are smaller than this micro-batch's "
            f"{local_tokens} loss positions / {local_sequences} rollouts; pass the counts of the whole mini-batch"
        )
    if mode == "seq-mean-token-sum-norm" and (horizon is None or int(horizon) < 1):
        raise ValueError(f"seq-mean-token-sum-norm needs a horizon >= 1, got {horizon!r}")
    tokens, sequences = max(int(global_tokens), 1), max(int(global_sequences), 1)
    if mode == "token-mean":
        row_B = torch.full(counts_B.shape, 1.0 / tokens, dtype=dtype, device=mask_BT.device)
    elif mode == "token-sum":
        row_B = torch.ones(counts_B.shape, dtype=dtype, device=mask_BT.device)
    elif mode == "seq-mean-token-mean":
        row_B = 1.0 / (counts_B.clamp(min=1).to(dtype) * sequences)
    elif mode == "seq-mean-token-sum":
        row_B = torch.full(counts_B.shape, 1.0 / sequences, dtype=dtype, device=mask_BT.device)
    else:
        row_B = torch.full(counts_B.shape, 1.0 / (sequences * int(horizon)), dtype=dtype, device=mask_BT.device)
    return torch.where(mask_BT, row_B[:, None], torch.zeros((), dtype=dtype, device=mask_BT.device))
