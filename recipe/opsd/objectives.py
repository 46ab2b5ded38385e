r"""Objectives beside the full-vocabulary divergence (pure torch): the sampled-token
policy-gradient form, a task-reward advantage mixed in, and an SFT term on the reference
solution. Formulas and where each peer differs: docs/core_math.md, "Mixed objectives".

The paper's objective is the full-vocabulary divergence alone ("The objective contains no task
reward, correctness signal, policy-gradient advantage, or auxiliary supervised loss"), so every
weight here defaults to off. Notation per response b and position t (mask m_bt), sampled token
y_t, student prompt c_S, teacher prompt c_T:

(a) Sampled-token objective (reverse KL through a policy gradient):

    A_bt  = sg[ log pT(y_t | c_T, y_<t) - log pS_old(y_t | c_S, y_<t) ]       (tau_T, tau_S)
            (optionally the discounted sum over k >= t, ``discount`` = tinker's kl_discount_factor)
    r_bt  = exp(clamp(log pS_theta(y_t) - log pS_old(y_t), -20, 20))
    l_bt  = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), and for A < 0: min(l_bt, -c A)
    L_pg  = sum_bt w_bt l_bt

    pS_old are the log-probs of the policy that sampled the rollout (verl's ``old_log_probs``),
    so A is a fixed per-token reward for the whole update; the surrogate is verl 0.9.1's
    ``compute_policy_loss_vanilla`` (clip ratios, dual clip c = 3, ratio clamp +-20), with
    ``clip_ratio_low=None`` (and high) for the unclipped importance-sampling loss -r A of
    tinker's ``importance_sampling``. At r = 1 the gradient is -sum w A grad log pS_theta(y_t).

(b) Task reward: the GRPO advantage of response b in its prompt group g,

    Ahat_b = (R_b - mean_g R) / (std_g R + eps)      (unbiased std, eps = 1e-6; verl's GRPO)

    (``normalize_by_std=False``: R_b - mean_g R, Dr. GRPO / tinker), R_b the one grader's reward
    (``grade(..., mode="reward")``), mixed per token as A_bt <- A_bt + task_weight * Ahat_b and
    fed to the same surrogate. With the full-vocabulary divergence there is no distillation
    advantage; the task term is then its own surrogate with A_bt = Ahat_b (``objective_loss``).

(c) SFT term on the reference solution s (tokens s_1..s_M, EOS included) under the student
    given the student prompt, at temperature 1 (the model's own distribution, as SFT trains it):

    L_sft = sum_m v_m (-log pS_theta(s_m | c_S, s_<m)),   v_m = 1 / (solution tokens in the mini-batch)

Combination (``objective_loss``): L = L_main + sft_weight * L_sft, with L_main the divergence
L_div (default) plus task_weight * L_pg(Ahat), or the sampled-token L_pg(A + task_weight * Ahat).

Exact global normalisation: every term is a weighted sum with weights that the caller forms
from mini-batch-wide counts (e.g. w_bt = m_bt / loss tokens in the mini-batch, like
``losses.global_token_row_weights``; each term has its own count), so summing the per-micro-
batch values over micro-batches gives the mini-batch loss exactly, whatever the split.

Example (one micro-batch)::

    adv_BT = sampled_token_advantages(teacher_log_probs_BT=lt, old_log_probs_BT=lo, mask_BT=m)
    adv_BT = mix_task_advantages(distill_advantages_BT=adv_BT, task_advantages_B=a_B, mask_BT=m, task_weight=0.1)
    pg_BT = policy_gradient_terms(log_probs_BT=lp, old_log_probs_BT=lo, advantages_BT=adv_BT)
    loss = weighted_sum(pg_BT, weights_BT=m / tokens_in_mini_batch)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recipe.opsd.variants import discounted_returns

__all__ = [
    "OBJECTIVES",
    "ObjectiveWeights",
    "sampled_token_advantages",
    "group_advantages",
    "mix_task_advantages",
    "policy_gradient_terms",
    "sft_nll_terms",
    "weighted_sum",
    "objective_loss",
]

# ``objective`` values: the paper's full-vocabulary divergence, or the sampled-token form (a).
OBJECTIVES = ("full_vocabulary", "sampled_token")
# verl 0.9.1 compute_policy_loss_vanilla: ratio log clamp and the dual-clip constant's default.
LOG_RATIO_CLAMP = 20.0
DUAL_CLIP_C = 3.0
GRPO_EPSILON = 1e-6


def _number(name: str, value, *, low: float | None = None, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number; got {value!r}")
    if low is not None and (value < low or (not allow_zero and value == low)):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} {low}; got {value!r}")
    return float(value)


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match; got {shapes}")


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


@dataclass(frozen=True)
class ObjectiveWeights:
    """Which objective and how much of each extra term (defaults: the paper's objective alone).

    objective: ``full_vocabulary`` (the divergence of ``recipe.opsd.losses``) or ``sampled_token`` (a).
    task_weight: weight of the GRPO advantage of the task reward (b); 0 = no task reward.
    sft_weight: weight of the SFT term on the reference solution (c); 0 = none.
    clip_ratio_low / clip_ratio_high: PPO clip of the policy-gradient surrogate (verl's 0.2 / 0.2);
        None = unclipped (tinker's importance-sampling loss). Used by (a) and by the task term.
    discount: discount of the distillation advantage over later tokens (0 = per token, as verl and
        the official code; tinker's kl_discount_factor).
    """

    objective: str = "full_vocabulary"
    task_weight: float = 0.0
    sft_weight: float = 0.0
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    discount: float = 0.0

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}; got {self.objective!r}")
        _number("task_weight", self.task_weight, low=0.0)
        _number("sft_weight", self.sft_weight, low=0.0)
        for name in ("clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            if value is not None:
                _number(name, value, low=0.0, allow_zero=False)
        if (self.clip_ratio_low is None) != (self.clip_ratio_high is None):
            raise ValueError("clip_ratio_low and clip_ratio_high must both be numbers or both be None (unclipped); "
                             f"got {self.clip_ratio_low!r} and {self.clip_ratio_high!r}")
        if self.clip_ratio_low is not None and self.clip_ratio_low >= 1:
            raise ValueError(f"clip_ratio_low must be < 1 (the ratio is clipped to [1 - low, 1 + high]); "
                             f"got {self.clip_ratio_low!r}")
        discount = _number("discount", self.discount, low=0.0)
        if discount > 1:
            raise ValueError(f"discount must be in [0, 1]; got {self.discount!r}")

    @property
    def needs_policy_gradient(self) -> bool:
        """Whether the step needs old log-probs and a policy-gradient surrogate."""
        return self.objective == "sampled_token" or self.task_weight > 0

    @property
    def needs_task_reward(self) -> bool:
        return self.task_weight > 0

    @property
    def needs_sft(self) -> bool:
        """Whether the step needs the SFT term (a second student forward on the reference solutions)."""
        return self.sft_weight > 0


def sampled_token_advantages(*, teacher_log_probs_BT: torch.Tensor, old_log_probs_BT: torch.Tensor,
                             mask_BT: torch.Tensor, discount: float = 0.0) -> torch.Tensor:
    """A_bt = sg[log pT(y_t) - log pS_old(y_t)] at the mask (0 elsewhere); with ``discount`` > 0
    the discounted sum over the response's later positions (``variants.discounted_returns``)."""
    _same_shape(teacher_log_probs_BT=teacher_log_probs_BT, old_log_probs_BT=old_log_probs_BT, mask_BT=mask_BT)
    discount = _number("discount", discount, low=0.0)
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
    epsilon = _number("epsilon", epsilon, low=0.0)
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
    """A_bt + task_weight * Ahat_b at the mask (0 elsewhere), no grad."""
    _same_shape(distill_advantages_BT=distill_advantages_BT, mask_BT=mask_BT)
    if task_advantages_B.shape != distill_advantages_BT.shape[:1]:
        raise ValueError(f"task_advantages_B must be [B={distill_advantages_BT.shape[0]}]; got "
                         f"{tuple(task_advantages_B.shape)}")
    weight = _number("task_weight", task_weight, low=0.0)
    keep = mask_BT.bool()
    mixed = distill_advantages_BT.detach() + weight * task_advantages_B.detach().to(distill_advantages_BT.dtype)[:, None]
    return torch.where(keep, mixed, _zero(mixed))


def policy_gradient_terms(*, log_probs_BT: torch.Tensor, old_log_probs_BT: torch.Tensor,
                          advantages_BT: torch.Tensor, clip_ratio_low: float | None = 0.2,
                          clip_ratio_high: float | None = 0.2, clip_ratio_c: float = DUAL_CLIP_C) -> torch.Tensor:
    """Per-token surrogate l_bt of verl's vanilla PPO policy loss (module docstring, (a)).

    Differentiable w.r.t. ``log_probs_BT``; ``old_log_probs_BT`` and ``advantages_BT`` are
    constants. ``clip_ratio_low=clip_ratio_high=None``: -A r without any clip. Aggregate with
    :func:`weighted_sum`; masked positions may hold anything (the weights drop them).
    """
    _same_shape(log_probs_BT=log_probs_BT, old_log_probs_BT=old_log_probs_BT, advantages_BT=advantages_BT)
    if (clip_ratio_low is None) != (clip_ratio_high is None):
        raise ValueError("clip_ratio_low and clip_ratio_high must both be numbers or both be None (unclipped)")
    c = _number("clip_ratio_c", clip_ratio_c)
    if c <= 1:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip lower bound); got {clip_ratio_c!r}")
    advantages = advantages_BT.detach()
    log_ratio = (log_probs_BT - old_log_probs_BT.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    if clip_ratio_low is None:
        return unclipped
    low = _number("clip_ratio_low", clip_ratio_low, low=0.0)
    high = _number("clip_ratio_high", clip_ratio_high, low=0.0)
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    terms = torch.maximum(unclipped, clipped)
    return torch.where(advantages < 0, torch.minimum(terms, -advantages * c), terms)


def sft_nll_terms(*, solution_log_probs_N: torch.Tensor) -> torch.Tensor:
    """-log pS_theta(s_m | c_S, s_<m) per solution token (log-probs at temperature 1, with grad)."""
    if solution_log_probs_N.dim() != 1:
        raise ValueError(f"solution_log_probs_N must be [N]; got shape {tuple(solution_log_probs_N.shape)}")
    return -solution_log_probs_N


def weighted_sum(values: torch.Tensor, *, weights: torch.Tensor) -> torch.Tensor:
    """sum(weights * values) where weights != 0; values at zero-weight entries (padding: NaN,
    garbage) never reach the result or its gradient."""
    _same_shape(values=values, weights=weights)
    keep = weights != 0
    return torch.where(keep, weights.to(values.dtype) * values, _zero(values)).sum()


def objective_loss(weights: ObjectiveWeights, *, divergence: torch.Tensor | None = None,
                   policy_gradient: torch.Tensor | None = None, task_policy_gradient: torch.Tensor | None = None,
                   sft: torch.Tensor | None = None) -> torch.Tensor:
    """The micro-batch loss L_main + sft_weight * L_sft from already weighted terms (scalars).

    ``full_vocabulary``: L_main = ``divergence`` + task_weight * ``task_policy_gradient`` (the
    surrogate with A = Ahat). ``sampled_token``: L_main = ``policy_gradient`` (the surrogate
    with the task advantage already mixed in by :func:`mix_task_advantages`). A term whose
    weight is 0 must be None and one whose weight is not must be given, so no term is silently
    dropped or added.
    """
    full = weights.objective == "full_vocabulary"
    expected = {
        "divergence": full,
        "policy_gradient": not full,
        "task_policy_gradient": full and weights.task_weight > 0,
        "sft": weights.sft_weight > 0,
    }
    given = {"divergence": divergence, "policy_gradient": policy_gradient,
             "task_policy_gradient": task_policy_gradient, "sft": sft}
    for name, needed in expected.items():
        if needed != (given[name] is not None):
            raise ValueError(f"objective_loss: {name} must be {'given' if needed else 'None'} for {weights}")
    loss = divergence if full else policy_gradient
    if task_policy_gradient is not None:
        loss = loss + weights.task_weight * task_policy_gradient
    if sft is not None:
        loss = loss + weights.sft_weight * sft
    return loss
