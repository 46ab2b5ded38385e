"""verl glue: the OPSD actor's loss function on one micro-batch (``opsd_loss``, set by ``recipe.opsd.worker``).

From the student's final hidden states at the response positions with the live lm_head weight (the engine's
forward, ``recipe.opsd.engine``) and the frozen teacher's with the teacher's lm_head it returns
sum_t w_t d_t (+ the SFT term) x dp_size: d_t the objective's per-position loss
(``recipe.opsd.core.objectives``), w_t its weight in the mini-batch loss under ``opsd.loss.loss_agg_mode``
(docs/core_math.md, "The loss": aggregation), x dp_size because FSDP averages gradients over dp ranks, so
the update does not depend on how the mini-batch is split. No formula lives here and no objective name is
branched on; the steps, alike for every objective: ``opsd_loss``.
"""

from __future__ import annotations

import torch

from recipe.opsd.core.losses import aggregation_weights
from recipe.opsd.core.objectives import ObjectiveBatch
from recipe.opsd.core.objectives.base import scatter_rows
from recipe.opsd.core.objectives.terms import sampled_token_log_probs_from_hidden, sft_nll_terms, weighted_sum
from recipe.opsd.core.positions import select_positions
from recipe.opsd.core.signals import student_entropy_from_hidden, token_signals_from_hidden

# non-tensor keys the engine sets per mini-batch (recipe.opsd.engine.OPSDEngineMixin): response
# tokens and rollouts with at least one loss position, over the whole mini-batch (all dp ranks)
RESPONSE_TOKENS_KEY = "opsd_response_tokens"
LOSS_SEQUENCES_KEY = "opsd_loss_sequences"
# tensor [B] the trainer adds when opsd.loss.task_weight > 0: each response's GRPO advantage
TASK_ADVANTAGES_KEY = "opsd_task_advantages"
# tensor [B, R] the trainer adds when the surrogate's pS_old must be the behaviour policy's
# (objectives.needs_behaviour_log_probs): the rollout's log-probs of its sampled tokens
OLD_LOG_PROBS_KEY = "opsd_old_log_probs"
# the objective's per-step values (objective.step_values) travel as non-tensors <prefix><name>
STEP_VALUE_PREFIX = "opsd_step_"
# opsd.loss.sft_weight > 0: the SFT rows travel with the actor batch as <prefix><field> tensors
# (recipe.opsd.core.inputs.SFTInputs: student prompt left-padded, solution + EOS right-padded as the
# "response"); the engine sets the mini-batch's solution tokens (all dp ranks) as a non-tensor
SFT_INPUT_PREFIX = "opsd_sft_"
SFT_INPUT_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
SFT_TOKENS_KEY = "opsd_sft_tokens"

# signals.token_signals_from_hidden key -> logged metric name
SIGNAL_METRICS = {
    "fwd_kl": "opsd/fwd_kl",
    "clip_frac": "opsd/clip_frac",
    "clipped_teacher_mass": "opsd/clipped_teacher_mass",
    "student_entropy": "opsd/student_entropy",
    "teacher_entropy": "opsd/teacher_entropy",
    "top1_agree": "opsd/top1_agree",
}


def _loss_mask(loss_config, data, response_mask_bR, student_entropy_N):
    loss_mask_bR = data["loss_mask"].bool().to(response_mask_bR.device)
    if loss_config.position_kind not in ("he", "le"):
        return loss_mask_bR
    selected_bR = select_positions(
        loss_config.positions,
        response_mask_BT=response_mask_bR,
        entropy_BT=scatter_rows(response_mask_bR, student_entropy_N),
    )
    if not torch.equal(selected_bR.sum(1), loss_mask_bR.sum(1)):
        raise ValueError(
            f"opsd.loss.positions={loss_config.positions!r}: the trainer's loss_mask keeps "
            f"{loss_mask_bR.sum(1).tolist()} positions per completion, the entropy selection "
            f"{selected_bR.sum(1).tolist()}; the trainer must pass the same per-completion counts"
        )
    return selected_bR


def _sft_term(model_output, data, weight_VH, bias_V, *, chunk_size: int, dp_size: int):
    """(sum of the SFT NLL terms x dp_size / solution tokens of the mini-batch, the per-token NLL [N])."""
    hidden_bSH = model_output["sft_hidden"]
    mask_bS = data[SFT_INPUT_PREFIX + "response_mask"].bool().to(hidden_bSH.device)
    solution_N = data[SFT_INPUT_PREFIX + "responses"].to(hidden_bSH.device).long()[mask_bS]
    log_probs_N = sampled_token_log_probs_from_hidden(
        hidden_bSH[mask_bS], weight_VH, solution_N, bias=bias_V, temperature=1.0, chunk_size=chunk_size
    )
    nll_N = sft_nll_terms(solution_log_probs_N=log_probs_N)
    weights_N = torch.full_like(nll_N, dp_size / max(int(data[SFT_TOKENS_KEY]), 1))
    return weighted_sum(nll_N, weights=weights_N), nll_N


def loss_heads(model_output, *, teacher_weight_VH):
    """(student hidden [b, R, H], student lm_head weight [V, H] and bias [V] | None, teacher weight [V, H]
    and bias [V] | None) of a loss forward's output, all in the hidden states' dtype, as the model's own
    (autocast) lm_head would run. ``teacher_weight_VH`` None (LoRA / live): the student's head, detached."""
    hidden_bRH = model_output["student_hidden"]
    dtype = hidden_bRH.dtype
    student_weight_VH = model_output["student_weight"].to(dtype)
    student_bias_V = model_output.get("student_bias")
    student_bias_V = None if student_bias_V is None else student_bias_V.to(dtype)
    live = teacher_weight_VH is None
    teacher_weight = (student_weight_VH.detach() if live else teacher_weight_VH).to(dtype)
    teacher_bias = student_bias_V.detach() if live and student_bias_V is not None else None
    return hidden_bRH, student_weight_VH, student_bias_V, teacher_weight, teacher_bias


def opsd_loss(model_output, data, dp_group=None, *, loss_config, objective=None, teacher_weight_VH=None):
    """verl loss function: the objective's loss (+ the SFT term) on the loss positions of one micro-batch.

    model_output: ``student_hidden`` [b, R, H] (grad), ``student_weight`` [V, H] (grad),
        ``student_bias`` [V] or None; with an SFT weight ``sft_hidden`` [b, S, H] (grad).
    data: ``teacher_hidden`` [b, R, H], ``loss_mask`` [b, R] (loss positions; he/le: only their
        per-completion count), ``response_mask`` [b, R], ``responses`` [b, R]; non-tensors
        ``batch_num_tokens`` (loss positions in the mini-batch over all dp ranks), ``dp_size``,
        ``opsd_response_tokens``, ``opsd_loss_sequences``; what the objective asks for
        (``reference_hidden`` [b, R, H], ``opsd_step_<name>``), ``opsd_task_advantages`` [b] with a
        task weight, ``opsd_old_log_probs`` [b, R] when pS_old is the rollout's, ``opsd_sft_responses`` / ``opsd_sft_response_mask`` [b, S] and
        ``opsd_sft_tokens`` with an SFT weight.
    loss_config: ``recipe.opsd.core.config.LossConfig``; objective: its built objective (default: built here).
    teacher_weight_VH: the teacher's lm_head; None = the live one, detached (LoRA / kind live).

    Returns sum over the micro-batch's loss positions of w_t d_t (+ the SFT term), x dp_size, with w_t
    from ``losses.aggregation_weights`` (verl's mode names; default ``seq-mean-token-mean``, the paper's
    per-rollout average) and the mini-batch's global counts of loss positions and rollouts (all dp ranks;
    verl supplies ``batch_num_tokens``, the engine ``opsd_loss_sequences``). The steps, for every objective
    alike:

    1. the token diagnostics (``signals``): from the objective's own vocabulary pass when it has one
       (``objective.signals_in_loss_pass()``), else from a no-grad pass first
       (``signals.token_signals_from_hidden``), which the objective then reads (e.g. ``teacher_logp``);
    2. the loss positions: the trainer's ``loss_mask``; entropy positions (``he:Q`` / ``le:Q``) are
       ranked here by the student entropy at ``student_temperature`` (the distribution the student
       samples from) -- the completions of a micro-batch are whole, so the per-completion selection is
       exact; the trainer's mask only carries how many positions each completion keeps (ceil(Q x
       length)) so that verl's counts are right, and the counts are checked to agree;
    3. the objective's loss on an ``ObjectiveBatch``;
    4. ``opsd.loss.sft_weight`` > 0: + sft_weight x the SFT term, the student's NLL of each row's
       reference solution + EOS given its student prompt, at temperature 1, from ``sft_hidden`` -- the
       final hidden states of a second student forward on the ``opsd_sft_*`` rows that the engine runs
       before this one -- weighted dp_size / (solution tokens of the mini-batch, all ranks:
       ``opsd_sft_tokens``), its own count. One backward covers both forwards;
    5. the metrics: exact token means over the mini-batch's response tokens (all ranks), no sampling.
    """
    from verl.utils.metric import AggregationType, Metric

    objective = objective or loss_config.build_objective()
    student_hidden_bRH, student_weight_VH, student_bias_V, teacher_weight, teacher_bias = loss_heads(
        model_output, teacher_weight_VH=teacher_weight_VH)
    dtype, device = student_hidden_bRH.dtype, student_hidden_bRH.device
    teacher_hidden_bRH = data["teacher_hidden"].to(device=device, dtype=dtype)
    response_mask_bR = data["response_mask"].bool().to(device)
    responses_bR = data["responses"].to(device).long()
    dp_size = int(data["dp_size"])
    batch_num_tokens = int(data["batch_num_tokens"])
    response_tokens = int(data[RESPONSE_TOKENS_KEY])
    student_NH = student_hidden_bRH[response_mask_bR]  # every response row (the diagnostics' rows)
    teacher_NH = teacher_hidden_bRH[response_mask_bR]
    sampled_N = responses_bR[response_mask_bR]

    signals = None
    if objective.signals_in_loss_pass():
        student_entropy_N = None
        if loss_config.position_kind in ("he", "le"):  # one student-only projection before the loss pass
            student_entropy_N = student_entropy_from_hidden(
                student_NH, student_weight_VH, bias=student_bias_V, temperature=loss_config.student_temperature,
                chunk_size=loss_config.chunk_size,
            )
    else:
        with torch.no_grad():
            signals = token_signals_from_hidden(
                student_NH.detach(), student_weight_VH.detach(), teacher_NH, teacher_weight, sampled_N,
                student_bias=None if student_bias_V is None else student_bias_V.detach(), teacher_bias=teacher_bias,
                clip_tau=loss_config.clip_tau, chunk_size=loss_config.chunk_size,
                student_temperature=loss_config.student_temperature,
                teacher_temperature=loss_config.effective_teacher_temperature,
            )
        student_entropy_N = signals["student_entropy"]
    loss_mask_bR = _loss_mask(loss_config, data, response_mask_bR, student_entropy_N)
    # each loss position's weight in the mini-batch loss, x dp_size (FSDP averages over ranks)
    weight_bR = aggregation_weights(
        loss_mask_bR, mode=loss_config.loss_agg_mode, global_tokens=batch_num_tokens,
        global_sequences=int(data[LOSS_SEQUENCES_KEY]), horizon=response_mask_bR.shape[-1],
    ).mul_(dp_size)
    reference = data["reference_hidden"].to(device=device, dtype=dtype) if objective.needs_reference_forward else None
    task_advantages_b = data[TASK_ADVANTAGES_KEY].to(device) if objective.uses_task_reward() else None
    step_values = {name: float(data[STEP_VALUE_PREFIX + name]) for name in objective.step_value_names}
    old_log_probs_bR = data[OLD_LOG_PROBS_KEY].to(device) if OLD_LOG_PROBS_KEY in data.keys() else None
    out = objective.loss(ObjectiveBatch(
        student_hidden_bRH=student_hidden_bRH, student_weight_VH=student_weight_VH, student_bias_V=student_bias_V,
        teacher_hidden_bRH=teacher_hidden_bRH, teacher_weight_VH=teacher_weight, teacher_bias_V=teacher_bias,
        student_NH=student_NH, teacher_NH=teacher_NH, sampled_N=sampled_N, response_mask_bR=response_mask_bR,
        loss_mask_bR=loss_mask_bR, weight_bR=weight_bR, signals=signals, reference_hidden_bRH=reference,
        task_advantages_b=task_advantages_b, step_values=step_values, old_log_probs_bR=old_log_probs_bR,
    ))
    loss, signals = out.loss, out.signals
    sft_nll_N = None
    if loss_config.sft_weight > 0:  # + sft_weight x the NLL of the reference solutions (its own token count)
        sft, sft_nll_N = _sft_term(model_output, data, student_weight_VH, student_bias_V,
                                   chunk_size=loss_config.chunk_size, dp_size=dp_size)
        loss = loss + loss_config.sft_weight * sft

    with torch.no_grad():
        scale = dp_size / max(response_tokens, 1)
        metrics = {
            name: Metric(AggregationType.SUM, float(signals[key].double().sum()) * scale)
            for key, name in SIGNAL_METRICS.items()
        }
        for name, values_N in out.metrics_N.items():
            metrics[name] = Metric(AggregationType.SUM, float(values_N.double().sum()) * scale)
        for name, value in out.metrics.items():  # a term's micro-batch share (summed: the term)
            metrics[name] = Metric(AggregationType.SUM, float(value))
        if sft_nll_N is not None:
            # the SFT term before its weight (token mean of the solutions' NLL) and its token count, summed over
            # micro-batches and ranks; the rows cut to opsd.loss.sft_max_length are counted by the trainer
            sft_scale = dp_size / max(int(data[SFT_TOKENS_KEY]), 1)
            metrics["opsd/sft_nll"] = Metric(AggregationType.SUM, float(sft_nll_N.detach().double().sum()) * sft_scale)
            metrics["opsd/sft_tokens"] = Metric(AggregationType.SUM, float(sft_nll_N.numel()) * dp_size)
        # the optimised loss itself (its micro-batch share; = actor/loss)
        metrics["opsd/loss"] = Metric(AggregationType.SUM, float(loss.detach()))
        # token mean of the per-position loss over the loss positions (whatever loss_agg_mode)
        selected_scale = dp_size / max(batch_num_tokens, 1)
        metrics["opsd/loss_token_mean"] = Metric(
            AggregationType.SUM, float(out.per_token_N.detach().double().sum()) * selected_scale
        )
        metrics["opsd/loss_tokens"] = Metric(AggregationType.SUM, float(loss_mask_bR.sum()) * dp_size)
        # share of loss positions where the sampled token's advantage log pT(y) - log pS(y) is
        # positive (encouraged) / negative (discouraged)
        adv_N = signals["adv"][loss_mask_bR[response_mask_bR]]
        metrics["opsd/enc_frac"] = Metric(AggregationType.SUM, float((adv_N > 0).sum()) * selected_scale)
        metrics["opsd/disc_frac"] = Metric(AggregationType.SUM, float((adv_N < 0).sum()) * selected_scale)
    return loss, metrics
