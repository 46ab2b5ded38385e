"""``divergence``: the paper's objective, the full-vocabulary clipped divergence D(pT, pS) of ``opsd.loss.beta``,
``clip_tau``, ``topk`` and ``loss_agg_mode`` (docs/core_math.md, "The loss").

Full vocabulary: ``signals.weighted_divergence_and_signals`` -- ``losses.fused_linear_weighted_divergence``
over every response row (weight 0 outside the loss positions), whose vocabulary pass also yields the
token diagnostics, so the lm_head is projected once per micro-batch. With ``topk`` the pass sees only
the top-k support, so the diagnostics come from the glue's separate full-vocabulary pass.
``opsd.loss.task_weight`` > 0 adds task_weight x the policy-gradient surrogate with A = the rollout's
GRPO advantage of the one grader's reward (docs/core_math.md, "Objectives", task reward).
"""

from __future__ import annotations

import torch

from recipe.opsd.core.losses import fused_linear_weighted_divergence
from recipe.opsd.core.objectives.base import Objective, ObjectiveBatch, ObjectiveLoss, register_objective
from recipe.opsd.core.objectives.terms import mix_task_advantages
from recipe.opsd.core.signals import weighted_divergence_and_signals


@register_objective
class Divergence(Objective):
    name = "divergence"
    order = 0
    supports_topk = True
    supports_task_reward = True
    supports_sft = True

    def signals_in_loss_pass(self) -> bool:
        return self.loss_config.topk is None

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        cfg = self.loss_config
        temperatures = dict(student_temperature=cfg.student_temperature,
                            teacher_temperature=cfg.effective_teacher_temperature)
        response_mask_bR, loss_mask_bR, weight_bR = batch.response_mask_bR, batch.loss_mask_bR, batch.weight_bR
        if cfg.topk is None:
            loss, values_N, signals = weighted_divergence_and_signals(
                batch.student_NH, batch.student_weight_VH, batch.teacher_NH, batch.teacher_weight_VH, batch.sampled_N,
                row_weights_N=weight_bR[response_mask_bR], student_bias=batch.student_bias_V,
                teacher_bias=batch.teacher_bias_V, beta=cfg.beta, clip_tau=cfg.clip_tau, chunk_size=cfg.chunk_size,
                **temperatures,
            )
            per_token_N = values_N[loss_mask_bR[response_mask_bR]]
        else:
            signals = batch.signals
            loss, per_token_N = fused_linear_weighted_divergence(
                batch.student_hidden_bRH[loss_mask_bR], batch.student_weight_VH, batch.teacher_hidden_bRH[loss_mask_bR],
                batch.teacher_weight_VH, row_weights_N=weight_bR[loss_mask_bR], student_bias=batch.student_bias_V,
                teacher_bias=batch.teacher_bias_V, beta=cfg.beta, clip_tau=cfg.clip_tau, topk=cfg.topk,
                chunk_size=cfg.chunk_size, **temperatures,
            )
        metrics = {}
        if cfg.task_weight > 0:  # + task_weight x PG(A = the GRPO advantage)
            student_logp_bR = self.student_log_probs_bR(batch)
            task_advantages_bR = mix_task_advantages(
                distill_advantages_BT=torch.zeros_like(student_logp_bR),
                task_advantages_B=batch.task_advantages_b.to(student_logp_bR.dtype),
                mask_BT=response_mask_bR, task_weight=1.0,
            )
            task, _, metrics_N = self.surrogate(batch, task_advantages_bR, student_logp_bR)
            metrics["opsd/task_pg_loss"] = task.detach()
            loss = loss + cfg.task_weight * task
        return ObjectiveLoss(loss=loss, per_token_N=per_token_N, signals=signals, metrics=metrics,
                             metrics_N=metrics_N if cfg.task_weight > 0 else {})
