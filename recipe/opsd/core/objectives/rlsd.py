"""``rlsd``: RLVR with Self-Distillation (Yang et al., "Self-Distilled RLVR", arXiv:2604.03128).

The verifier's reward sets the direction of each response's update; the privileged teacher only
reweights each token's share of it. Per response b (GRPO group advantage Ahat_b of the one grader's
reward, ``terms.group_advantages``) and sampled token y_t:

    delta_bt = sg[ log pT(y_t) - log pS_old(y_t) ]                  (the teacher / student temperatures)
    w_bt     = clip( exp(sign(Ahat_b) * delta_bt), 1 - eps_w, 1 + eps_w )
    A_bt     = Ahat_b * (1 + lam * (w_bt - 1))                      (lam = 1: A_bt = Ahat_b * w_bt)
    loss     = sum_bt weight_bt * l_bt(A)                           (``terms.policy_gradient_terms``: verl's
                                                                     PPO surrogate, ``opsd.loss.clip_ratio_*``)

so sign(A_bt) = sign(Ahat_b) at every token (w > 0): a correct response's tokens the teacher favours
get more credit, an incorrect response's tokens the teacher disfavours get more blame; a group
whose rewards are all equal (Ahat = 0) trains nothing, as in GRPO.

What we implement, and what is our reading. The paper's abstract states the split (teacher-student
token-level policy differences set the update magnitudes, the verifier's reward the directions);
its method text was not available to us. The weight above -- the evidence ratio exp(delta) taken
to the power sign(A), clipped to [1 - eps_w, 1 + eps_w], mixed in by lam -- is the form of the
public RLSD re-implementations we found (a credit-weight module of a training cookbook and a
project page comparing RLSD with SDPO); eps_w = 0.2 and lam = 1 are their defaults. Our readings:
delta uses the sampling policy pS_old (the update's own forward detached, as ``sampled_token``),
Ahat is verl's GRPO advantage (std-normalised) and the clip is on w, not on delta.

Needs the task reward at any ``opsd.loss.task_weight`` (``needs_task_reward``; task_weight itself
must stay 0: the reward is the direction, not an added term) and ``actor_rollout_ref.rollout.n`` > 1.
``opsd.loss.beta``, ``clip_tau`` and ``topk`` do not enter (clip_tau still sets the diagnostics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recipe.opsd.core.objectives.base import (
    Objective,
    ObjectiveBatch,
    ObjectiveLoss,
    register_objective,
    scatter_rows,
)
from recipe.opsd.core.objectives.terms import number, same_shape


@dataclass(frozen=True)
class RLSDParams:
    """``opsd.loss.params`` of ``objective: rlsd``.

    eps_w: the token weight is clipped to [1 - eps_w, 1 + eps_w], eps_w in (0, 1).
    lam: how much of the teacher's reweighting enters, in [0, 1] (0 = GRPO's uniform credit).
    """

    eps_w: float = 0.2
    lam: float = 1.0

    def __post_init__(self):
        eps = number("opsd.loss.params.eps_w", self.eps_w, low=0.0, allow_zero=False)
        if eps >= 1:
            raise ValueError(f"opsd.loss.params.eps_w must be in (0, 1) (the weight stays positive); got {self.eps_w!r}")
        lam = number("opsd.loss.params.lam", self.lam, low=0.0)
        if lam > 1:
            raise ValueError(f"opsd.loss.params.lam must be in [0, 1]; got {self.lam!r}")


def rlsd_token_weights(*, task_advantages_B: torch.Tensor, teacher_log_probs_BT: torch.Tensor,
                       old_log_probs_BT: torch.Tensor, mask_BT: torch.Tensor, eps_w: float) -> torch.Tensor:
    """w_bt = clip(exp(sign(Ahat_b) (log pT(y_t) - log pS_old(y_t))), 1 - eps_w, 1 + eps_w) at the mask,
    1 elsewhere; no grad."""
    same_shape(teacher_log_probs_BT=teacher_log_probs_BT, old_log_probs_BT=old_log_probs_BT, mask_BT=mask_BT)
    if task_advantages_B.shape != teacher_log_probs_BT.shape[:1]:
        raise ValueError(f"task_advantages_B must be [B={teacher_log_probs_BT.shape[0]}]; got "
                         f"{tuple(task_advantages_B.shape)}")
    with torch.no_grad():
        delta = teacher_log_probs_BT.detach() - old_log_probs_BT.detach()
        sign = torch.sign(task_advantages_B.detach()).to(delta.dtype)[:, None]
        weights = torch.exp(sign * delta).clamp(1.0 - eps_w, 1.0 + eps_w)
        return torch.where(mask_BT.bool(), weights, torch.ones((), dtype=weights.dtype, device=weights.device))


def rlsd_advantages(*, task_advantages_B: torch.Tensor, token_weights_BT: torch.Tensor, mask_BT: torch.Tensor,
                    lam: float = 1.0) -> torch.Tensor:
    """A_bt = Ahat_b (1 + lam (w_bt - 1)) at the mask, 0 elsewhere; no grad."""
    same_shape(token_weights_BT=token_weights_BT, mask_BT=mask_BT)
    with torch.no_grad():
        advantages = task_advantages_B.detach().to(token_weights_BT.dtype)[:, None] * (1.0 + lam * (token_weights_BT - 1.0))
        return torch.where(mask_BT.bool(), advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))


@register_objective
class RLSD(Objective):
    name = "rlsd"
    Params = RLSDParams
    needs_task_reward = True
    uses_policy_gradient = True

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        response_mask_bR = batch.response_mask_bR
        student_logp_bR = self.student_log_probs_bR(batch)
        task_advantages_b = batch.task_advantages_b.to(student_logp_bR.dtype)
        weights_bR = rlsd_token_weights(
            task_advantages_B=task_advantages_b,
            teacher_log_probs_BT=scatter_rows(response_mask_bR, batch.signals["teacher_logp"].to(student_logp_bR.dtype)),
            old_log_probs_BT=student_logp_bR.detach(), mask_BT=response_mask_bR, eps_w=self.params.eps_w,
        )
        advantages_bR = rlsd_advantages(task_advantages_B=task_advantages_b, token_weights_BT=weights_bR,
                                        mask_BT=response_mask_bR, lam=self.params.lam)
        loss, terms_bR = self.surrogate(batch, advantages_bR, student_logp_bR)
        weights_N = weights_bR[response_mask_bR]
        clipped_N = ((weights_N <= 1.0 - self.params.eps_w) | (weights_N >= 1.0 + self.params.eps_w)).to(weights_N.dtype)
        return ObjectiveLoss(loss=loss, per_token_N=terms_bR[batch.loss_mask_bR], signals=batch.signals,
                             metrics_N={"opsd/pg_advantage": advantages_bR[response_mask_bR],
                                        "opsd/rlsd_weight": weights_N, "opsd/rlsd_weight_clipped": clipped_N})
