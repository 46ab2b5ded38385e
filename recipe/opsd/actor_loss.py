"""Glue between verl's micro-batches and the pure OPSD loss functions.

``opsd_loss`` is the verl loss function of the OPSD actor (set by
``recipe.opsd.teacher_worker.OPSDActorRolloutRefWorker``). Per micro-batch it takes the student's
final hidden states at the response positions with the live lm_head weight (from the engine's
forward), the frozen teacher's hidden states with the frozen initial lm_head, and returns

    sum over the micro-batch's selected positions of d_t / (selected positions in the mini-batch,
    all dp ranks) * dp_size

where d_t is, by ``opsd.loss.variant``:

- ``opsd``: ``losses.fused_linear_weighted_divergence`` with the token-mean weights (the one formula, eq. "opsd_clipped" of the
  paper: per-vocabulary-entry clipped divergence summed over the vocabulary; fused, O(chunk x V));
- ``purified``: ``variants.purified_token_loss_from_hidden`` against the PMI target built from the
  privileged teacher and the reference-only teacher (``reference_hidden``, a second teacher
  forward); logits formed per row chunk under activation checkpointing (recomputed in backward),
  so memory is O(chunk x V) but larger than the fused path: ~13 float32 [chunk, V] blocks at peak
  against ~3.5 (measured on CPU, V = 151,936: 1.1 GB at chunk_size 128, independent of N; lower
  opsd.loss.chunk_size for this variant on GPU);
- ``beta_opsd``: ``variants.beta_opsd_sampled_loss`` with the sampled tokens' student log-probs
  (``variants.sampled_token_log_probs_from_hidden``, chunked and checkpointed the same way, ~2
  [chunk, V] blocks at peak), the teacher's from the diagnostics pass, the step's teacher weight
  (``opsd_teacher_weight``, set by the trainer from ``variants.teacher_weight_schedule``) and the
  return-to-go over every response token (the surrogate is then averaged over the loss positions).

FSDP averages gradients over dp ranks, so the update is the global token mean over the mini-batch
and does not depend on how it is split into micro-batches or ranks. Token-level diagnostics
(``signals.token_signals_from_hidden``, no grad) are reported as exact mini-batch token means.

Entropy positions (``he:Q`` / ``le:Q``) are selected here, from the student entropy of the
diagnostics pass (at ``student_temperature``, the distribution the student samples from): no
extra forward. The completions of a micro-batch are whole, so the per-completion selection of
``positions.entropy_fraction`` is exact; with the recipe's one update per batch
(ppo_mini_batch_size = train_batch_size, ppo_epochs = 1) the student here has the rollout
policy's weights. The trainer's ``loss_mask`` then only carries how many positions each
completion keeps (ceil(Q x length), which does not depend on the entropies) so that verl's
mini-batch token count is right; the counts are checked to agree.

No formula lives here: only indexing, masking and metric bookkeeping.
"""

from __future__ import annotations

import torch

from recipe.opsd.losses import fused_linear_weighted_divergence, global_token_row_weights, global_token_sum_mean
from recipe.opsd.positions import parse_position_spec, select_positions
from recipe.opsd.signals import token_signals_from_hidden
from recipe.opsd.variants import (
    beta_opsd_sampled_loss,
    purified_token_loss_from_hidden,
    sampled_token_log_probs_from_hidden,
    variant_params,
)

TEACHER_WEIGHT_KEY = "opsd_teacher_weight"

# signals.token_signals_from_hidden key -> logged metric name
SIGNAL_METRICS = {
    "fwd_kl": "opsd/fwd_kl",
    "clip_frac": "opsd/clip_frac",
    "clipped_teacher_mass": "opsd/clipped_teacher_mass",
    "student_entropy": "opsd/student_entropy",
    "teacher_entropy": "opsd/teacher_entropy",
    "top1_agree": "opsd/top1_agree",
}


def _scatter(mask_bR: torch.Tensor, values_N: torch.Tensor) -> torch.Tensor:
    """[b, R] tensor with ``values_N`` at the true entries of ``mask_bR`` (row-major), 0 elsewhere."""
    out = torch.zeros(mask_bR.shape, dtype=values_N.dtype, device=values_N.device)
    return out.masked_scatter(mask_bR, values_N)


def _loss_mask(loss_config, data, response_mask_bR, student_entropy_N):
    loss_mask_bR = data["loss_mask"].bool().to(response_mask_bR.device)
    kind = parse_position_spec(str(loss_config.positions)).kind
    if kind not in ("he", "le"):
        return loss_mask_bR
    selected_bR = select_positions(
        loss_config.positions,
        response_mask_BT=response_mask_bR,
        entropy_BT=_scatter(response_mask_bR, student_entropy_N),
    )
    if not torch.equal(selected_bR.sum(1), loss_mask_bR.sum(1)):
        raise ValueError(
            f"opsd.loss.positions={loss_config.positions!r}: the trainer's loss_mask keeps "
            f"{loss_mask_bR.sum(1).tolist()} positions per completion, the entropy selection "
            f"{selected_bR.sum(1).tolist()}; the trainer must pass the same per-completion counts"
        )
    return selected_bR


def opsd_loss(model_output, data, dp_group=None, *, loss_config, teacher_weight_VH=None):
    """verl loss function: OPSD divergence (or a variant's loss) on the selected positions of one micro-batch.

    model_output: ``student_hidden`` [b, R, H] (grad), ``student_weight`` [V, H] (grad),
        ``student_bias`` [V] or None.
    data: ``teacher_hidden`` [b, R, H], ``loss_mask`` [b, R] (selected positions; he/le: only
        their per-completion count), ``response_mask`` [b, R], ``responses`` [b, R]; purified:
        ``reference_hidden`` [b, R, H]; non-tensors ``batch_num_tokens`` (selected positions in the
        mini-batch over all dp ranks), ``dp_size``, ``opsd_response_tokens``; beta_opsd:
        ``opsd_teacher_weight``.
    teacher_weight_VH: frozen initial lm_head; None = the live one, detached (LoRA mode).
    """
    from verl.utils.metric import AggregationType, Metric

    # the lm_head runs in the dtype of the hidden states, as the model's own (autocast) lm_head would
    student_hidden_bRH = model_output["student_hidden"]
    dtype = student_hidden_bRH.dtype
    device = student_hidden_bRH.device
    student_weight_VH = model_output["student_weight"].to(dtype)
    student_bias_V = model_output.get("student_bias")
    student_bias_V = None if student_bias_V is None else student_bias_V.to(dtype)
    live = teacher_weight_VH is None
    teacher_weight = (student_weight_VH.detach() if live else teacher_weight_VH).to(dtype)
    teacher_bias = student_bias_V.detach() if live and student_bias_V is not None else None
    teacher_hidden_bRH = data["teacher_hidden"].to(device=device, dtype=dtype)
    response_mask_bR = data["response_mask"].bool().to(device)
    responses_bR = data["responses"].to(device).long()
    dp_size = int(data["dp_size"])
    batch_num_tokens = int(data["batch_num_tokens"])
    response_tokens = int(data["opsd_response_tokens"])
    student_temperature = loss_config.student_temperature
    teacher_temperature = loss_config.effective_teacher_temperature

    with torch.no_grad():
        signals = token_signals_from_hidden(
            student_hidden_bRH[response_mask_bR].detach(),
            student_weight_VH.detach(),
            teacher_hidden_bRH[response_mask_bR],
            teacher_weight,
            responses_bR[response_mask_bR],
            student_bias=None if student_bias_V is None else student_bias_V.detach(),
            teacher_bias=teacher_bias,
            student_temperature=student_temperature,
            teacher_temperature=teacher_temperature,
            clip_tau=loss_config.clip_tau,
            chunk_size=loss_config.chunk_size,
        )
    loss_mask_bR = _loss_mask(loss_config, data, response_mask_bR, signals["student_entropy"])

    extra = {}
    loss = None
    if loss_config.variant == "opsd":
        # global token mean over the mini-batch, x dp_size because FSDP averages gradients over
        # ranks; the weights are known now, so the fused loss forms its gradients in one pass
        weights_N = global_token_row_weights(
            int(loss_mask_bR.sum()), global_token_count=batch_num_tokens, dtype=torch.float64, device=device
        ).mul_(dp_size)
        loss, per_token_N = fused_linear_weighted_divergence(
            student_hidden_bRH[loss_mask_bR],
            student_weight_VH,
            teacher_hidden_bRH[loss_mask_bR],
            teacher_weight,
            row_weights_N=weights_N,
            student_bias=student_bias_V,
            teacher_bias=teacher_bias,
            beta=loss_config.beta,
            clip_tau=loss_config.clip_tau,
            student_temperature=student_temperature,
            teacher_temperature=teacher_temperature,
            topk=loss_config.topk,
            chunk_size=loss_config.chunk_size,
        )
    elif loss_config.variant == "purified":
        params = variant_params("purified", loss_config.variant_params)
        reference_hidden_bRH = data["reference_hidden"].to(device=device, dtype=dtype)
        per_token_N = purified_token_loss_from_hidden(
            student_hidden_bRH[loss_mask_bR],
            student_weight_VH,
            teacher_hidden_bRH[loss_mask_bR],
            teacher_weight,
            reference_hidden_bRH[loss_mask_bR],
            student_bias=student_bias_V,
            teacher_bias=teacher_bias,
            beta=loss_config.beta,
            clip_tau=loss_config.clip_tau,
            student_temperature=student_temperature,
            teacher_temperature=teacher_temperature,
            pmi_strength=params.pmi_strength,
            pmi_clip=params.pmi_clip,
            chunk_size=loss_config.chunk_size,
        )
        values_bR = _scatter(loss_mask_bR, per_token_N)
    elif loss_config.variant == "beta_opsd":
        params = variant_params("beta_opsd", loss_config.variant_params)
        # the return-to-go runs over every response token; the surrogate is averaged over the loss positions
        student_logp_N = sampled_token_log_probs_from_hidden(
            student_hidden_bRH[response_mask_bR],
            student_weight_VH,
            responses_bR[response_mask_bR],
            bias=student_bias_V,
            temperature=student_temperature,
            chunk_size=loss_config.chunk_size,
        )
        out = beta_opsd_sampled_loss(
            _scatter(response_mask_bR, student_logp_N),
            _scatter(response_mask_bR, signals["teacher_logp"].to(student_logp_N.dtype)),
            response_mask_bR,
            teacher_weight=float(data[TEACHER_WEIGHT_KEY]),
            discount=params.discount,
        )
        values_bR = out.loss_BT
        per_token_N = values_bR[loss_mask_bR]
        extra = {"opsd/beta_reward": out.reward_BT[response_mask_bR], "opsd/beta_return": out.return_BT[response_mask_bR]}
    else:  # guarded by OPSDLossConfig
        raise ValueError(f"opsd.loss.variant must be one of opsd | purified | beta_opsd, got {loss_config.variant!r}")

    if loss is None:  # global token mean over the mini-batch; x dp_size because FSDP averages gradients over ranks
        loss = global_token_sum_mean(values_bR, loss_mask_bR, global_token_count=max(batch_num_tokens, 1)) * dp_size

    with torch.no_grad():
        scale = dp_size / max(response_tokens, 1)
        metrics = {
            name: Metric(AggregationType.SUM, float(signals[key].double().sum()) * scale)
            for key, name in SIGNAL_METRICS.items()
        }
        for name, values_N in extra.items():
            metrics[name] = Metric(AggregationType.SUM, float(values_N.double().sum()) * scale)
        selected_scale = dp_size / max(batch_num_tokens, 1)
        metrics["opsd/loss"] = Metric(AggregationType.SUM, float(per_token_N.detach().double().sum()) * selected_scale)
        metrics["opsd/loss_tokens"] = Metric(AggregationType.SUM, float(loss_mask_bR.sum()) * dp_size)
        # share of selected positions where the sampled token's advantage log pT(y) - log pS(y) is
        # positive (encouraged) / negative (discouraged)
        adv_N = signals["adv"][loss_mask_bR[response_mask_bR]]
        metrics["opsd/enc_frac"] = Metric(AggregationType.SUM, float((adv_N > 0).sum()) * selected_scale)
        metrics["opsd/disc_frac"] = Metric(AggregationType.SUM, float((adv_N < 0).sum()) * selected_scale)
    return loss, metrics
