"""``rlsd``: RLVR with Self-Distillation (Yang et al., arXiv:2604.03128), as its authors' trainer computes it.

Reference: siyan-zhao/OPSD ``rlsd_trainer.py`` (``RLSDTrainer._generate_and_score_completions``), defaults
in ``rlsd_train.py`` and ``scripts/run_rlsd_1b.sh``. The GRPO advantage Ahat_b of the grader's reward sets
each response's sign (sign(A_bt) = sign(Ahat_b)); the teacher only reweights its tokens
(``rlsd_token_weights``, ``rlsd_advantages``, at lam_s = 0 it is GRPO), through the PPO surrogate
(``terms.policy_gradient_terms``). Formulas: docs/core_math.md, "Objectives" (RLSD); the preset
``objective_rlsd`` names where the verl recipe departs from the reference.
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
    """``opsd.loss.params`` of ``objective: rlsd`` (defaults: the reference's ``rlsd_train.py``).

    eps_w: the token weight is clipped to [1 - eps_w, 1 + eps_w], eps_w in (0, 1).
    lam: the teacher's share of the token weight at the first optimizer step, in [0, 1].
    lam_decay_steps: optimizer steps over which lam falls linearly to 0 (0 = lam stays constant).
    """

    eps_w: float = 0.2
    lam: float = 0.5
    lam_decay_steps: int = 50

    def __post_init__(self):
        eps = number("opsd.loss.params.eps_w", self.eps_w, low=0.0, allow_zero=False)
        if eps >= 1:
            raise ValueError(f"opsd.loss.params.eps_w must be in (0, 1) (the weight stays positive); got {self.eps_w!r}")
        lam = number("opsd.loss.params.lam", self.lam, low=0.0)
        if lam > 1:
            raise ValueError(f"opsd.loss.params.lam must be in [0, 1]; got {self.lam!r}")
        steps = self.lam_decay_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"opsd.loss.params.lam_decay_steps must be an integer >= 0 (0 = constant lam); got {steps!r}")


def rlsd_lambda(*, optimizer_step: int, lam: float, lam_decay_steps: int) -> float:
    """lam * (1 - min(optimizer_step / lam_decay_steps, 1)); ``lam`` itself when ``lam_decay_steps`` is 0."""
    if lam_decay_steps <= 0:
        return float(lam)
    return float(lam) * (1.0 - min(optimizer_step / lam_decay_steps, 1.0))


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
                    lam: float) -> torch.Tensor:
    """A_bt = Ahat_b ((1 - lam) + lam w_bt) at the mask, 0 elsewhere; no grad."""
    same_shape(token_weights_BT=token_weights_BT, mask_BT=mask_BT)
    with torch.no_grad():
        advantages = task_advantages_B.detach().to(token_weights_BT.dtype)[:, None] * ((1.0 - lam) + lam * token_weights_BT)
        return torch.where(mask_BT.bool(), advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))


@register_objective
class RLSD(Objective):
    name = "rlsd"
    order = 4
    Params = RLSDParams
    needs_task_reward = True
    uses_policy_gradient = True
    step_value_names = ("rlsd_lambda",)

    def step_values(self, *, step: int, total_steps: int, updates_per_step: int = 1) -> dict[str, float]:
        # the reference reads lam at generation time: after the optimizer steps of the earlier batches
        return {"rlsd_lambda": rlsd_lambda(optimizer_step=step * updates_per_step, lam=self.params.lam,
                                           lam_decay_steps=self.params.lam_decay_steps)}

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        response_mask_bR = batch.response_mask_bR
        student_logp_bR = self.student_log_probs_bR(batch)
        task_advantages_b = batch.task_advantages_b.to(student_logp_bR.dtype)
        weights_bR = rlsd_token_weights(
            task_advantages_B=task_advantages_b,
            teacher_log_probs_BT=scatter_rows(response_mask_bR, batch.signals["teacher_logp"].to(student_logp_bR.dtype)),
            old_log_probs_BT=self.old_log_probs_bR(batch, student_logp_bR), mask_BT=response_mask_bR,
            eps_w=self.params.eps_w,
        )
        advantages_bR = rlsd_advantages(task_advantages_B=task_advantages_b, token_weights_BT=weights_bR,
                                        mask_BT=response_mask_bR, lam=float(batch.step_values["rlsd_lambda"]))
        loss, terms_bR, metrics_N = self.surrogate(batch, advantages_bR, student_logp_bR)
        weights_N = weights_bR[response_mask_bR]
        clipped_N = ((weights_N <= 1.0 - self.params.eps_w) | (weights_N >= 1.0 + self.params.eps_w)).to(weights_N.dtype)
        return ObjectiveLoss(loss=loss, per_token_N=terms_bR[batch.loss_mask_bR], signals=batch.signals,
                             metrics_N={"opsd/pg_advantage": advantages_bR[response_mask_bR], **metrics_N,
                                        "opsd/rlsd_weight": weights_N, "opsd/rlsd_weight_clipped": clipped_N})
