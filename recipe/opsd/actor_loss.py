"""Glue between verl's micro-batches and the pure OPSD loss functions.

``opsd_loss`` is the verl loss function of the OPSD actor (set by
``recipe.opsd.teacher_worker.OPSDActorRolloutRefWorker``). Per micro-batch it takes the student's
final hidden states at the response positions with the live lm_head weight (from the engine's
forward), the frozen teacher's hidden states with the frozen initial lm_head, and returns

    sum over the micro-batch's selected positions of d_t / (selected positions in the mini-batch,
    all dp ranks) * dp_size

where d_t = ``losses.fused_linear_token_divergence`` (the one formula, eq. "opsd_clipped" of the
paper: per-vocabulary-entry clipped divergence summed over the vocabulary). FSDP averages
gradients over dp ranks, so the update is the global token mean over the mini-batch and does not
depend on how it is split into micro-batches or ranks. Token-level diagnostics
(``signals.token_signals_from_hidden``, no grad) are reported as exact mini-batch token means.

No formula lives here: only indexing, masking and metric bookkeeping.
"""

from __future__ import annotations

import torch

from recipe.opsd.losses import fused_linear_token_divergence, global_token_sum_mean
from recipe.opsd.signals import token_signals_from_hidden

# signals.token_signals_from_hidden key -> logged metric name
SIGNAL_METRICS = {
    "fwd_kl": "opsd/fwd_kl",
    "clip_frac": "opsd/clip_frac",
    "clipped_teacher_mass": "opsd/clipped_teacher_mass",
    "student_entropy": "opsd/student_entropy",
    "teacher_entropy": "opsd/teacher_entropy",
    "top1_agree": "opsd/top1_agree",
}


def response_rows(*, starts_b, seq_lens_b, response_lens_b, max_response_len: int):
    """Flat row indices of the hidden states that predict each response token.

    Sequence i occupies rows ``starts_b[i] .. starts_b[i] + seq_lens_b[i] - 1`` (prompt then
    response, no pad in between); its response is the last ``response_lens_b[i]`` tokens, and
    response token j is predicted by the hidden state one row before it. Returns
    ``(rows_bR, valid_bR)``; invalid entries point at row ``starts_b[i]`` and must be masked.
    """
    starts_b = starts_b.long()
    seq_lens_b = seq_lens_b.long().to(starts_b.device)
    response_lens_b = response_lens_b.long().to(starts_b.device)
    if bool((response_lens_b > seq_lens_b - 1).any()):
        raise ValueError(
            f"response longer than the sequence minus one prompt token: responses {response_lens_b.tolist()}, "
            f"sequences {seq_lens_b.tolist()}"
        )
    j_R = torch.arange(max_response_len, device=starts_b.device)
    first_b = starts_b + seq_lens_b - response_lens_b - 1
    valid_bR = j_R.unsqueeze(0) < response_lens_b.unsqueeze(1)
    rows_bR = torch.where(valid_bR, first_b.unsqueeze(1) + j_R.unsqueeze(0), starts_b.unsqueeze(1))
    return rows_bR, valid_bR


def opsd_loss(model_output, data, dp_group=None, *, loss_config, teacher_weight_VH=None):
    """verl loss function: OPSD divergence on the selected positions of one micro-batch.

    model_output: ``student_hidden`` [b, R, H] (grad), ``student_weight`` [V, H] (grad),
        ``student_bias`` [V] or None.
    data: ``teacher_hidden`` [b, R, H], ``loss_mask`` [b, R] (selected positions),
        ``response_mask`` [b, R], ``responses`` [b, R]; non-tensors ``batch_num_tokens`` (selected
        positions in the mini-batch over all dp ranks), ``dp_size``, ``opsd_response_tokens``.
    teacher_weight_VH: frozen initial lm_head; None = the live one, detached (LoRA mode).
    """
    if loss_config.variant != "opsd":
        raise NotImplementedError(
            f"opsd.loss.variant={loss_config.variant!r} is not wired into the actor yet; use variant=opsd"
        )
    from verl.utils.metric import AggregationType, Metric

    # the lm_head runs in the dtype of the hidden states, as the model's own (autocast) lm_head would
    student_hidden_bRH = model_output["student_hidden"]
    dtype = student_hidden_bRH.dtype
    student_weight_VH = model_output["student_weight"].to(dtype)
    student_bias_V = model_output.get("student_bias")
    student_bias_V = None if student_bias_V is None else student_bias_V.to(dtype)
    live = teacher_weight_VH is None
    teacher_weight = (student_weight_VH.detach() if live else teacher_weight_VH).to(dtype)
    teacher_bias = student_bias_V.detach() if live and student_bias_V is not None else None
    teacher_hidden_bRH = data["teacher_hidden"].to(device=student_hidden_bRH.device, dtype=dtype)
    loss_mask_bR = data["loss_mask"].bool()
    response_mask_bR = data["response_mask"].bool()
    dp_size = int(data["dp_size"])
    batch_num_tokens = int(data["batch_num_tokens"])
    response_tokens = int(data["opsd_response_tokens"])

    options = dict(
        beta=loss_config.beta,
        clip_tau=loss_config.clip_tau,
        student_temperature=loss_config.student_temperature,
        teacher_temperature=loss_config.effective_teacher_temperature,
        topk=loss_config.topk,
        chunk_size=loss_config.chunk_size,
    )
    per_token_N = fused_linear_token_divergence(
        student_hidden_bRH[loss_mask_bR],
        student_weight_VH,
        teacher_hidden_bRH[loss_mask_bR],
        teacher_weight,
        student_bias=student_bias_V,
        teacher_bias=teacher_bias,
        **options,
    )
    values_bR = torch.zeros(loss_mask_bR.shape, dtype=per_token_N.dtype, device=per_token_N.device)
    values_bR = values_bR.masked_scatter(loss_mask_bR, per_token_N)
    # global token mean over the mini-batch; x dp_size because FSDP averages gradients over ranks
    loss = global_token_sum_mean(values_bR, loss_mask_bR, global_token_count=max(batch_num_tokens, 1)) * dp_size

    with torch.no_grad():
        signals = token_signals_from_hidden(
            student_hidden_bRH[response_mask_bR].detach(),
            student_weight_VH.detach(),
            teacher_hidden_bRH[response_mask_bR],
            teacher_weight,
            data["responses"][response_mask_bR].long(),
            student_bias=None if student_bias_V is None else student_bias_V.detach(),
            teacher_bias=teacher_bias,
            student_temperature=loss_config.student_temperature,
            teacher_temperature=loss_config.effective_teacher_temperature,
            clip_tau=loss_config.clip_tau,
            chunk_size=loss_config.chunk_size,
        )
        scale = dp_size / max(response_tokens, 1)
        metrics = {
            name: Metric(AggregationType.SUM, float(signals[key].double().sum()) * scale)
            for key, name in SIGNAL_METRICS.items()
        }
        selected_scale = dp_size / max(batch_num_tokens, 1)
        metrics["opsd/loss"] = Metric(AggregationType.SUM, float(per_token_N.detach().double().sum()) * selected_scale)
        metrics["opsd/loss_tokens"] = Metric(AggregationType.SUM, float(loss_mask_bR.sum()) * dp_size)
        # share of selected positions where the sampled token's advantage log pT(y) - log pS(y) is
        # positive (encouraged) / negative (discouraged)
        adv_N = signals["adv"][loss_mask_bR[response_mask_bR]]
        metrics["opsd/enc_frac"] = Metric(AggregationType.SUM, float((adv_N > 0).sum()) * selected_scale)
        metrics["opsd/disc_frac"] = Metric(AggregationType.SUM, float((adv_N < 0).sum()) * selected_scale)
    return loss, metrics
