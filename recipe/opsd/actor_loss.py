"""Glue between verl's micro-batches and the pure OPSD loss functions.

``opsd_loss`` is the verl loss function of the OPSD actor (set by
``recipe.opsd.teacher_worker.OPSDActorRolloutRefWorker``). Per micro-batch it takes the student's
final hidden states at the response positions with the live lm_head weight (from the engine's
forward), the frozen teacher's hidden states with the frozen initial lm_head, and returns

    sum over the micro-batch's loss positions of w_t d_t, x dp_size

where d_t is the position's loss and w_t its weight in the mini-batch loss under
``opsd.loss.loss_agg_mode`` (``losses.aggregation_weights``, verl's mode names; default
``seq-mean-token-mean``, the paper's per-rollout average), from the mini-batch's global counts of
loss positions and rollouts (all dp ranks; verl supplies ``batch_num_tokens``, the engine
``opsd_loss_sequences``). FSDP averages gradients over dp ranks, hence the x dp_size: the update
is the mini-batch loss and does not depend on how the mini-batch is split into micro-batches or
ranks. d_t is, by ``opsd.loss.variant``:

- ``opsd``: the per-position clipped divergence (eq. "opsd_clipped": per-vocabulary-entry
  contributions capped, then summed over the vocabulary), from
  ``signals.weighted_divergence_and_signals`` -- ``losses.fused_linear_weighted_divergence`` over
  every response row (weight 0 outside the loss positions), whose vocabulary pass also yields the
  token diagnostics, so the lm_head is projected once per micro-batch; with ``topk`` the pass sees
  only the top-k support, so the diagnostics take a separate full-vocabulary pass;
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
  return-to-go over every response token (the surrogate is then aggregated over the loss positions).
  The two variants take their diagnostics from a separate no-grad pass
  (``signals.token_signals_from_hidden``).

``objective`` (``objectives.ObjectiveWeights``, from ``opsd.objective``; None = the divergence
alone) changes d_t for ``variant: opsd``:

- ``sampled_token``: the per-token surrogate ``objectives.policy_gradient_terms`` with the advantage
  ``objectives.sampled_token_advantages`` (teacher log-prob of the sampled token from the
  diagnostics pass at the teacher temperature, minus the student's from a chunked, checkpointed
  pass at the student temperature, ``variants.sampled_token_log_probs_from_hidden``; pS_old = that
  pass detached: the rollout policy with the recipe's one update per batch), plus ``task_weight``
  x the response's GRPO advantage (``objectives.mix_task_advantages``; ``opsd_task_advantages``
  [b], set by the trainer from the grader);
- ``full_vocabulary`` with ``task_weight`` > 0: the divergence plus task_weight x the surrogate
  with A = the GRPO advantage (``objectives.objective_loss``).

Both surrogates are aggregated over the loss positions with the divergence's weights.

``sft_weight`` > 0 (either kind) adds sft_weight x the SFT term: the student's NLL of each row's
reference solution + EOS given its student prompt, at temperature 1 (``objectives.sft_nll_terms``
on ``variants.sampled_token_log_probs_from_hidden``), from ``sft_hidden`` [b, S, H] -- the final
hidden states of a second student forward on the ``opsd_sft_*`` rows that the engine runs before
this one (``teacher_worker.OPSDEngineMixin``) -- weighted dp_size / (solution tokens of the
mini-batch, all ranks: ``opsd_sft_tokens``), its own count, not the loss positions'. The terms are
summed by ``objectives.objective_loss`` into one loss, so one backward covers both forwards.

Token-level diagnostics are exact token means over the mini-batch's response tokens (all ranks):
no sampling.

Entropy positions (``he:Q`` / ``le:Q``) are selected here, from the student entropy at
``student_temperature`` (the distribution the student samples from; for ``opsd`` one student-only
projection before the loss pass, ``signals.student_entropy_from_hidden``). The completions of a
micro-batch are whole, so the per-completion selection of ``positions.entropy_fraction`` is exact;
with the recipe's one update per batch (ppo_mini_batch_size = train_batch_size, ppo_epochs = 1)
the student here has the rollout policy's weights. The trainer's ``loss_mask`` then only carries
how many positions each completion keeps (ceil(Q x length), which does not depend on the
entropies) so that verl's mini-batch counts are right; the counts are checked to agree.

No formula lives here: only indexing, masking and metric bookkeeping.
"""

from __future__ import annotations

import torch

from recipe.opsd.losses import aggregation_weights, fused_linear_weighted_divergence
from recipe.opsd.objectives import (
    ObjectiveWeights,
    mix_task_advantages,
    objective_loss,
    policy_gradient_terms,
    sampled_token_advantages,
    sft_nll_terms,
    weighted_sum,
)
from recipe.opsd.positions import parse_position_spec, select_positions
from recipe.opsd.signals import student_entropy_from_hidden, token_signals_from_hidden, weighted_divergence_and_signals
from recipe.opsd.variants import (
    beta_opsd_sampled_loss,
    purified_token_loss_from_hidden,
    sampled_token_log_probs_from_hidden,
    variant_params,
)

TEACHER_WEIGHT_KEY = "opsd_teacher_weight"
# non-tensor keys the engine sets per mini-batch (recipe.opsd.teacher_worker.OPSDEngineMixin): response
# tokens and rollouts with at least one loss position, over the whole mini-batch (all dp ranks)
RESPONSE_TOKENS_KEY = "opsd_response_tokens"
LOSS_SEQUENCES_KEY = "opsd_loss_sequences"
# tensor [B] the trainer adds when opsd.objective.task_weight > 0: each response's GRPO advantage
TASK_ADVANTAGES_KEY = "opsd_task_advantages"
# opsd.objective.sft_weight > 0: the SFT rows travel with the actor batch as <prefix><field> tensors
# (recipe.opsd.sft_inputs: student prompt left-padded, solution + EOS right-padded as the "response");
# the engine sets the mini-batch's solution tokens (all dp ranks) as a non-tensor
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


def _surrogate(objective, advantages_bR, student_logp_bR, weight_bR):
    """(the surrogate's weighted sum, its per-token terms [b, R]); pS_old = pS_theta detached."""
    terms_bR = policy_gradient_terms(
        log_probs_BT=student_logp_bR, old_log_probs_BT=student_logp_bR.detach(), advantages_BT=advantages_bR,
        clip_ratio_low=objective.clip_ratio_low, clip_ratio_high=objective.clip_ratio_high,
    )
    return weighted_sum(terms_bR, weights=weight_bR.to(terms_bR.dtype)), terms_bR


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


def opsd_loss(model_output, data, dp_group=None, *, loss_config, teacher_weight_VH=None, objective=None):
    """verl loss function: OPSD divergence (or a variant's loss) on the loss positions of one micro-batch.

    model_output: ``student_hidden`` [b, R, H] (grad), ``student_weight`` [V, H] (grad),
        ``student_bias`` [V] or None.
    data: ``teacher_hidden`` [b, R, H], ``loss_mask`` [b, R] (loss positions; he/le: only
        their per-completion count), ``response_mask`` [b, R], ``responses`` [b, R]; purified:
        ``reference_hidden`` [b, R, H]; non-tensors ``batch_num_tokens`` (loss positions in the
        mini-batch over all dp ranks), ``dp_size``, ``opsd_response_tokens``, ``opsd_loss_sequences``;
        beta_opsd: ``opsd_teacher_weight``.
    teacher_weight_VH: frozen initial lm_head; None = the live one, detached (LoRA mode).
    objective: ``objectives.ObjectiveWeights`` (None = the divergence alone); a task weight needs
        ``opsd_task_advantages`` [b] in ``data``; an SFT weight needs ``sft_hidden`` [b, S, H] (grad) in
        ``model_output`` and ``opsd_sft_responses`` / ``opsd_sft_response_mask`` [b, S],
        ``opsd_sft_tokens`` in ``data``.
    """
    from verl.utils.metric import AggregationType, Metric

    student_hidden_bRH, student_weight_VH, student_bias_V, teacher_weight, teacher_bias = loss_heads(
        model_output, teacher_weight_VH=teacher_weight_VH)
    dtype, device = student_hidden_bRH.dtype, student_hidden_bRH.device
    teacher_hidden_bRH = data["teacher_hidden"].to(device=device, dtype=dtype)
    response_mask_bR = data["response_mask"].bool().to(device)
    responses_bR = data["responses"].to(device).long()
    dp_size = int(data["dp_size"])
    batch_num_tokens = int(data["batch_num_tokens"])
    response_tokens = int(data[RESPONSE_TOKENS_KEY])
    temperatures = dict(student_temperature=loss_config.student_temperature,
                        teacher_temperature=loss_config.effective_teacher_temperature)
    student_NH = student_hidden_bRH[response_mask_bR]  # every response row (the diagnostics' rows)
    teacher_NH = teacher_hidden_bRH[response_mask_bR]
    sampled_N = responses_bR[response_mask_bR]

    def weights(loss_mask_bR):
        """Each loss position's weight in the mini-batch loss, x dp_size (FSDP averages over ranks)."""
        return aggregation_weights(
            loss_mask_bR, mode=loss_config.loss_agg_mode, global_tokens=batch_num_tokens,
            global_sequences=int(data[LOSS_SEQUENCES_KEY]), horizon=response_mask_bR.shape[-1],
        ).mul_(dp_size)

    objective = objective or ObjectiveWeights()
    sampled = objective.objective == "sampled_token"
    if (objective.needs_policy_gradient or objective.needs_sft) and loss_config.variant != "opsd":  # guarded by OPSDConfig
        raise ValueError(f"opsd.objective {objective} needs opsd.loss.variant=opsd, got {loss_config.variant!r}")
    fused = loss_config.variant == "opsd" and loss_config.topk is None and not sampled
    if fused:
        student_entropy_N = None
        if parse_position_spec(str(loss_config.positions)).kind in ("he", "le"):
            student_entropy_N = student_entropy_from_hidden(
                student_NH, student_weight_VH, bias=student_bias_V, temperature=loss_config.student_temperature,
                chunk_size=loss_config.chunk_size,
            )
        loss_mask_bR = _loss_mask(loss_config, data, response_mask_bR, student_entropy_N)
        weight_bR = weights(loss_mask_bR)
        loss, values_N, signals = weighted_divergence_and_signals(
            student_NH, student_weight_VH, teacher_NH, teacher_weight, sampled_N,
            row_weights_N=weight_bR[response_mask_bR], student_bias=student_bias_V, teacher_bias=teacher_bias,
            beta=loss_config.beta, clip_tau=loss_config.clip_tau, chunk_size=loss_config.chunk_size, **temperatures,
        )
        per_token_N = values_N[loss_mask_bR[response_mask_bR]]
    else:
        with torch.no_grad():
            signals = token_signals_from_hidden(
                student_NH.detach(), student_weight_VH.detach(), teacher_NH, teacher_weight, sampled_N,
                student_bias=None if student_bias_V is None else student_bias_V.detach(), teacher_bias=teacher_bias,
                clip_tau=loss_config.clip_tau, chunk_size=loss_config.chunk_size, **temperatures,
            )
        loss_mask_bR = _loss_mask(loss_config, data, response_mask_bR, signals["student_entropy"])
        weight_bR = weights(loss_mask_bR)
    extra, loss_terms = {}, {}
    student_logp_bR = None
    if objective.needs_policy_gradient:  # the sampled tokens' student log-probs, with grad
        student_logp_bR = _scatter(response_mask_bR, sampled_token_log_probs_from_hidden(
            student_NH, student_weight_VH, sampled_N, bias=student_bias_V,
            temperature=loss_config.student_temperature, chunk_size=loss_config.chunk_size,
        ))
    if objective.needs_task_reward:
        task_advantages_b = data[TASK_ADVANTAGES_KEY].to(device=device, dtype=student_logp_bR.dtype)
    if sampled:
        advantages_bR = sampled_token_advantages(
            teacher_log_probs_BT=_scatter(response_mask_bR, signals["teacher_logp"].to(student_logp_bR.dtype)),
            old_log_probs_BT=student_logp_bR.detach(), mask_BT=response_mask_bR, discount=objective.discount,
        )
        if objective.needs_task_reward:
            advantages_bR = mix_task_advantages(distill_advantages_BT=advantages_bR, task_advantages_B=task_advantages_b,
                                                mask_BT=response_mask_bR, task_weight=objective.task_weight)
        policy_gradient, terms_bR = _surrogate(objective, advantages_bR, student_logp_bR, weight_bR)
        terms = {"policy_gradient": policy_gradient}
        per_token_N = terms_bR[loss_mask_bR]
        extra = {"opsd/pg_advantage": advantages_bR[response_mask_bR]}
    elif loss_config.variant == "opsd" and not fused:  # top-k support
        loss, per_token_N = fused_linear_weighted_divergence(
            student_hidden_bRH[loss_mask_bR], student_weight_VH, teacher_hidden_bRH[loss_mask_bR], teacher_weight,
            row_weights_N=weight_bR[loss_mask_bR], student_bias=student_bias_V, teacher_bias=teacher_bias,
            beta=loss_config.beta, clip_tau=loss_config.clip_tau, topk=loss_config.topk,
            chunk_size=loss_config.chunk_size, **temperatures,
        )
    elif loss_config.variant == "purified":
        params = variant_params("purified", loss_config.variant_params)
        reference_hidden_bRH = data["reference_hidden"].to(device=device, dtype=dtype)
        per_token_N = purified_token_loss_from_hidden(
            student_hidden_bRH[loss_mask_bR], student_weight_VH, teacher_hidden_bRH[loss_mask_bR], teacher_weight,
            reference_hidden_bRH[loss_mask_bR], student_bias=student_bias_V, teacher_bias=teacher_bias,
            beta=loss_config.beta, clip_tau=loss_config.clip_tau, pmi_strength=params.pmi_strength,
            pmi_clip=params.pmi_clip, chunk_size=loss_config.chunk_size, **temperatures,
        )
        loss = (per_token_N * weight_bR[loss_mask_bR].to(per_token_N.dtype)).sum()
    elif loss_config.variant == "beta_opsd":
        params = variant_params("beta_opsd", loss_config.variant_params)
        # the return-to-go runs over every response token; the surrogate is aggregated over the loss positions
        student_logp_N = sampled_token_log_probs_from_hidden(
            student_NH, student_weight_VH, sampled_N, bias=student_bias_V,
            temperature=loss_config.student_temperature, chunk_size=loss_config.chunk_size,
        )
        out = beta_opsd_sampled_loss(
            _scatter(response_mask_bR, student_logp_N),
            _scatter(response_mask_bR, signals["teacher_logp"].to(student_logp_N.dtype)),
            response_mask_bR,
            teacher_weight=float(data[TEACHER_WEIGHT_KEY]),
            discount=params.discount,
        )
        per_token_N = out.loss_BT[loss_mask_bR]
        loss = (per_token_N * weight_bR[loss_mask_bR].to(per_token_N.dtype)).sum()
        extra = {"opsd/beta_reward": out.reward_BT[response_mask_bR], "opsd/beta_return": out.return_BT[response_mask_bR]}
    elif loss_config.variant != "opsd":  # guarded by OPSDLossConfig
        raise ValueError(f"opsd.loss.variant must be one of opsd | purified | beta_opsd, got {loss_config.variant!r}")
    if not sampled:
        terms = {"divergence": loss}
    if not sampled and objective.needs_task_reward:  # the divergence + task_weight x PG(A = GRPO advantage)
        task_advantages_bR = mix_task_advantages(
            distill_advantages_BT=torch.zeros_like(student_logp_bR), task_advantages_B=task_advantages_b,
            mask_BT=response_mask_bR, task_weight=1.0,
        )
        task_policy_gradient, _ = _surrogate(objective, task_advantages_bR, student_logp_bR, weight_bR)
        loss_terms["opsd/task_pg_loss"] = task_policy_gradient.detach()
        terms["task_policy_gradient"] = task_policy_gradient
    sft_nll_N = None
    if objective.needs_sft:  # + sft_weight x the NLL of the reference solutions (its own token count)
        terms["sft"], sft_nll_N = _sft_term(model_output, data, student_weight_VH, student_bias_V,
                                            chunk_size=loss_config.chunk_size, dp_size=dp_size)
    loss = objective_loss(objective, **terms)

    with torch.no_grad():
        scale = dp_size / max(response_tokens, 1)
        metrics = {
            name: Metric(AggregationType.SUM, float(signals[key].double().sum()) * scale)
            for key, name in SIGNAL_METRICS.items()
        }
        for name, values_N in extra.items():
            metrics[name] = Metric(AggregationType.SUM, float(values_N.double().sum()) * scale)
        for name, value in loss_terms.items():  # a term's micro-batch share (summed: the term)
            metrics[name] = Metric(AggregationType.SUM, float(value))
        if sft_nll_N is not None:
            # the SFT term before its weight (token mean of the solutions' NLL) and its token count, summed over
            # micro-batches and ranks; the rows cut to opsd.objective.sft_max_length are counted by the trainer
            sft_scale = dp_size / max(int(data[SFT_TOKENS_KEY]), 1)
            metrics["opsd/sft_nll"] = Metric(AggregationType.SUM, float(sft_nll_N.detach().double().sum()) * sft_scale)
            metrics["opsd/sft_tokens"] = Metric(AggregationType.SUM, float(sft_nll_N.numel()) * dp_size)
        # the optimised loss itself (its micro-batch share; = actor/loss)
        metrics["opsd/loss"] = Metric(AggregationType.SUM, float(loss.detach()))
        # token mean of the per-position loss over the loss positions (whatever loss_agg_mode)
        selected_scale = dp_size / max(batch_num_tokens, 1)
        metrics["opsd/loss_token_mean"] = Metric(
            AggregationType.SUM, float(per_token_N.detach().double().sum()) * selected_scale
        )
        metrics["opsd/loss_tokens"] = Metric(AggregationType.SUM, float(loss_mask_bR.sum()) * dp_size)
        # share of loss positions where the sampled token's advantage log pT(y) - log pS(y) is
        # positive (encouraged) / negative (discouraged)
        adv_N = signals["adv"][loss_mask_bR[response_mask_bR]]
        metrics["opsd/enc_frac"] = Metric(AggregationType.SUM, float((adv_N > 0).sum()) * selected_scale)
        metrics["opsd/disc_frac"] = Metric(AggregationType.SUM, float((adv_N < 0).sum()) * selected_scale)
    return loss, metrics
