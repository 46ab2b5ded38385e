r"""Follow-up OPSD variants the paper replicates (appendix "Replications of Recent OPSD Variants").

Pure torch, row-wise, no verl/ray import. Every divergence term comes from
``recipe.opsd.losses`` (one copy of every formula); this module only builds the targets and
the credit assignment. Selected by ``opsd.loss.variant: opsd | purified | beta_opsd``; the
parameters live in ``opsd.loss.variant_params`` (validated by :func:`variant_params`; set by the
experiment presets ``purified_answer`` / ``purified_solution`` / ``beta_opsd``).

Purified OPSD (Shen et al., "Purified OPSD: On-Policy Self-Distillation Without Losing How to
Think", arXiv:2607.02234). The privileged teacher pT = pi_0(. | Q, C, y_<i) is decomposed with
a *reference-only teacher* pR = pi_0(. | C, y_<i) (the same frozen model conditioned on the
reference alone, without the question). Per vocabulary entry v:

    Delta_v   = log pT_v - log pR_v                      (PMI of the question and v given C)
    Delta~_v  = c * tanh(Delta_v / c)                    (soft clip, c = pmi_clip = 10)
    log q_v   = log pT_v + lambda * Delta~_v - logsumexp_u(log pT_u + lambda * Delta~_u)
    loss_i    = sum_v d_v(pS, q)  with the beta = 0.5 (symmetric JSD) terms of losses.entry_terms

with PMI strength lambda = 1 (the paper's setting). Interpretation (the method text and code
were not retrievable; the paper gives "symmetric JSD, PMI strength 1, and PMI soft-clip
threshold 10"): Delta is the log-ratio of the two teachers; the soft clip is the tanh form
(smooth, odd, slope 1 at 0, saturating at +-c); the strength multiplies Delta~ (a brief we
worked from wrote ``exp(Delta / strength)``: identical at the only value the paper uses, 1).

beta-OPSD (the paper's \citep{beta_opsd}): "its teacher weight increases from 0.5 to 0.8, its
reference is the stop-gradient current student, and its return-to-go discount is 0.99".
Interpretation (no public method text or code found): the target is the probability-space
mixture q = w pT + (1 - w) sg(pS) with the teacher weight w scheduled linearly over training
(:func:`teacher_weight_schedule`); the per-token reward on the sampled token y_t is
r_t = log q_t(y_t) - log pS_t(y_t) = log(w pT(y_t)/pS(y_t) + 1 - w) (bounded below by
log(1 - w)); the sequence-level reverse KL KL(pS(y) || q(y)) has the score-function gradient
-sum_t G_t grad log pS(y_t) with the return-to-go G_t = sum_{k >= t} gamma^(k - t) r_k, which is
the "return-to-go credit assignment" (gamma = 0.99 discounts later tokens, as in
tinker-cookbook's ``kl_discount_factor``). The per-position surrogate is -sg(G_t) log pS(y_t).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from recipe.opsd.losses import entry_terms, log_probs

__all__ = [
    "PurifiedParams",
    "BetaOPSDParams",
    "variant_params",
    "soft_clip",
    "purified_target_log_probs",
    "purified_token_loss",
    "teacher_weight_schedule",
    "discounted_returns",
    "BetaOPSDOutput",
    "beta_opsd_token_loss",
    "beta_opsd_sampled_loss",
    "purified_token_loss_from_hidden",
    "sampled_token_log_probs_from_hidden",
]


def _dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match; got {shapes}")


# --------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class PurifiedParams:
    """``opsd.loss.variant_params`` of ``variant: purified``.

    pmi_strength: lambda in q ~ pT exp(lambda soft_clip(Delta)) (paper: 1).
    pmi_clip: soft-clip threshold c of Delta (paper: 10).
    The reference-only teacher pR sees the privileged field of ``opsd.teacher_context`` without
    the question (the trainer renders that prompt).
    """

    pmi_strength: float = 1.0
    pmi_clip: float = 10.0

    def __post_init__(self):
        _positive("opsd.loss.variant_params.pmi_strength", self.pmi_strength)
        _positive("opsd.loss.variant_params.pmi_clip", self.pmi_clip)


@dataclass(frozen=True)
class BetaOPSDParams:
    """``opsd.loss.variant_params`` of ``variant: beta_opsd``.

    teacher_weight_start / teacher_weight_end: w of q = w pT + (1 - w) sg(pS), linear over the
        run's optimizer steps (paper: 0.5 -> 0.8).
    discount: return-to-go discount gamma (paper: 0.99).
    """

    teacher_weight_start: float = 0.5
    teacher_weight_end: float = 0.8
    discount: float = 0.99

    def __post_init__(self):
        for name in ("teacher_weight_start", "teacher_weight_end"):
            w = getattr(self, name)
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 < w <= 1.0:
                raise ValueError(f"opsd.loss.variant_params.{name} must be in (0, 1]; got {w!r}")
        d = self.discount
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= d <= 1.0:
            raise ValueError(f"opsd.loss.variant_params.discount must be in [0, 1]; got {d!r}")


_PARAMS = {"opsd": None, "purified": PurifiedParams, "beta_opsd": BetaOPSDParams}


def variant_params(variant: str, params: Mapping[str, Any] | None) -> PurifiedParams | BetaOPSDParams | None:
    """Validated parameters of ``variant`` (None for plain ``opsd``, which takes none)."""
    if variant not in _PARAMS:
        raise ValueError(f"opsd.loss.variant must be one of {sorted(_PARAMS)}; got {variant!r}")
    params = dict(params or {})
    cls = _PARAMS[variant]
    if cls is None:
        if params:
            raise ValueError(f"opsd.loss.variant_params must be empty for variant 'opsd'; got {sorted(params)}")
        return None
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"unknown opsd.loss.variant_params {unknown} for variant {variant!r}; allowed: {sorted(allowed)}")
    return cls(**params)


# --------------------------------------------------------------------------- Purified OPSD
def soft_clip(x: torch.Tensor, *, threshold: float) -> torch.Tensor:
    """``threshold * tanh(x / threshold)``: ~x for |x| << threshold, saturates at +-threshold."""
    c = _positive("threshold", threshold)
    return c * torch.tanh(x / c)


def purified_target_log_probs(
    teacher_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    *,
    teacher_temperature: float = 1.0,
    pmi_strength: float = 1.0,
    pmi_clip: float = 10.0,
) -> torch.Tensor:
    """log q of the PMI-corrected target, q_v proportional to pT_v exp(lambda soft_clip(log pT_v - log pR_v)).

    ``teacher_logits``: the privileged teacher (question + reference); ``reference_logits``:
    the same frozen model on the reference alone. Both are divided by ``teacher_temperature``.
    No gradient (the target is a constant). Returns ``[..., V]`` in float32 (float64 inputs: float64).
    """
    _same_shape(teacher_logits=teacher_logits, reference_logits=reference_logits)
    lam = _positive("pmi_strength", pmi_strength)
    tau = _positive("teacher_temperature", teacher_temperature)
    cdt = _dtype(teacher_logits, reference_logits)
    with torch.no_grad():
        logp_t = log_probs(teacher_logits.detach(), temperature=tau, dtype=cdt)
        logp_r = log_probs(reference_logits.detach(), temperature=tau, dtype=cdt)
        scores = logp_t + lam * soft_clip(logp_t - logp_r, threshold=pmi_clip)
        return scores - torch.logsumexp(scores, dim=-1, keepdim=True)


def purified_token_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    *,
    beta: float = 0.5,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    pmi_strength: float = 1.0,
    pmi_clip: float = 10.0,
) -> torch.Tensor:
    """Per-position divergence between the student and the PMI target, shape ``logits.shape[:-1]``.

    ``beta`` selects the divergence of ``losses.entry_terms`` against q (0.5 = symmetric JSD,
    the Purified OPSD setting); ``clip_tau`` caps each vocabulary entry before the sum as in
    OPSD (None = off, the Purified OPSD setting). Gradient flows to ``student_logits`` only.
    Row-wise: callers may split rows into chunks (e.g. under ``torch.utils.checkpoint``).
    """
    _same_shape(student_logits=student_logits, teacher_logits=teacher_logits, reference_logits=reference_logits)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be a number in [0, 1]; got {beta!r}")
    if clip_tau is not None:
        _positive("clip_tau", clip_tau)
    tau_s = _positive("student_temperature", student_temperature)
    tau_t = tau_s if teacher_temperature is None else _positive("teacher_temperature", teacher_temperature)
    cdt = _dtype(student_logits, teacher_logits, reference_logits)
    logq = purified_target_log_probs(
        teacher_logits, reference_logits, teacher_temperature=tau_t, pmi_strength=pmi_strength, pmi_clip=pmi_clip
    ).to(cdt)
    logp_s = log_probs(student_logits, temperature=tau_s, dtype=cdt)
    terms = entry_terms(logp_s, logq, beta=float(beta))
    if clip_tau is not None:
        terms = terms.clamp(max=float(clip_tau))
    return terms.sum(-1)


# --------------------------------------------------------------------------- beta-OPSD
def teacher_weight_schedule(step: int, *, total_steps: int, start: float = 0.5, end: float = 0.8) -> float:
    """Teacher weight w at optimizer step ``step`` (0-based): linear from ``start`` (step 0) to ``end`` (last step)."""
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be an int >= 1; got {total_steps!r}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < total_steps:
        raise ValueError(f"step must be an int in [0, total_steps={total_steps}); got {step!r}")
    for name, w in (("start", start), ("end", end)):
        if not 0.0 < float(w) <= 1.0:
            raise ValueError(f"teacher weight {name} must be in (0, 1]; got {w!r}")
    frac = step / (total_steps - 1) if total_steps > 1 else 1.0
    return float(start) + (float(end) - float(start)) * frac


def discounted_returns(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, *, discount: float) -> torch.Tensor:
    """Return-to-go G_t = sum_{k >= t, mask_k} discount^(#valid steps from t to k) r_k, 0 where masked.

    Masked positions carry no reward and do not advance the discount (so left/right padding and
    holes in the response mask are skipped, not counted as steps).
    """
    _same_shape(rewards_BT=rewards_BT, mask_BT=mask_BT)
    if rewards_BT.dim() != 2:
        raise ValueError(f"rewards_BT must be [B, T]; got shape {tuple(rewards_BT.shape)}")
    if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be a number in [0, 1]; got {discount!r}")
    keep = mask_BT.bool()
    rewards = torch.where(keep, rewards_BT, torch.zeros((), dtype=rewards_BT.dtype, device=rewards_BT.device))
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = torch.where(keep[:, t], rewards[:, t] + discount * running, running)
        returns[:, t] = torch.where(keep[:, t], running, torch.zeros_like(running))
    return returns


class BetaOPSDOutput(NamedTuple):
    """``loss_BT``: surrogate -sg(G_t) log pS(y_t) (0 where masked; its gradient is the estimator);
    ``reward_BT``: r_t = log q(y_t) - log pS(y_t); ``return_BT``: G_t (both no-grad, 0 where masked)."""

    loss_BT: torch.Tensor
    reward_BT: torch.Tensor
    return_BT: torch.Tensor


def beta_opsd_token_loss(
    student_logits_BTV: torch.Tensor,
    teacher_logits_BTV: torch.Tensor,
    sampled_ids_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    *,
    teacher_weight: float,
    discount: float = 0.99,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
) -> BetaOPSDOutput:
    """beta-OPSD per-position surrogate with return-to-go credit assignment (see module docstring).

    Target q = w pT + (1 - w) sg(pS) (reference = stop-gradient current student);
    reward r_t = log q(y_t) - log pS(y_t); loss_t = -sg(G_t) log pS(y_t). Aggregate ``loss_BT``
    with ``losses.masked_token_mean`` / ``global_token_sum_mean`` over the response mask.
    """
    if student_logits_BTV.dim() != 3:
        raise ValueError(f"student_logits_BTV must be [B, T, V]; got shape {tuple(student_logits_BTV.shape)}")
    _same_shape(student_logits_BTV=student_logits_BTV, teacher_logits_BTV=teacher_logits_BTV)
    _same_shape(sampled_ids_BT=sampled_ids_BT, response_mask_BT=response_mask_BT,
                logits_BT=student_logits_BTV[..., 0])
    if isinstance(teacher_weight, bool) or not isinstance(teacher_weight, (int, float)) or not 0.0 < teacher_weight <= 1.0:
        raise ValueError(f"teacher_weight must be a number in (0, 1]; got {teacher_weight!r}")
    vocab = student_logits_BTV.shape[-1]
    ids = sampled_ids_BT.long()
    keep = response_mask_BT.bool()
    if bool(((ids < 0) | (ids >= vocab))[keep].any()):
        raise ValueError(f"sampled_ids_BT has ids outside [0, V={vocab}) at response positions")
    ids = torch.where(keep, ids, torch.zeros_like(ids))
    tau_s = _positive("student_temperature", student_temperature)
    tau_t = tau_s if teacher_temperature is None else _positive("teacher_temperature", teacher_temperature)
    cdt = _dtype(student_logits_BTV, teacher_logits_BTV)
    logp_s_y = log_probs(student_logits_BTV, temperature=tau_s, dtype=cdt).gather(-1, ids[..., None]).squeeze(-1)
    with torch.no_grad():
        logp_t_y = log_probs(teacher_logits_BTV.detach(), temperature=tau_t, dtype=cdt).gather(-1, ids[..., None]).squeeze(-1)
    return beta_opsd_sampled_loss(logp_s_y, logp_t_y, keep, teacher_weight=teacher_weight, discount=discount)


def beta_opsd_sampled_loss(
    student_logp_BT: torch.Tensor,
    teacher_logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    *,
    teacher_weight: float,
    discount: float = 0.99,
) -> BetaOPSDOutput:
    """:func:`beta_opsd_token_loss` from the sampled tokens' log-probabilities log pS(y_t) (with
    grad) and log pT(y_t) (at their temperatures): all beta-OPSD needs of the [V] distributions,
    so a caller can form them chunk by chunk (:func:`sampled_token_log_probs_from_hidden`)."""
    _same_shape(student_logp_BT=student_logp_BT, teacher_logp_BT=teacher_logp_BT, response_mask_BT=response_mask_BT)
    if isinstance(teacher_weight, bool) or not isinstance(teacher_weight, (int, float)) or not 0.0 < teacher_weight <= 1.0:
        raise ValueError(f"teacher_weight must be a number in (0, 1]; got {teacher_weight!r}")
    keep = response_mask_BT.bool()
    logp_s_y = student_logp_BT
    cdt = logp_s_y.dtype
    with torch.no_grad():
        logp_t_y = teacher_logp_BT.detach().to(cdt)
        s_y = logp_s_y.detach()
        if teacher_weight == 1.0:
            logq_y = logp_t_y
        else:  # log(w pT + (1 - w) pS) in log space
            logq_y = torch.logaddexp(logp_t_y + math.log(teacher_weight), s_y + math.log1p(-teacher_weight))
        zero = torch.zeros((), dtype=cdt, device=s_y.device)
        reward = torch.where(keep, logq_y - s_y, zero)
        returns = discounted_returns(reward, keep, discount=discount)
    loss = torch.where(keep, -returns * logp_s_y, torch.zeros((), dtype=cdt, device=logp_s_y.device))
    return BetaOPSDOutput(loss_BT=loss, reward_BT=reward, return_BT=returns)


# --------------------------------------------------------------------------- from hidden states
# The variants' targets need the full [V] distributions of up to three models; these wrappers
# form the logits from final hidden states one row chunk at a time, each chunk under activation
# checkpointing (recomputed in backward), so memory is O(chunk_size x V), never O(N x V).
def _check_chunk(chunk_size) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1; got {chunk_size!r}")
    return chunk_size


def _chunked(fn, chunk_size: int, *, rows: tuple, shared: tuple) -> torch.Tensor:
    """``cat(fn(*row_chunk, *shared))`` over row chunks of the ``rows`` tensors (all [N, ...])."""
    n = rows[0].shape[0]
    outs = []
    # no rows: one empty chunk, so the (empty) result is still connected to the weights' graph
    for start in range(0, max(n, 1), chunk_size):
        args = [t[start:start + chunk_size] for t in rows] + list(shared)
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
            outs.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            outs.append(fn(*args))
    return torch.cat(outs)


def purified_token_loss_from_hidden(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    reference_hidden_NH: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.5,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    pmi_strength: float = 1.0,
    pmi_clip: float = 10.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """:func:`purified_token_loss` [N] with logits = hidden @ weight.T (+ bias), chunked.

    The privileged and the reference-only teacher share the frozen ``teacher_weight_VH``.
    Gradient flows to ``student_hidden_NH``, ``student_weight_VH`` and ``student_bias``.
    """
    if teacher_hidden_NH.shape != student_hidden_NH.shape or reference_hidden_NH.shape != student_hidden_NH.shape:
        raise ValueError(f"student, teacher and reference hidden states must share [N, H]; got "
                         f"{tuple(student_hidden_NH.shape)}, {tuple(teacher_hidden_NH.shape)}, {tuple(reference_hidden_NH.shape)}")
    teacher_weight = teacher_weight_VH.detach()
    teacher_bias = None if teacher_bias is None else teacher_bias.detach()
    options = dict(beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
                   teacher_temperature=teacher_temperature, pmi_strength=pmi_strength, pmi_clip=pmi_clip)

    def chunk_loss(hs, ht, hr, ws, bs):
        with torch.no_grad():
            teacher_logits = F.linear(ht, teacher_weight, teacher_bias)
            reference_logits = F.linear(hr, teacher_weight, teacher_bias)
        return purified_token_loss(F.linear(hs, ws, bs), teacher_logits, reference_logits, **options)

    return _chunked(chunk_loss, _check_chunk(chunk_size),
                    rows=(student_hidden_NH, teacher_hidden_NH.detach(), reference_hidden_NH.detach()),
                    shared=(student_weight_VH, student_bias))


def sampled_token_log_probs_from_hidden(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    sampled_ids_N: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature)[y] per row, [N] in float32 (float64 inputs:
    float64), chunked; differentiable w.r.t. ``hidden_NH``, ``weight_VH`` and ``bias``."""
    n, vocab = hidden_NH.shape[0], weight_VH.shape[0]
    if sampled_ids_N.shape != (n,) or sampled_ids_N.is_floating_point():
        raise ValueError(f"sampled_ids_N must be an integer tensor of shape [{n}]; got {tuple(sampled_ids_N.shape)}")
    if n and (int(sampled_ids_N.min()) < 0 or int(sampled_ids_N.max()) >= vocab):
        raise ValueError(f"sampled_ids_N has ids outside [0, V={vocab})")
    tau = _positive("temperature", temperature)
    cdt = _dtype(hidden_NH, weight_VH)

    def chunk_logp(h, ids, w, b):
        return log_probs(F.linear(h, w, b), temperature=tau, dtype=cdt).gather(-1, ids[:, None]).squeeze(-1)

    return _chunked(chunk_logp, _check_chunk(chunk_size), rows=(hidden_NH, sampled_ids_N.long()), shared=(weight_VH, bias))
