"""``sampled_token``: the teacher - student log-probability of each sampled token as a per-token
advantage through verl's PPO surrogate (reverse KL through a policy gradient; the official code's
``use_tinker_loss``, verl's ``use_policy_gradient``). Formulas: docs/core_math.md, "Objectives".

The advantage (``terms.sampled_token_advantages``; with ``opsd.loss.params.discount`` > 0 discounted over
later tokens) plus ``opsd.loss.task_weight`` x the GRPO advantage goes through ``terms.policy_gradient_terms``
(``opsd.loss.clip_ratio_low / high``). log pT(y_t) comes from the glue's diagnostics pass
(``signals["teacher_logp"]``), log pS_theta(y_t) from a chunked, checkpointed pass
(``terms.sampled_token_log_probs_from_hidden``), pS_old from ``Objective.old_log_probs_bR``.
``opsd.loss.beta``, ``clip_tau`` and ``topk`` do not enter (clip_tau still sets the diagnostics).
"""

from __future__ import annotations

from dataclasses import dataclass

from recipe.opsd.core.objectives.base import (
    Objective,
    ObjectiveBatch,
    ObjectiveLoss,
    register_objective,
    scatter_rows,
)
from recipe.opsd.core.objectives.terms import mix_task_advantages, number, sampled_token_advantages


@dataclass(frozen=True)
class SampledTokenParams:
    """``opsd.loss.params`` of ``objective: sampled_token``.

    discount: discount of the advantage over later tokens (0 = per token, as verl and the official
        code; tinker's ``kl_discount_factor``), in [0, 1].
    """

    discount: float = 0.0

    def __post_init__(self):
        if number("opsd.loss.params.discount", self.discount, low=0.0) > 1:
            raise ValueError(f"opsd.loss.params.discount must be in [0, 1]; got {self.discount!r}")


@register_objective
class SampledToken(Objective):
    name = "sampled_token"
    order = 1
    Params = SampledTokenParams
    supports_task_reward = True
    supports_sft = True
    uses_policy_gradient = True

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        cfg = self.loss_config
        response_mask_bR = batch.response_mask_bR
        student_logp_bR = self.student_log_probs_bR(batch)
        advantages_bR = sampled_token_advantages(
            teacher_log_probs_BT=scatter_rows(response_mask_bR, batch.signals["teacher_logp"].to(student_logp_bR.dtype)),
            old_log_probs_BT=self.old_log_probs_bR(batch, student_logp_bR), mask_BT=response_mask_bR,
            discount=self.params.discount,
        )
        if cfg.task_weight > 0:
            advantages_bR = mix_task_advantages(
                distill_advantages_BT=advantages_bR, task_advantages_B=batch.task_advantages_b.to(student_logp_bR.dtype),
                mask_BT=response_mask_bR, task_weight=cfg.task_weight,
            )
        loss, terms_bR, metrics_N = self.surrogate(batch, advantages_bR, student_logp_bR)
        return ObjectiveLoss(loss=loss, per_token_N=terms_bR[batch.loss_mask_bR], signals=batch.signals,
                             metrics_N={"opsd/pg_advantage": advantages_bR[response_mask_bR], **metrics_N})
