r"""``beta_opsd``: beta-OPSD (the paper's \citep{beta_opsd}), replicated in the paper's appendix
"Replications of Recent OPSD Variants": "its teacher weight increases from 0.5 to 0.8, its reference
is the stop-gradient current student, and its return-to-go discount is 0.99".

No public method text or code was found: the formulas, and which parts are our reading, are in
docs/core_math.md, "Objectives" (beta-OPSD); the derivation is in :func:`beta_opsd_token_loss`.
``opsd.loss.beta`` and ``clip_tau`` do not enter its loss (they still set the clip diagnostics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from recipe.opsd.core.losses import compute_dtype, log_probs
from recipe.opsd.core.objectives.base import (
    Objective,
    ObjectiveBatch,
    ObjectiveLoss,
    register_objective,
    scatter_rows,
)
from recipe.opsd.core.objectives.terms import discounted_returns, positive, same_shape

__all__ = ["BetaOPSDParams", "teacher_weight_schedule", "BetaOPSDOutput", "beta_opsd_token_loss",
           "beta_opsd_sampled_loss", "BetaOPSD"]


@dataclass(frozen=True)
class BetaOPSDParams:
    """``opsd.loss.params`` of ``objective: beta_opsd``.

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
                raise ValueError(f"opsd.loss.params.{name} must be in (0, 1]; got {w!r}")
        d = self.discount
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= d <= 1.0:
            raise ValueError(f"opsd.loss.params.discount must be in [0, 1]; got {d!r}")


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
    """beta-OPSD per-position surrogate with return-to-go credit assignment.

    Target q = w pT + (1 - w) sg(pS) (reference = stop-gradient current student), the teacher weight w
    scheduled linearly over training (:func:`teacher_weight_schedule`, a per-step value the trainer sends:
    ``step_values``); the per-token reward on the sampled token is r_t = log q(y_t) - log pS(y_t)
    = log(w pT(y_t)/pS(y_t) + 1 - w) (bounded below by log(1 - w)); the sequence-level reverse KL
    KL(pS(y) || q(y)) has the score-function gradient -sum_t G_t grad log pS(y_t) with the return-to-go
    G_t = sum_{k >= t} gamma^(k - t) r_k, the "return-to-go credit assignment" (gamma = 0.99 discounts later
    tokens, as in tinker-cookbook's ``kl_discount_factor``). The per-position surrogate is
    loss_t = -sg(G_t) log pS(y_t). In training (``BetaOPSD.loss``) the returns run over every response
    token and the surrogate is aggregated over the loss positions.
    """
    if student_logits_BTV.dim() != 3:
        raise ValueError(f"student_logits_BTV must be [B, T, V]; got shape {tuple(student_logits_BTV.shape)}")
    same_shape(student_logits_BTV=student_logits_BTV, teacher_logits_BTV=teacher_logits_BTV)
    same_shape(sampled_ids_BT=sampled_ids_BT, response_mask_BT=response_mask_BT,
                logits_BT=student_logits_BTV[..., 0])
    if isinstance(teacher_weight, bool) or not isinstance(teacher_weight, (int, float)) or not 0.0 < teacher_weight <= 1.0:
        raise ValueError(f"teacher_weight must be a number in (0, 1]; got {teacher_weight!r}")
    vocab = student_logits_BTV.shape[-1]
    ids = sampled_ids_BT.long()
    keep = response_mask_BT.bool()
    if bool(((ids < 0) | (ids >= vocab))[keep].any()):
        raise ValueError(f"sampled_ids_BT has ids outside [0, V={vocab}) at response positions")
    ids = torch.where(keep, ids, torch.zeros_like(ids))
    tau_s = positive("student_temperature", student_temperature)
    tau_t = tau_s if teacher_temperature is None else positive("teacher_temperature", teacher_temperature)
    cdt = compute_dtype(student_logits_BTV, teacher_logits_BTV)
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
    same_shape(student_logp_BT=student_logp_BT, teacher_logp_BT=teacher_logp_BT, response_mask_BT=response_mask_BT)
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


@register_objective
class BetaOPSD(Objective):
    name = "beta_opsd"
    order = 3
    Params = BetaOPSDParams
    step_value_names = ("teacher_weight",)

    def step_values(self, *, step: int, total_steps: int, updates_per_step: int = 1) -> dict[str, float]:
        return {"teacher_weight": teacher_weight_schedule(step, total_steps=total_steps,
                                                          start=self.params.teacher_weight_start,
                                                          end=self.params.teacher_weight_end)}

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        response_mask_bR, loss_mask_bR = batch.response_mask_bR, batch.loss_mask_bR
        # the return-to-go runs over every response token; the surrogate is aggregated over the loss positions
        student_logp_bR = self.student_log_probs_bR(batch)
        out = beta_opsd_sampled_loss(
            student_logp_bR,
            scatter_rows(response_mask_bR, batch.signals["teacher_logp"].to(student_logp_bR.dtype)),
            response_mask_bR,
            teacher_weight=float(batch.step_values["teacher_weight"]),
            discount=self.params.discount,
        )
        per_token_N = out.loss_BT[loss_mask_bR]
        loss = (per_token_N * batch.weight_bR[loss_mask_bR].to(per_token_N.dtype)).sum()
        return ObjectiveLoss(loss=loss, per_token_N=per_token_N, signals=batch.signals,
                             metrics_N={"opsd/beta_reward": out.reward_BT[response_mask_bR],
                                        "opsd/beta_return": out.return_BT[response_mask_bR]})
