"""Terms the objectives share (pure torch): the policy-gradient surrogate, advantages, the SFT term, returns
over a response, and the sampled tokens' log-probabilities from hidden states. Formulas and where each peer
differs: docs/core_math.md, "Objectives"; verl's and tinker's counterparts: each function's docstring.

Every term is a weighted sum (``weighted_sum``) with weights the caller forms from mini-batch-wide counts, so
the per-micro-batch values add up to the mini-batch loss exactly, whatever the split. Example::

    adv_BT = sampled_token_advantages(teacher_log_probs_BT=teacher_logp_BT, old_log_probs_BT=old_logp_BT, mask_BT=mask_BT)
    adv_BT = mix_task_advantages(distill_advantages_BT=adv_BT, task_advantages_B=grpo_B, mask_BT=mask_BT, task_weight=0.1)
    pg_BT = policy_gradient_terms(log_probs_BT=logp_BT, old_log_probs_BT=old_logp_BT, advantages_BT=adv_BT)
    loss = weighted_sum(pg_BT, weights=mask_BT / tokens_in_mini_batch)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from recipe.opsd.core.losses import compute_dtype, log_probs

__all__ = [
    "sampled_token_advantages",
    "group_advantages",
    "mix_task_advantages",
    "policy_gradient_terms",
    "sft_nll_terms",
    "weighted_sum",
    "discounted_returns",
    "sampled_token_log_probs_from_hidden",
    "chunked_rows",
    "number",
    "positive",
    "same_shape",
]

# verl 0.9.1 compute_policy_loss_vanilla: ratio log clamp and the dual-clip constant's default.
LOG_RATIO_CLAMP = 20.0
DUAL_CLIP_C = 3.0
GRPO_EPSILON = 1e-6


def number(name: str, value, *, low: float | None = None, allow_zero: bool = True) -> float:
    """``value`` as a float, or a ValueError naming ``name`` (finite, >= / > ``low``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number; got {value!r}")
    if low is not None and (value < low or (not allow_zero and value == low)):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} {low}; got {value!r}")
    return float(value)


def positive(name: str, value) -> float:
    """``value`` as a float, or a ValueError naming ``name`` (a finite number > 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match; got {shapes}")


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def sampled_token_advantages(*, teacher_log_probs_BT: torch.Tensor, old_log_probs_BT: torch.Tensor,
                             mask_BT: torch.Tensor, discount: float = 0.0) -> torch.Tensor:
    """A_bt = sg[log pT(y_t | c_T, y_<t) - log pS_old(y_t | c_S, y_<t)] (at the teacher / student temperatures)
    at the mask (0 elsewhere): reverse KL through a policy gradient; with ``discount`` > 0 the discounted sum
    over the response's later positions (``discounted_returns``; tinker's ``kl_discount_factor``)."""
    same_shape(teacher_log_probs_BT=teacher_log_probs_BT, old_log_probs_BT=old_log_probs_BT, mask_BT=mask_BT)
    discount = number("discount", discount, low=0.0)
    if discount > 1:
        raise ValueError(f"discount must be in [0, 1]; got {discount!r}")
    keep = mask_BT.bool()
    with torch.no_grad():
        diff = teacher_log_probs_BT.detach() - old_log_probs_BT.detach()
        advantages = torch.where(keep, diff, _zero(diff))
        if discount > 0:
            advantages = discounted_returns(advantages, keep, discount=discount)
    return advantages


def group_advantages(*, rewards_B: torch.Tensor, group_ids_B: Sequence, normalize_by_std: bool = True,
                     epsilon: float = GRPO_EPSILON) -> torch.Tensor:
    """GRPO advantage per response: (R_b - mean_g R) / (std_g R + eps) over b's group g.

    Matches verl 0.9.1's ``compute_grpo_outcome_advantage``: unbiased std (n - 1), a group of
    one response gets mean 0 and std 1; ``normalize_by_std=False`` only centres (Dr. GRPO).
    ``group_ids_B``: any hashable per response (verl's ``uid``). Returns [B], no grad.
    """
    if rewards_B.dim() != 1 or len(group_ids_B) != rewards_B.shape[0]:
        raise ValueError(f"rewards_B must be [B] with one group id per response; got shape "
                         f"{tuple(rewards_B.shape)} and {len(group_ids_B)} ids")
    epsilon = number("epsilon", epsilon, low=0.0)
    rewards = rewards_B.detach()
    members: dict = {}
    for index, gid in enumerate(group_ids_B):
        members.setdefault(gid, []).append(index)
    advantages = torch.empty_like(rewards)
    for indices in members.values():
        group = rewards[indices]
        if len(indices) == 1:
            mean, std = _zero(rewards), torch.ones((), dtype=rewards.dtype, device=rewards.device)
        else:
            mean, std = group.mean(), group.std()
        advantages[indices] = (group - mean) / (std + epsilon) if normalize_by_std else group - mean
    return advantages


def mix_task_advantages(*, distill_advantages_BT: torch.Tensor, task_advantages_B: torch.Tensor,
                        mask_BT: torch.Tensor, task_weight: float) -> torch.Tensor:
    """A_bt + task_weight * Ahat_b at the mask (0 elsewhere), no grad (Ahat_b: :func:`group_advantages`)."""
    same_shape(distill_advantages_BT=distill_advantages_BT, mask_BT=mask_BT)
    if task_advantages_B.shape != distill_advantages_BT.shape[:1]:
        raise ValueError(f"task_advantages_B must be [B={distill_advantages_BT.shape[0]}]; got "
                         f"{tuple(task_advantages_B.shape)}")
    weight = number("task_weight", task_weight, low=0.0)
    keep = mask_BT.bool()
    mixed = distill_advantages_BT.detach() + weight * task_advantages_B.detach().to(distill_advantages_BT.dtype)[:, None]
    return torch.where(keep, mixed, _zero(mixed))


def policy_gradient_terms(*, log_probs_BT: torch.Tensor, old_log_probs_BT: torch.Tensor,
                          advantages_BT: torch.Tensor, clip_ratio_low: float | None = 0.2,
                          clip_ratio_high: float | None = 0.2, clip_ratio_c: float = DUAL_CLIP_C) -> torch.Tensor:
    """Per-token surrogate l_bt of verl 0.9.1's ``compute_policy_loss_vanilla`` (clip ratios, dual clip
    c = 3, ratio clamp +-20; docs/core_math.md, "Objectives").

    Differentiable w.r.t. ``log_probs_BT``; ``old_log_probs_BT`` and ``advantages_BT`` are
    constants. ``clip_ratio_low=clip_ratio_high=None``: -A r without any clip (the unclipped
    importance-sampling loss of tinker's ``importance_sampling``). pS_old are the log-probs of the policy
    that sampled the rollout, so A is a fixed per-token reward for the whole update; at r = 1 the gradient
    is -sum w A grad log pS_theta(y_t). Aggregate with :func:`weighted_sum`; masked positions may hold
    anything (the weights drop them).
    """
    same_shape(log_probs_BT=log_probs_BT, old_log_probs_BT=old_log_probs_BT, advantages_BT=advantages_BT)
    if (clip_ratio_low is None) != (clip_ratio_high is None):
        raise ValueError("clip_ratio_low and clip_ratio_high must both be numbers or both be None (unclipped)")
    c = number("clip_ratio_c", clip_ratio_c)
    if c <= 1:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip lower bound); got {clip_ratio_c!r}")
    advantages = advantages_BT.detach()
    log_ratio = (log_probs_BT - old_log_probs_BT.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    if clip_ratio_low is None:
        return unclipped
    low = number("clip_ratio_low", clip_ratio_low, low=0.0)
    high = number("clip_ratio_high", clip_ratio_high, low=0.0)
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    terms = torch.maximum(unclipped, clipped)
    return torch.where(advantages < 0, torch.minimum(terms, -advantages * c), terms)


def sft_nll_terms(*, solution_log_probs_N: torch.Tensor) -> torch.Tensor:
    """The SFT term on the reference solution s (tokens s_1..s_M, EOS included) under the student given the
    student prompt: -log pS_theta(s_m | c_S, s_<m) per solution token (log-probs at temperature 1, with grad)."""
    if solution_log_probs_N.dim() != 1:
        raise ValueError(f"solution_log_probs_N must be [N]; got shape {tuple(solution_log_probs_N.shape)}")
    return -solution_log_probs_N


def weighted_sum(values: torch.Tensor, *, weights: torch.Tensor) -> torch.Tensor:
    """sum(weights * values) where weights != 0; values at zero-weight entries (padding: NaN,
    garbage) never reach the result or its gradient."""
    same_shape(values=values, weights=weights)
    keep = weights != 0
    return torch.where(keep, weights.to(values.dtype) * values, _zero(values)).sum()


def discounted_returns(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, *, discount: float) -> torch.Tensor:
    """Return-to-go G_t = sum_{k >= t, mask_k} discount^(#valid steps from t to k) r_k, 0 where masked.

    Masked positions carry no reward and do not advance the discount (so left/right padding and
    holes in the response mask are skipped, not counted as steps).
    """
    same_shape(rewards_BT=rewards_BT, mask_BT=mask_BT)
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


# ------------------------------------------------------------------- from hidden states
# Targets that need the full [V] distributions are formed from final hidden states one row chunk at a
# time, each chunk under activation checkpointing (recomputed in backward), so memory is
# O(chunk_size x V), never O(N x V).
def _check_chunk(chunk_size) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1; got {chunk_size!r}")
    return chunk_size


def chunked_rows(fn, chunk_size: int, *, rows: tuple, shared: tuple) -> torch.Tensor:
    """``cat(fn(*row_chunk, *shared))`` over row chunks of the ``rows`` tensors (all [N, ...]), each
    chunk under activation checkpointing when it needs a gradient."""
    chunk_size = _check_chunk(chunk_size)
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
    tau = positive("temperature", temperature)
    cdt = compute_dtype(hidden_NH, weight_VH)

    def chunk_logp(h, ids, w, b):
        return log_probs(F.linear(h, w, b), temperature=tau, dtype=cdt).gather(-1, ids[:, None]).squeeze(-1)

    return chunked_rows(chunk_logp, chunk_size, rows=(hidden_NH, sampled_ids_N.long()), shared=(weight_VH, bias))
