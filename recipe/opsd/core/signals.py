"""Token-level OPSD signals and their summaries (pure torch, no grad, chunked, nothing larger than [chunk, V]).

The quantities of the paper's token-level analysis and the training-log diagnostics the clipped loss hides
(docs/core_math.md, "Token signals"; each key's definition: :func:`token_signals`), per-entry formulas
from :mod:`recipe.opsd.core.losses`; :func:`weighted_divergence_and_signals` gets them from the loss's own
vocabulary pass; :func:`summarize_signals` names the means like the paper's table columns.

Example::

    signals = token_signals_from_hidden(student_h_NH, head_VH, teacher_h_NH, head_VH, response_ids_N, clip_tau=0.05)
    print(summarize_signals(signals))   # fwd_kl, d_gt_005 (%), abs_adv, agree (%), enc (%), disc (%), ...
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F

from recipe.opsd.core.losses import compute_dtype, entropy, forward_kl_terms, log_probs, validate_loss_options

__all__ = [
    "SIGNAL_KEYS",
    "DEFAULT_WINDOWS",
    "token_signals",
    "token_signals_from_hidden",
    "weighted_divergence_and_signals",
    "student_entropy_from_hidden",
    "summarize_signals",
    "position_windows",
    "entropy_tail_shares",
    "divergence_mass_by_token",
    "divergence_mass_by_token_from_hidden",
    "sampled_token_rank_from_hidden",
    "TOP_PUSH_KEYS",
    "top_push_summary",
]

SIGNAL_KEYS = (
    "fwd_kl", "student_entropy", "teacher_entropy", "top1_agree", "adv", "teacher_rank",
    "student_logp", "teacher_logp", "clip_frac", "clipped_teacher_mass",
)
TOP_PUSH_KEYS = ("top_push", "top_push_unclipped", "decisive")
DEFAULT_WINDOWS = ((0, 128), (128, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 6144))
# threshold of the paper's "D > .05" column: it thresholds the summed unclipped forward KL
# and is distinct from the training-time per-entry cap clip_tau
HIGH_KL_THRESHOLD = 0.05


# --------------------------------------------------------------------------- chunk sources
def _options(student_temperature, teacher_temperature, clip_tau, chunk_size, vocab):
    return validate_loss_options(beta=0.0, clip_tau=clip_tau, student_temperature=student_temperature,
                                 teacher_temperature=teacher_temperature, topk=None, chunk_size=chunk_size,
                                 vocab_size=vocab, unchunked=False)


def _logit_chunks(student_NV, teacher_NV, chunk_size) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    if student_NV.dim() != 2 or student_NV.shape != teacher_NV.shape:
        raise ValueError(f"student_logits_NV and teacher_logits_NV must both be [N, V]; got "
                         f"{tuple(student_NV.shape)} and {tuple(teacher_NV.shape)}")
    n = student_NV.shape[0]
    for start in range(0, n, chunk_size):
        rows = slice(start, min(start + chunk_size, n))
        yield rows, student_NV[rows], teacher_NV[rows]


def _hidden_chunks(student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, student_bias_V,
                   teacher_bias_V, chunk_size):
    if (student_hidden_NH.dim() != 2 or teacher_hidden_NH.dim() != 2
            or student_hidden_NH.shape[0] != teacher_hidden_NH.shape[0]):
        raise ValueError(f"student_hidden_NH and teacher_hidden_NH must be [N, H] with the same N; got "
                         f"{tuple(student_hidden_NH.shape)} and {tuple(teacher_hidden_NH.shape)}")
    if student_weight_VH.shape[0] != teacher_weight_VH.shape[0]:
        raise ValueError(f"student_weight_VH and teacher_weight_VH must have the same V; got "
                         f"{tuple(student_weight_VH.shape)} and {tuple(teacher_weight_VH.shape)}")
    n = student_hidden_NH.shape[0]
    for start in range(0, n, chunk_size):
        rows = slice(start, min(start + chunk_size, n))
        yield (rows, F.linear(student_hidden_NH[rows], student_weight_VH, student_bias_V),
               F.linear(teacher_hidden_NH[rows], teacher_weight_VH, teacher_bias_V))


def _check_ids(sampled_ids_N, n, vocab):
    if not isinstance(sampled_ids_N, torch.Tensor) or sampled_ids_N.shape != (n,) or sampled_ids_N.is_floating_point():
        raise ValueError(f"sampled_ids_N must be an integer tensor of shape [{n}]; got {getattr(sampled_ids_N, 'shape', type(sampled_ids_N))}")
    if n and (int(sampled_ids_N.min()) < 0 or int(sampled_ids_N.max()) >= vocab):
        raise ValueError(f"sampled_ids_N has ids outside [0, V={vocab})")


def _empty_signals(n, calc_dtype, device) -> dict[str, torch.Tensor]:
    return {k: torch.zeros(n, dtype=calc_dtype, device=device) for k in SIGNAL_KEYS}


@torch.no_grad()
def _chunk_signals(out, rows, logp_s, logp_t, sampled_ids_N, clip_tau) -> None:
    """Fill ``out[key][rows]`` from one chunk's log-softmaxes [rows, V] (read only)."""
    calc_dtype, vocab = out["fwd_kl"].dtype, logp_s.shape[-1]
    sampled = sampled_ids_N[rows].long()[:, None]
    student_logp, teacher_logp = logp_s.gather(1, sampled)[:, 0], logp_t.gather(1, sampled)[:, 0]
    out["student_logp"][rows], out["teacher_logp"][rows] = student_logp, teacher_logp
    out["adv"][rows] = teacher_logp - student_logp
    out["teacher_rank"][rows] = (logp_t > teacher_logp[:, None]).sum(1).to(calc_dtype)
    out["top1_agree"][rows] = (logp_s.argmax(1) == logp_t.argmax(1)).to(calc_dtype)
    out["student_entropy"][rows] = entropy(logp_s)
    out["teacher_entropy"][rows] = entropy(logp_t)
    terms = forward_kl_terms(logp_t, logp_s)
    out["fwd_kl"][rows] = terms.sum(1)
    if clip_tau is not None:
        clipped = terms > clip_tau
        del terms
        out["clip_frac"][rows] = clipped.sum(1).to(calc_dtype) / vocab
        out["clipped_teacher_mass"][rows] = logp_t.exp().mul_(clipped).sum(1)


@torch.no_grad()
def _chunk_top_push(out, rows, logp_s, logp_t, clip_tau, student_temperature) -> None:
    """Fill the :data:`TOP_PUSH_KEYS` of ``rows``: where a descent step on the forward-KL loss moves the
    teacher's top token j* = argmax pT.

    With the kept entries K = {v: d_v <= clip_tau} (every entry without a clip) and M = sum_{v in K} pT(v), the
    step on the raw student logits is Delta s_v = (pT(v) [v in K] - pS(v) M) / T_s (the loss's own gradient),
    so to first order ``top_push`` = d log pS(j*) = (pT(j*) [j* in K] - pS(j*) M - sum_{v in K} pS(v) pT(v)
    + M sum_v pS(v)^2) / T_s^2; ``top_push_unclipped`` the same with K = everything; ``decisive`` = 1 where
    j* != argmax pS (the teacher would change the student's choice).
    """
    p_s, p_t = logp_s.exp(), logp_t.exp()
    top = logp_t.argmax(1, keepdim=True)
    p_s_top, p_t_top = p_s.gather(1, top)[:, 0], p_t.gather(1, top)[:, 0]
    squares = p_s.square().sum(1)
    overlap = (p_s * p_t).sum(1)
    scale = 1.0 / student_temperature ** 2
    out["top_push_unclipped"][rows] = (p_t_top - p_s_top - overlap + squares) * scale
    if clip_tau is None:
        out["top_push"][rows] = out["top_push_unclipped"][rows]
    else:
        kept = forward_kl_terms(logp_t, logp_s) <= clip_tau
        kept_t = p_t * kept
        mass = kept_t.sum(1)
        out["top_push"][rows] = (kept_t.gather(1, top)[:, 0] - p_s_top * mass - (p_s * kept_t).sum(1) + mass * squares) * scale
    out["decisive"][rows] = (top[:, 0] != logp_s.argmax(1)).to(out["decisive"].dtype)


@torch.no_grad()
def _signals(chunks, sampled_ids_N, n, vocab, opts, calc_dtype, device, top_push=False) -> dict[str, torch.Tensor]:
    _check_ids(sampled_ids_N, n, vocab)
    out = _empty_signals(n, calc_dtype, device)
    if top_push:
        out.update({k: torch.zeros(n, dtype=calc_dtype, device=device) for k in TOP_PUSH_KEYS})
    for rows, student_logits, teacher_logits in chunks:
        logp_s = log_probs(student_logits, temperature=opts.student_temperature, dtype=calc_dtype)
        logp_t = log_probs(teacher_logits, temperature=opts.teacher_temperature, dtype=calc_dtype)
        del student_logits, teacher_logits
        _chunk_signals(out, rows, logp_s, logp_t, sampled_ids_N, opts.clip_tau)
        if top_push:
            _chunk_top_push(out, rows, logp_s, logp_t, opts.clip_tau, opts.student_temperature)
    return out


def token_signals(
    student_logits_NV: torch.Tensor,
    teacher_logits_NV: torch.Tensor,
    sampled_ids_N: torch.Tensor,
    *,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    clip_tau: float | None = 0.05,
    chunk_size: int = 1024,
    top_push: bool = False,
) -> dict[str, torch.Tensor]:
    """Per-position signals (keys :data:`SIGNAL_KEYS`, with ``top_push`` also :data:`TOP_PUSH_KEYS`; each a
    float tensor [N]) from logits. For position i with sampled token y_i (pS, pT at their temperatures):

    - ``fwd_kl``: the unclipped forward KL sum_v d_{i,v}, d_{i,v} = pT(v) [log pT(v) - log pS(v)] (the term
      capped in eq:opsd_clipped; the beta=0 endpoint of eq:generalized_jsd);
    - ``adv``: the sampled-token log advantage a_i = log pT(y_i) - log pS(y_i);
    - ``teacher_rank``: the rank of y_i under the teacher (0 = argmax; ties share the best rank);
    - ``clip_frac`` / ``clipped_teacher_mass``: the fraction of vocabulary entries with d_{i,v} > clip_tau
      and the teacher mass on them (0 when ``clip_tau`` is None);
    - ``student_entropy``, ``teacher_entropy``, ``top1_agree``, ``student_logp``, ``teacher_logp``;
    - with ``top_push=True`` (the analysis path only): ``top_push``, ``top_push_unclipped``, ``decisive``
      (``_chunk_top_push``); :func:`top_push_summary` gives the share of decisive positions at which the
      clip turns a rise of pS(j*) into a fall (docs/core_math.md: the clip lowers the logit of the entries
      it caps).
    """
    opts = _options(student_temperature, teacher_temperature, clip_tau, chunk_size, student_logits_NV.shape[-1])
    chunks = _logit_chunks(student_logits_NV.detach(), teacher_logits_NV.detach(), chunk_size)
    n, vocab = student_logits_NV.shape[0], student_logits_NV.shape[-1]
    return _signals(chunks, sampled_ids_N, n, vocab, opts, compute_dtype(student_logits_NV, teacher_logits_NV),
                    student_logits_NV.device, top_push=top_push)


def token_signals_from_hidden(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    sampled_ids_N: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    clip_tau: float | None = 0.05,
    chunk_size: int = 1024,
    top_push: bool = False,
) -> dict[str, torch.Tensor]:
    """:func:`token_signals` from final hidden states and lm_head weights (matmul per chunk)."""
    vocab = student_weight_VH.shape[0]
    opts = _options(student_temperature, teacher_temperature, clip_tau, chunk_size, vocab)
    parts = [t.detach() if t is not None else None for t in
             (student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, student_bias, teacher_bias)]
    chunks = _hidden_chunks(*parts, chunk_size)
    calc_dtype = compute_dtype(student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH)
    return _signals(chunks, sampled_ids_N, student_hidden_NH.shape[0], vocab, opts, calc_dtype,
                    student_hidden_NH.device, top_push=top_push)


# --------------------------------------------------------------------------- loss + signals in one pass
def weighted_divergence_and_signals(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    sampled_ids_N: torch.Tensor,
    *,
    row_weights_N: torch.Tensor,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_tau: float | None = 0.05,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``losses.fused_linear_weighted_divergence`` (full vocabulary) and :func:`token_signals_from_hidden`
    of every row from the SAME vocabulary pass: ``(loss, d_N, signals)``.

    The divergence's two log-softmaxes of each row chunk are handed to the signal formulas before
    the gradient is formed, so the diagnostics cost no second lm_head projection. Values equal
    :func:`token_signals` on the logits (float64: to rounding). ``clip_tau`` is both the loss's cap
    and the signals' clip threshold (as in the trainer); the signals are always the forward-KL
    diagnostics, whatever ``beta``. Rows with weight 0 get signals and values, no gradient work.
    """
    from recipe.opsd.core.losses import fused_linear_weighted_divergence

    n, vocab = student_hidden_NH.shape[0], student_weight_VH.shape[0]
    _check_ids(sampled_ids_N, n, vocab)
    calc_dtype = compute_dtype(student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH)
    out = _empty_signals(n, calc_dtype, student_hidden_NH.device)
    ids_N = sampled_ids_N.to(student_hidden_NH.device)

    def on_chunk(rows, logp_s, logp_t):
        _chunk_signals(out, rows, logp_s, logp_t, ids_N, clip_tau)

    loss, values_N = fused_linear_weighted_divergence(
        student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH,
        row_weights_N=row_weights_N, student_bias=student_bias, teacher_bias=teacher_bias, beta=beta,
        clip_tau=clip_tau, student_temperature=student_temperature, teacher_temperature=teacher_temperature,
        chunk_size=chunk_size, on_chunk=on_chunk,
    )
    return loss, values_N, out


@torch.no_grad()
def student_entropy_from_hidden(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Entropy [N] of softmax((h @ W.T + b) / temperature), chunked (the ``student_entropy`` signal
    alone: one projection, for entropy-ranked loss positions before the loss pass)."""
    opts = _options(temperature, None, None, chunk_size, weight_VH.shape[0])
    calc_dtype = compute_dtype(hidden_NH, weight_VH)
    out_N = torch.zeros(hidden_NH.shape[0], dtype=calc_dtype, device=hidden_NH.device)
    for start in range(0, hidden_NH.shape[0], chunk_size):
        rows = slice(start, min(start + chunk_size, hidden_NH.shape[0]))
        logits = F.linear(hidden_NH[rows].detach(), weight_VH.detach(), None if bias is None else bias.detach())
        out_N[rows] = entropy(log_probs(logits, temperature=opts.student_temperature, dtype=calc_dtype))
    return out_N


# --------------------------------------------------------------------------- teacher rank
@torch.no_grad()
def sampled_token_rank_from_hidden(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    sampled_ids_N: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Rank of each sampled token under the logits ``hidden_NH @ weight_VH.T (+ bias)``, int64 [N].

    Rank 0 = argmax; ties share the best rank (the number of strictly larger logits), as the
    ``teacher_rank`` signal. Temperature does not change a rank, so none is taken. The logits
    are formed in float32 (float64 inputs: float64), one [chunk_size, V] block at a time. This
    is what ``positions.teacher_topk`` (AdvT-K) needs from the frozen teacher.
    """
    if hidden_NH.dim() != 2 or weight_VH.dim() != 2 or hidden_NH.shape[1] != weight_VH.shape[1]:
        raise ValueError(f"hidden_NH [N, H] and weight_VH [V, H] must share H; got {tuple(hidden_NH.shape)} and "
                         f"{tuple(weight_VH.shape)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1; got {chunk_size!r}")
    n, vocab = hidden_NH.shape[0], weight_VH.shape[0]
    _check_ids(sampled_ids_N, n, vocab)
    calc_dtype = compute_dtype(hidden_NH, weight_VH)
    weight = weight_VH.detach().to(calc_dtype)
    bias = None if bias is None else bias.detach().to(calc_dtype)
    rank_N = torch.zeros(n, dtype=torch.int64, device=hidden_NH.device)
    for start in range(0, n, chunk_size):
        rows = slice(start, min(start + chunk_size, n))
        logits = F.linear(hidden_NH[rows].detach().to(calc_dtype), weight, bias)
        picked = logits.gather(1, sampled_ids_N[rows].long()[:, None])
        rank_N[rows] = (logits > picked).sum(1)
    return rank_N


# --------------------------------------------------------------------------- divergence mass
@torch.no_grad()
def _mass(chunks, vocab, opts, calc_dtype, device, mass_V):
    if mass_V is None:
        mass_V = torch.zeros(vocab, dtype=torch.float64, device=device)
    elif mass_V.shape != (vocab,):
        raise ValueError(f"mass_V must have shape [V={vocab}]; got {tuple(mass_V.shape)}")
    for _, student_logits, teacher_logits in chunks:
        logp_s = log_probs(student_logits, temperature=opts.student_temperature, dtype=calc_dtype)
        logp_t = log_probs(teacher_logits, temperature=opts.teacher_temperature, dtype=calc_dtype)
        mass_V += forward_kl_terms(logp_t, logp_s).sum(0).to(mass_V.dtype)
    return mass_V


def divergence_mass_by_token(
    student_logits_NV: torch.Tensor,
    teacher_logits_NV: torch.Tensor,
    *,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    chunk_size: int = 1024,
    mass_V: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_i d_{i,v} (unclipped forward-KL contribution of vocabulary id v) as a float64 [V].

    Pass the previous result as ``mass_V`` to accumulate over batches (added in place).
    """
    vocab = student_logits_NV.shape[-1]
    opts = _options(student_temperature, teacher_temperature, None, chunk_size, vocab)
    chunks = _logit_chunks(student_logits_NV.detach(), teacher_logits_NV.detach(), chunk_size)
    return _mass(chunks, vocab, opts, compute_dtype(student_logits_NV, teacher_logits_NV), student_logits_NV.device, mass_V)


def divergence_mass_by_token_from_hidden(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    chunk_size: int = 1024,
    mass_V: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`divergence_mass_by_token` from hidden states and lm_head weights."""
    vocab = student_weight_VH.shape[0]
    opts = _options(student_temperature, teacher_temperature, None, chunk_size, vocab)
    parts = [t.detach() if t is not None else None for t in
             (student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, student_bias, teacher_bias)]
    calc_dtype = compute_dtype(student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH)
    return _mass(_hidden_chunks(*parts, chunk_size), vocab, opts, calc_dtype, student_hidden_NH.device, mass_V)


# --------------------------------------------------------------------------- summaries
def _mean(x: torch.Tensor) -> float:
    return float(x.double().mean()) if x.numel() else math.nan


def _pct(x: torch.Tensor) -> float:
    return 100.0 * float(x.double().mean()) if x.numel() else math.nan


def entropy_tail_shares(fwd_kl_N: torch.Tensor, abs_adv_N: torch.Tensor, entropy_N: torch.Tensor, *, fraction: float = 0.2) -> dict[str, float]:
    """Shares (%) of total forward KL and of total |adv| carried by the highest-entropy
    ``fraction`` of positions, pooled over all given positions (the paper's HE20 KL /
    HE20 |adv.|: "each total computed from the same entropy-analysis rollout pool").

    Keeps ceil(fraction x N) positions; ties broken by index. Keys: ``kl_share``,
    ``abs_adv_share`` (NaN when a total is 0 or there are no positions).
    """
    if not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be a number in (0, 1]; got {fraction!r}")
    if not (fwd_kl_N.shape == abs_adv_N.shape == entropy_N.shape) or fwd_kl_N.dim() != 1:
        raise ValueError(f"fwd_kl_N, abs_adv_N, entropy_N must be 1-D of the same length; got "
                         f"{tuple(fwd_kl_N.shape)}, {tuple(abs_adv_N.shape)}, {tuple(entropy_N.shape)}")
    n = fwd_kl_N.numel()
    keep = math.ceil(n * fraction - 1e-9)
    top = torch.sort(entropy_N.double(), descending=True, stable=True).indices[:keep]

    def share(x):
        total = float(x.double().sum())
        return 100.0 * float(x.double()[top].sum()) / total if n and total != 0 else math.nan

    return {"kl_share": share(fwd_kl_N), "abs_adv_share": share(abs_adv_N.abs())}


def position_windows(values_N: torch.Tensor, positions_N: torch.Tensor, *, windows=DEFAULT_WINDOWS) -> list[dict]:
    """Per response-position window [lo, hi): ``mean``, token-level ``std`` (population),
    ``snr`` = mean / std (the paper's SNR = mu / sigma), and ``count``.

    ``positions_N`` is each value's 0-based index within its response. Empty windows (and
    std = 0) give NaN. Pool all rollouts of an analysis before calling.
    """
    if values_N.shape != positions_N.shape or values_N.dim() != 1:
        raise ValueError(f"values_N and positions_N must be 1-D of the same length; got {tuple(values_N.shape)} and {tuple(positions_N.shape)}")
    out = []
    for lo, hi in windows:
        if not lo < hi:
            raise ValueError(f"windows must be (lo, hi) with lo < hi; got {(lo, hi)}")
        x = values_N.double()[(positions_N >= lo) & (positions_N < hi)]
        mean = float(x.mean()) if x.numel() else math.nan
        std = float(x.std(correction=0)) if x.numel() else math.nan
        out.append({"lo": lo, "hi": hi, "mean": mean, "std": std,
                    "snr": mean / std if x.numel() and std > 0 else math.nan, "count": int(x.numel())})
    return out


def summarize_signals(signals: dict[str, torch.Tensor], *, positions_N: torch.Tensor | None = None) -> dict[str, float]:
    """Means over positions, named like the paper's table columns.

    Keys: ``fwd_kl`` (mean unclipped forward KL), ``d_gt_005`` (% of positions with
    fwd_kl > 0.05), ``abs_adv`` (mean |a_i|), ``adv`` (mean a_i), ``agree`` (% top-1
    agreement), ``enc`` / ``disc`` (% positions with a_i > 0 / a_i < 0; ties are neither),
    ``student_entropy``, ``teacher_entropy``, ``clip_frac`` (mean fraction of vocabulary
    entries clipped), ``clipped_teacher_mass``, ``teacher_rank`` (mean), ``he20_kl`` /
    ``he20_abs_adv`` (% shares of the highest-entropy 20%), ``n_positions``. With
    ``positions_N`` (response-position index of each row) it adds
    ``fwd_kl_w{lo}_{hi}_mean`` / ``_snr`` for the default windows. Means are NaN when
    there are no positions.
    """
    missing = [k for k in SIGNAL_KEYS if k not in signals]
    if missing:
        raise ValueError(f"signals is missing keys {missing}; pass the dict returned by token_signals")
    s = {k: signals[k].detach().reshape(-1) for k in SIGNAL_KEYS}
    adv = s["adv"]
    out = {
        "fwd_kl": _mean(s["fwd_kl"]),
        "d_gt_005": _pct(s["fwd_kl"] > HIGH_KL_THRESHOLD),
        "abs_adv": _mean(adv.abs()),
        "adv": _mean(adv),
        "agree": _pct(s["top1_agree"]),
        "enc": _pct(adv > 0),
        "disc": _pct(adv < 0),
        "student_entropy": _mean(s["student_entropy"]),
        "teacher_entropy": _mean(s["teacher_entropy"]),
        "clip_frac": _mean(s["clip_frac"]),
        "clipped_teacher_mass": _mean(s["clipped_teacher_mass"]),
        "teacher_rank": _mean(s["teacher_rank"]),
        "n_positions": float(adv.numel()),
    }
    tails = entropy_tail_shares(s["fwd_kl"], adv.abs(), s["student_entropy"], fraction=0.2)
    out["he20_kl"], out["he20_abs_adv"] = tails["kl_share"], tails["abs_adv_share"]
    if positions_N is not None:
        for w in position_windows(s["fwd_kl"], positions_N.reshape(-1), windows=DEFAULT_WINDOWS):
            out[f"fwd_kl_w{w['lo']}_{w['hi']}_mean"] = w["mean"]
            out[f"fwd_kl_w{w['lo']}_{w['hi']}_snr"] = w["snr"]
    return out


def top_push_summary(signals: dict[str, torch.Tensor]) -> dict[str, float]:
    """``decisive``: % of positions where the teacher's top token is not the student's; ``clip_reversal``: % of
    the decisive positions whose unclipped step raises pS(j*) at which the clipped step lowers it (0 without a
    clip; NaN without such positions). ``signals``: a dict with :data:`TOP_PUSH_KEYS` (``top_push=True``)."""
    missing = [k for k in TOP_PUSH_KEYS if k not in signals]
    if missing:
        raise ValueError(f"signals is missing keys {missing}; compute them with top_push=True")
    decisive = signals["decisive"].reshape(-1) > 0
    rising = decisive & (signals["top_push_unclipped"].reshape(-1) > 0)
    return {"decisive": _pct(decisive), "clip_reversal": _pct(signals["top_push"].reshape(-1)[rising] < 0)}
