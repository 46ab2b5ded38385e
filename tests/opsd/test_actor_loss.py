"""The actor's OPSD loss on a hand-made micro-batch equals the pure functions on full logits.

``actor_loss.opsd_loss`` receives final hidden states and lm_head weights (never [N, V] logits);
the references below form the full [b, R, V] logits in float64 and apply ``losses.token_divergence``
/ the objectives' own functions, then the mini-batch aggregation (written out by hand per
``loss_agg_mode``, with the other dp rank's counts) x dp_size that verl expects.
"""

from __future__ import annotations

import math

import pytest
import torch

import dataclasses

from recipe.opsd.actor_loss import (
    SFT_INPUT_PREFIX,
    SFT_TOKENS_KEY,
    STEP_VALUE_PREFIX,
    TASK_ADVANTAGES_KEY,
    opsd_loss,
)
from recipe.opsd.core.config import LossConfig
from recipe.opsd.core.losses import LOSS_AGG_MODES, token_divergence
from recipe.opsd.core.objectives.beta_opsd import beta_opsd_token_loss
from recipe.opsd.core.objectives.purified import purified_token_loss
from recipe.opsd.core.objectives.terms import mix_task_advantages, policy_gradient_terms, sampled_token_advantages

TEACHER_WEIGHT_KEY = STEP_VALUE_PREFIX + "teacher_weight"  # beta-OPSD's per-step value

B, R, H, V = 3, 6, 8, 13
RESPONSE_LENS = (6, 4, 1)
DP = 2
# loss tokens / rollouts with a loss position of the other dp rank's micro-batches (only the normalisers see them)
OTHER_RANK_TOKENS, OTHER_RANK_SEQUENCES = 5, 2

EXPECTED_METRICS = {
    "opsd/fwd_kl", "opsd/clip_frac", "opsd/clipped_teacher_mass", "opsd/student_entropy", "opsd/teacher_entropy",
    "opsd/top1_agree", "opsd/loss", "opsd/loss_token_mean", "opsd/loss_tokens", "opsd/enc_frac", "opsd/disc_frac",
}


def _counts(data):
    """The normalisers verl / the engine put on a micro-batch of this rank (+ the other rank's)."""
    mask = data["loss_mask"].bool()
    return {
        "batch_num_tokens": int(mask.sum()) + OTHER_RANK_TOKENS,
        "opsd_loss_sequences": int((mask.sum(-1) > 0).sum()) + OTHER_RANK_SEQUENCES,
    }


def _aggregate(per_token_bR, mask, data, mode):
    """The mini-batch loss share of this micro-batch x dp_size, by hand for each verl mode."""
    tokens, sequences = data["batch_num_tokens"], data["opsd_loss_sequences"]
    rows = [per_token_bR[b][mask[b]] for b in range(mask.shape[0])]
    if mode == "token-mean":
        total = sum(r.sum() for r in rows) / tokens
    elif mode == "token-sum":
        total = sum(r.sum() for r in rows)
    elif mode == "seq-mean-token-mean":
        total = sum(r.mean() for r in rows if len(r)) / sequences
    elif mode == "seq-mean-token-sum":
        total = sum(r.sum() for r in rows) / sequences
    else:  # seq-mean-token-sum-norm, horizon = the response width R
        total = sum(r.sum() for r in rows) / (sequences * mask.shape[1])
    return total * data["dp_size"]


def _batch(seed=0, loss_mask=None):
    gen = torch.Generator().manual_seed(seed)
    response_mask = torch.zeros(B, R, dtype=torch.bool)
    for i, n in enumerate(RESPONSE_LENS):
        response_mask[i, :n] = True
    if loss_mask is None:
        loss_mask = response_mask.clone()
        loss_mask[0, 2] = False  # a hole: a position outside the selection
    student_hidden = torch.randn(B, R, H, generator=gen, dtype=torch.float64)
    student_weight = torch.randn(V, H, generator=gen, dtype=torch.float64)
    teacher_hidden = student_hidden + 0.7 * torch.randn(B, R, H, generator=gen, dtype=torch.float64)
    teacher_weight = student_weight + 0.3 * torch.randn(V, H, generator=gen, dtype=torch.float64)
    data = {
        "teacher_hidden": teacher_hidden,
        "reference_hidden": teacher_hidden + 0.5 * torch.randn(B, R, H, generator=gen, dtype=torch.float64),
        "loss_mask": loss_mask,
        "response_mask": response_mask,
        "responses": torch.randint(0, V, (B, R), generator=gen),
        "dp_size": DP,
        "opsd_response_tokens": int(response_mask.sum()) + OTHER_RANK_TOKENS,
    }
    data |= _counts(data)
    return student_hidden, student_weight, teacher_weight, data


def _objective(cfg, objective="divergence", *, task_weight=0.0, sft_weight=0.0, discount=None, clip=0.2):
    """``cfg`` with the objective and its shared weights (the sampled-token discount is its parameter)."""
    params = {} if discount is None else {"discount": discount}
    return dataclasses.replace(cfg, objective=objective, params=params, task_weight=task_weight,
                               sft_weight=sft_weight, clip_ratio_low=clip, clip_ratio_high=clip)


def _run(loss_config, student_hidden, student_weight, teacher_weight, data):
    hs = student_hidden.clone().requires_grad_(True)
    ws = student_weight.clone().requires_grad_(True)
    loss, metrics = opsd_loss(
        {"student_hidden": hs, "student_weight": ws, "student_bias": None},
        data,
        loss_config=loss_config,
        teacher_weight_VH=teacher_weight,
    )
    grads = torch.autograd.grad(loss, (hs, ws))
    return loss, {k: m.aggregate() for k, m in metrics.items()}, grads


def _reference(per_token_fn, student_hidden, student_weight, teacher_weight, data, mask, mode="seq-mean-token-mean"):
    """(loss, per-token values, grads) of the ``mode`` aggregation of per_token(logits) on full float64 logits."""
    hs = student_hidden.clone().requires_grad_(True)
    ws = student_weight.clone().requires_grad_(True)
    student_logits = hs @ ws.T
    teacher_logits = data["teacher_hidden"] @ teacher_weight.T
    per_token_bR = per_token_fn(student_logits, teacher_logits)
    loss = _aggregate(per_token_bR, mask, data, mode)
    return loss, per_token_bR.detach(), torch.autograd.grad(loss, (hs, ws))


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("beta, clip_tau, topk", [(0.0, 0.05, None), (0.5, None, None), (1.0, 0.02, 4)])
def test_opsd_loss_equals_token_divergence_on_full_logits(beta, clip_tau, topk, mode):
    cfg = LossConfig(beta=beta, clip_tau=clip_tau, student_temperature=1.1, teacher_temperature=0.9,
                         topk=topk, chunk_size=4, loss_agg_mode=mode)
    hs, ws, wt, data = _batch()
    loss, metrics, grads = _run(cfg, hs, ws, wt, data)

    def per_token(s, t):
        return token_divergence(s, t, beta=beta, clip_tau=clip_tau, student_temperature=1.1,
                                teacher_temperature=0.9, topk=topk)

    ref_loss, per_token_bR, ref_grads = _reference(per_token, hs, ws, wt, data, data["loss_mask"], mode)
    _close(loss, ref_loss)
    _close(grads[0], ref_grads[0])
    _close(grads[1], ref_grads[1])
    # no gradient reaches positions outside the loss mask
    assert torch.all(grads[0][~data["loss_mask"]] == 0)
    assert set(metrics) == EXPECTED_METRICS
    # metrics are SUM-aggregated shares of the mini-batch: opsd/loss is the loss itself (= actor/loss)
    assert metrics["opsd/loss"] == pytest.approx(float(ref_loss))
    mask = data["loss_mask"]
    token_mean = float(per_token_bR[mask].sum()) * DP / data["batch_num_tokens"]
    assert metrics["opsd/loss_token_mean"] == pytest.approx(token_mean)
    assert metrics["opsd/loss_tokens"] == int(mask.sum()) * DP


def test_the_aggregation_modes_differ_on_unequal_lengths():
    """Rollouts of 6, 4 and 1 response tokens: the per-rollout mean (the paper) weighs the 1-token
    rollout's position 6x more than a token mean does; the modes give different losses."""
    hs, ws, wt, data = _batch(seed=23)
    losses = {mode: float(_run(LossConfig(loss_agg_mode=mode, chunk_size=4), hs, ws, wt, data)[0])
              for mode in LOSS_AGG_MODES}
    assert len({round(v, 12) for v in losses.values()}) == len(LOSS_AGG_MODES), losses


def test_metrics_against_float64_formulas():
    cfg = LossConfig(clip_tau=0.05, student_temperature=1.1, chunk_size=5)
    hs, ws, wt, data = _batch(seed=3)
    _, metrics, _ = _run(cfg, hs, ws, wt, data)
    mask = data["response_mask"]
    logp_s = torch.log_softmax(hs @ ws.T / 1.1, -1)[mask]
    logp_t = torch.log_softmax(data["teacher_hidden"] @ wt.T / 1.1, -1)[mask]
    d = logp_t.exp() * (logp_t - logp_s)
    scale = DP / data["opsd_response_tokens"]
    assert metrics["opsd/fwd_kl"] == pytest.approx(float(d.sum()) * scale, rel=1e-10)
    assert metrics["opsd/student_entropy"] == pytest.approx(float(-(logp_s.exp() * logp_s).sum()) * scale, rel=1e-10)
    assert metrics["opsd/clip_frac"] == pytest.approx(float((d > 0.05).double().mean(1).sum()) * scale, rel=1e-10)
    agree = (logp_s.argmax(1) == logp_t.argmax(1)).double().sum()
    assert metrics["opsd/top1_agree"] == pytest.approx(float(agree) * scale, rel=1e-12)
    ids = data["responses"][mask]
    adv = (logp_t - logp_s).gather(1, ids[:, None])[:, 0][data["loss_mask"][mask]]
    sel_scale = DP / data["batch_num_tokens"]
    assert metrics["opsd/enc_frac"] == pytest.approx(float((adv > 0).sum()) * sel_scale)
    assert metrics["opsd/disc_frac"] == pytest.approx(float((adv < 0).sum()) * sel_scale)


def test_live_teacher_weight_gets_no_gradient():
    """LoRA mode: teacher_weight_VH=None uses the live lm_head, detached on the teacher side."""
    cfg = LossConfig(clip_tau=None, student_temperature=1.0, chunk_size=3)
    hs, ws, _, data = _batch(seed=5)
    hs_, ws_ = hs.clone().requires_grad_(True), ws.clone().requires_grad_(True)
    loss, _ = opsd_loss({"student_hidden": hs_, "student_weight": ws_, "student_bias": None}, data,
                        loss_config=cfg, teacher_weight_VH=None)
    (gw,) = torch.autograd.grad(loss, (ws_,))
    ref_ws = ws.clone().requires_grad_(True)
    s = hs @ ref_ws.T
    t = data["teacher_hidden"] @ ws.T  # constant teacher
    ref = _aggregate(token_divergence(s, t, student_temperature=1.0), data["loss_mask"], data, "seq-mean-token-mean")
    _close(loss, ref)
    _close(gw, torch.autograd.grad(ref, (ref_ws,))[0])


@pytest.mark.parametrize("spec", ["he:0.5", "le:0.3"])
def test_entropy_positions_are_ranked_by_the_student_entropy(spec):
    from recipe.opsd.core.positions import select_positions

    hs, ws, wt, data = _batch(seed=7)
    response_mask = data["response_mask"]
    # the trainer's loss_mask: the per-completion count (constant entropy selects that many)
    count_mask = select_positions(spec, response_mask_BT=response_mask, entropy_BT=torch.zeros(B, R))
    data |= {"loss_mask": count_mask}
    data |= _counts(data)
    cfg = LossConfig(positions=spec, clip_tau=0.05, student_temperature=1.1, chunk_size=4)
    loss, metrics, grads = _run(cfg, hs, ws, wt, data)

    # float64 reference: per completion, the ceil(Q x n) positions of highest (he) / lowest (le) entropy
    logp = torch.log_softmax(hs @ ws.T / 1.1, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    q, highest = float(spec.split(":")[1]), spec.startswith("he")
    want = torch.zeros(B, R, dtype=torch.bool)
    for i, n in enumerate(RESPONSE_LENS):
        keep = math.ceil(q * n)
        order = torch.argsort(entropy[i, :n], descending=highest)[:keep]
        want[i, order] = True
    assert not torch.equal(want, count_mask)  # the selection really is not the first positions

    def per_token(s, t):
        return token_divergence(s, t, clip_tau=0.05, student_temperature=1.1)

    ref_loss, _, ref_grads = _reference(per_token, hs, ws, wt, data, want)
    _close(loss, ref_loss)
    _close(grads[0], ref_grads[0])
    assert torch.equal(grads[0].abs().sum(-1) > 0, want)
    assert metrics["opsd/loss_tokens"] == int(want.sum()) * DP


def test_entropy_positions_refuse_a_wrong_count():
    hs, ws, wt, data = _batch()
    with pytest.raises(ValueError, match="per completion"):
        _run(LossConfig(positions="he:0.2"), hs, ws, wt, data)  # loss_mask keeps every position


@pytest.mark.slow
@pytest.mark.parametrize("clip_tau", [None, 0.05])
def test_purified_variant_equals_purified_token_loss_on_full_logits(clip_tau):
    cfg = LossConfig(objective="purified", beta=0.5, clip_tau=clip_tau, student_temperature=1.1,
                     params={"pmi_strength": 1.0, "pmi_clip": 2.0}, chunk_size=4)
    hs, ws, wt, data = _batch(seed=11)
    loss, metrics, grads = _run(cfg, hs, ws, wt, data)
    reference_logits = data["reference_hidden"] @ wt.T

    def per_token(s, t):
        return purified_token_loss(s, t, reference_logits, beta=0.5, clip_tau=clip_tau, student_temperature=1.1,
                                   pmi_strength=1.0, pmi_clip=2.0)

    ref_loss, _, ref_grads = _reference(per_token, hs, ws, wt, data, data["loss_mask"])
    _close(loss, ref_loss)
    _close(grads[0], ref_grads[0])
    _close(grads[1], ref_grads[1])
    assert metrics["opsd/loss"] == pytest.approx(float(ref_loss))
    # the reference-only teacher matters: with it equal to the teacher the target is the teacher itself
    same = dict(data, reference_hidden=data["teacher_hidden"])
    other, _, _ = _run(cfg, hs, ws, wt, same)
    assert not torch.allclose(other, loss)


def test_beta_opsd_variant_equals_beta_opsd_token_loss_on_full_logits():
    cfg = LossConfig(objective="beta_opsd", student_temperature=1.1, teacher_temperature=1.0,
                     params={"discount": 0.9}, chunk_size=4)
    hs, ws, wt, data = _batch(seed=13)
    data[TEACHER_WEIGHT_KEY] = 0.65
    loss, metrics, grads = _run(cfg, hs, ws, wt, data)

    def per_token(s, t):
        return beta_opsd_token_loss(s, t, data["responses"], data["response_mask"], teacher_weight=0.65,
                                    discount=0.9, student_temperature=1.1, teacher_temperature=1.0).loss_BT

    # returns run over every response token; the surrogate is averaged over the loss positions
    ref_loss, _, ref_grads = _reference(per_token, hs, ws, wt, data, data["loss_mask"])
    _close(loss, ref_loss)
    _close(grads[0], ref_grads[0])
    _close(grads[1], ref_grads[1])
    assert set(metrics) == EXPECTED_METRICS | {"opsd/beta_reward", "opsd/beta_return"}
    ref = beta_opsd_token_loss(hs @ ws.T, data["teacher_hidden"] @ wt.T, data["responses"], data["response_mask"],
                               teacher_weight=0.65, discount=0.9, student_temperature=1.1, teacher_temperature=1.0)
    scale = DP / data["opsd_response_tokens"]
    assert metrics["opsd/beta_reward"] == pytest.approx(float(ref.reward_BT.sum()) * scale, rel=1e-10)
    assert metrics["opsd/beta_return"] == pytest.approx(float(ref.return_BT.sum()) * scale, rel=1e-10)
    # the teacher weight is used: another weight gives another loss
    other, _, _ = _run(cfg, hs, ws, wt, dict(data, **{TEACHER_WEIGHT_KEY: 0.8}))
    assert not torch.allclose(other, loss)


@pytest.mark.slow
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("variant", ["divergence", "purified", "beta_opsd"])
def test_micro_batch_and_rank_split_give_the_mini_batch_loss_and_gradient(mode, variant):
    """The mini-batch of 3 rollouts (6, 4, 1 tokens) on 1 rank, or split into micro-batches {0, 1}, {2}
    on rank 0 and {3, 4} on rank 1 (another seed's rows): the same loss and the same averaged gradient."""
    cfg = LossConfig(objective=variant, beta=0.5 if variant == "purified" else 0.0, clip_tau=0.05,
                     student_temperature=1.1, chunk_size=2, loss_agg_mode=mode)
    hs_a, ws, wt, data_a = _batch(seed=17)
    hs_b, _, _, data_b = _batch(seed=18)
    rows_b = slice(0, 2)
    mini = {k: (torch.cat([v, data_b[k][rows_b]]) if isinstance(v, torch.Tensor) else v) for k, v in data_a.items()}
    hs_all = torch.cat([hs_a, hs_b[rows_b]])
    mask = mini["loss_mask"]
    counts = {"batch_num_tokens": int(mask.sum()), "opsd_loss_sequences": int((mask.sum(-1) > 0).sum()),
              "opsd_response_tokens": int(mini["response_mask"].sum()), TEACHER_WEIGHT_KEY: 0.6}
    whole, _, whole_grads = _run(cfg, hs_all, ws, wt, mini | counts | {"dp_size": 1})
    grad_h, grad_w, total = torch.zeros_like(hs_all), torch.zeros_like(ws), 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 5)):  # micro-batches; the last one is rank 1's
        sub = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in mini.items()}
        loss, _, (gh, gw) = _run(cfg, hs_all[rows], ws, wt, sub | counts | {"dp_size": 2})
        grad_h[rows] += gh / 2  # FSDP averages the two ranks' gradients
        grad_w += gw / 2
        total += float(loss) / 2
    assert total == pytest.approx(float(whole), rel=1e-12)
    _close(grad_h, whole_grads[0])
    _close(grad_w, whole_grads[1])


@pytest.mark.parametrize("variant", ["divergence", "purified", "beta_opsd"])
def test_a_micro_batch_without_selected_positions_gives_zero_and_backpropagates(variant):
    """AdvT can reject every position of a micro-batch: loss 0, a graph to backpropagate, zero grads."""
    hs, ws, wt, data = _batch(seed=19, loss_mask=torch.zeros(B, R, dtype=torch.bool))
    data |= {"batch_num_tokens": OTHER_RANK_TOKENS, "opsd_loss_sequences": OTHER_RANK_SEQUENCES, TEACHER_WEIGHT_KEY: 0.5}
    cfg = LossConfig(objective=variant, beta=0.5 if variant == "purified" else 0.0, chunk_size=4)
    loss, metrics, grads = _run(cfg, hs, ws, wt, data)
    assert float(loss) == 0.0 and metrics["opsd/loss"] == 0.0 and metrics["opsd/loss_tokens"] == 0
    assert all(torch.all(g == 0) for g in grads)


# --- objectives (opsd.loss.objective): the glue's loss equals the pure objectives on full float64 logits
TASK_ADVANTAGES = torch.tensor([1.2, -0.4, -0.8], dtype=torch.float64)  # one GRPO advantage per response


def _sampled_logps(s_logits, t_logits, data, *, student_temperature=1.1, teacher_temperature=0.9):
    y = data["responses"].unsqueeze(-1)
    s_logp = torch.log_softmax(s_logits / student_temperature, -1).gather(-1, y).squeeze(-1)
    t_logp = torch.log_softmax(t_logits / teacher_temperature, -1).gather(-1, y).squeeze(-1)
    return s_logp, t_logp


def _pure_surrogate(s_logp, advantages, objective):
    return policy_gradient_terms(log_probs_BT=s_logp, old_log_probs_BT=s_logp.detach(), advantages_BT=advantages,
                                 clip_ratio_low=objective.clip_ratio_low, clip_ratio_high=objective.clip_ratio_high)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("task_weight, discount, clip", [(0.0, 0.0, 0.2), (0.3, 0.0, 0.2), (0.3, 0.9, None)])
def test_sampled_token_objective_equals_the_pure_surrogate_on_full_logits(task_weight, discount, clip, mode):
    cfg = _objective(LossConfig(student_temperature=1.1, teacher_temperature=0.9, chunk_size=4, loss_agg_mode=mode),
                     "sampled_token", task_weight=task_weight, discount=discount, clip=clip)
    objective = cfg
    hs, ws, wt, data = _batch(seed=23)
    data[TASK_ADVANTAGES_KEY] = TASK_ADVANTAGES
    loss, metrics, grads = _run(cfg, hs, ws, wt, data)
    response = data["response_mask"]

    def per_token(s, t):
        s_logp, t_logp = _sampled_logps(s, t, data)
        adv = sampled_token_advantages(teacher_log_probs_BT=t_logp, old_log_probs_BT=s_logp.detach(),
                                       mask_BT=response, discount=discount)
        adv = mix_task_advantages(distill_advantages_BT=adv, task_advantages_B=TASK_ADVANTAGES, mask_BT=response,
                                  task_weight=task_weight)
        return _pure_surrogate(s_logp, adv, objective)

    ref_loss, per_token_bR, ref_grads = _reference(per_token, hs, ws, wt, data, data["loss_mask"], mode)
    _close(loss, ref_loss)
    _close(grads[0], ref_grads[0])
    _close(grads[1], ref_grads[1])
    assert set(metrics) == EXPECTED_METRICS | {"opsd/pg_advantage", "opsd/pg_ratio", "opsd/pg_clip_frac"}
    assert metrics["opsd/loss"] == pytest.approx(float(ref_loss), rel=1e-10)
    # at r = 1 the surrogate is -A per token: the loss is minus the aggregated advantage (by hand)
    s_logp, t_logp = _sampled_logps(hs @ ws.T, data["teacher_hidden"] @ wt.T, data)
    if discount == 0.0:
        adv_by_hand = torch.where(response, t_logp - s_logp + task_weight * TASK_ADVANTAGES[:, None], 0.0)
        _close(loss, -_aggregate(adv_by_hand, data["loss_mask"], data, mode))
        scale = DP / data["opsd_response_tokens"]
        assert metrics["opsd/pg_advantage"] == pytest.approx(float(adv_by_hand[response].sum()) * scale, rel=1e-10)


def test_a_task_weight_on_the_divergence_adds_the_task_surrogate():
    cfg = LossConfig(beta=0.0, clip_tau=0.05, student_temperature=1.1, teacher_temperature=0.9, chunk_size=4)
    objective = _objective(cfg, task_weight=0.5)
    hs, ws, wt, data = _batch(seed=29)
    data[TASK_ADVANTAGES_KEY] = TASK_ADVANTAGES
    loss, metrics, grads = _run(objective, hs, ws, wt, data)
    mask, response = data["loss_mask"], data["response_mask"]

    def task_terms(s, t):
        s_logp, _ = _sampled_logps(s, t, data)
        return _pure_surrogate(s_logp, torch.where(response, TASK_ADVANTAGES[:, None].expand(B, R), 0.0), objective)

    def per_token(s, t):
        return token_divergence(s, t, beta=0.0, clip_tau=0.05, student_temperature=1.1, teacher_temperature=0.9)

    div_loss, _, div_grads = _reference(per_token, hs, ws, wt, data, mask)
    task_loss, _, task_grads = _reference(task_terms, hs, ws, wt, data, mask)
    _close(loss, div_loss + 0.5 * task_loss)
    _close(grads[0], div_grads[0] + 0.5 * task_grads[0])
    _close(grads[1], div_grads[1] + 0.5 * task_grads[1])
    assert metrics["opsd/task_pg_loss"] == pytest.approx(float(task_loss), rel=1e-10)
    # the task term is not nothing: without it the gradient is the divergence's alone (the task term's
    # value at r = 1 is -sum w Ahat, 0 here: the group advantages sum to 0 and each rollout weighs 1/3)
    alone, _, alone_grads = _run(cfg, hs, ws, wt, data)
    _close(alone, div_loss)
    _close(alone_grads[0], div_grads[0])
    assert (grads[0] - alone_grads[0]).abs().max() > 1e-3


@pytest.mark.slow
def test_the_objectives_split_into_micro_batches_and_ranks_exactly():
    """As the variants: 5 rollouts on 1 rank, or {0, 1}, {2} on rank 0 and {3, 4} on rank 1."""
    cfg = _objective(LossConfig(student_temperature=1.1, chunk_size=2), "sampled_token", task_weight=0.3, discount=0.5)
    hs_a, ws, wt, data_a = _batch(seed=31)
    hs_b, _, _, data_b = _batch(seed=32)
    data_a[TASK_ADVANTAGES_KEY], data_b[TASK_ADVANTAGES_KEY] = TASK_ADVANTAGES, -TASK_ADVANTAGES
    mini = {k: (torch.cat([v, data_b[k][:2]]) if isinstance(v, torch.Tensor) else v) for k, v in data_a.items()}
    hs_all = torch.cat([hs_a, hs_b[:2]])
    mask = mini["loss_mask"]
    counts = {"batch_num_tokens": int(mask.sum()), "opsd_loss_sequences": int((mask.sum(-1) > 0).sum()),
              "opsd_response_tokens": int(mini["response_mask"].sum())}
    whole, _, whole_grads = _run(cfg, hs_all, ws, wt, mini | counts | {"dp_size": 1})
    grad_h, grad_w, total = torch.zeros_like(hs_all), torch.zeros_like(ws), 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 5)):
        sub = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in mini.items()}
        loss, _, (gh, gw) = _run(cfg, hs_all[rows], ws, wt, sub | counts | {"dp_size": 2})
        grad_h[rows] += gh / 2
        grad_w += gw / 2
        total += float(loss) / 2
    assert total == pytest.approx(float(whole), rel=1e-12)
    _close(grad_h, whole_grads[0])
    _close(grad_w, whole_grads[1])


# --- the SFT term (opsd.loss.sft_weight): the NLL of the reference solutions, its own token count
SOLUTION_LENS = (3, 5, 1)
S = max(SOLUTION_LENS)
OTHER_RANK_SFT_TOKENS = 4


def _sft_rows(seed, data):
    """``sft_hidden`` [B, S, H] (the second forward's hidden states) and the solution ids / mask / count."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, S, dtype=torch.bool)
    for i, n in enumerate(SOLUTION_LENS):
        mask[i, :n] = True
    data = data | {SFT_INPUT_PREFIX + "responses": torch.randint(0, V, (B, S), generator=gen),
                   SFT_INPUT_PREFIX + "response_mask": mask,
                   SFT_TOKENS_KEY: int(mask.sum()) + OTHER_RANK_SFT_TOKENS}
    return torch.randn(B, S, H, generator=gen, dtype=torch.float64), data


def _run_sft(loss_config, student_hidden, student_weight, teacher_weight, sft_hidden, data):
    hs = student_hidden.clone().requires_grad_(True)
    ws = student_weight.clone().requires_grad_(True)
    hf = sft_hidden.clone().requires_grad_(True)
    loss, metrics = opsd_loss(
        {"student_hidden": hs, "student_weight": ws, "student_bias": None, "sft_hidden": hf},
        data, loss_config=loss_config, teacher_weight_VH=teacher_weight,
    )
    grads = torch.autograd.grad(loss, (hs, ws, hf))
    return loss, {k: m.aggregate() for k, m in metrics.items()}, grads


def _sft_reference(student_weight, sft_hidden, data):
    """(the SFT term, its grads w.r.t. weight and sft_hidden): -log softmax(h W^T)[s] on full float64
    logits at temperature 1, summed over the solution tokens, x dp_size / solution tokens of the mini-batch."""
    ws = student_weight.clone().requires_grad_(True)
    hf = sft_hidden.clone().requires_grad_(True)
    logp = torch.log_softmax(hf @ ws.T, -1).gather(-1, data[SFT_INPUT_PREFIX + "responses"].unsqueeze(-1)).squeeze(-1)
    mask = data[SFT_INPUT_PREFIX + "response_mask"]
    term = -logp[mask].sum() * data["dp_size"] / data[SFT_TOKENS_KEY]
    return term, torch.autograd.grad(term, (ws, hf))


@pytest.mark.slow
@pytest.mark.parametrize("kind, task_weight", [("divergence", 0.0), ("divergence", 0.3),
                                               ("sampled_token", 0.0), ("sampled_token", 0.3)])
def test_the_sft_term_adds_the_solution_nll_for_both_objective_kinds(kind, task_weight):
    cfg = LossConfig(beta=0.0, clip_tau=0.05, student_temperature=1.1, teacher_temperature=0.9, chunk_size=4)
    hs, ws, wt, data = _batch(seed=37)
    data[TASK_ADVANTAGES_KEY] = TASK_ADVANTAGES
    sft_hidden, data = _sft_rows(38, data)
    main_objective = _objective(cfg, kind, task_weight=task_weight)
    objective = _objective(cfg, kind, task_weight=task_weight, sft_weight=0.4)
    loss, metrics, grads = _run_sft(objective, hs, ws, wt, sft_hidden, data)
    main_loss, main_metrics, main_grads = _run(main_objective, hs, ws, wt, data)
    term, (term_grad_w, term_grad_f) = _sft_reference(ws, sft_hidden, data)
    _close(loss, main_loss + 0.4 * term)
    _close(grads[0], main_grads[0])  # the rollouts' hidden states see the main loss only
    _close(grads[1], main_grads[1] + 0.4 * term_grad_w)
    _close(grads[2], 0.4 * term_grad_f)
    assert set(metrics) == set(main_metrics) | {"opsd/sft_nll", "opsd/sft_tokens"}
    assert metrics["opsd/loss"] == pytest.approx(float(loss.detach()), rel=1e-12)
    # the logged NLL is the term before its weight: the token mean over the mini-batch's solution tokens
    assert metrics["opsd/sft_nll"] == pytest.approx(float(term), rel=1e-12)
    assert metrics["opsd/sft_tokens"] == sum(SOLUTION_LENS) * DP


def test_the_sft_term_by_hand():
    """One solution token s = 1 whose logit is ln 3, every other logit 0: p(s) = 3 / (3 + V - 1) = 1/5
    (V = 13), so the term is -ln(1/5) x dp_size 2 / 3 solution tokens in the mini-batch."""
    cfg = LossConfig(chunk_size=4)
    hs, ws, wt, data = _batch(seed=41)
    weight = torch.zeros(V, H, dtype=torch.float64)
    weight[1, 0] = math.log(3.0)
    sft_hidden = torch.zeros(B, 1, H, dtype=torch.float64)
    sft_hidden[:, 0, 0] = 1.0
    mask = torch.tensor([[True], [False], [False]])
    data |= {SFT_INPUT_PREFIX + "responses": torch.ones(B, 1, dtype=torch.long),
             SFT_INPUT_PREFIX + "response_mask": mask, SFT_TOKENS_KEY: 3, "dp_size": 2}
    loss, metrics, _ = _run_sft(_objective(cfg, sft_weight=1.0), hs, weight, weight, sft_hidden, data)
    alone, _, _ = _run(cfg, hs, weight, weight, data)
    assert V == 13
    assert float(loss - alone) == pytest.approx(math.log(5.0) * 2 / 3, rel=1e-12)
    assert metrics["opsd/sft_nll"] == pytest.approx(math.log(5.0) * 2 / 3, rel=1e-12)


@pytest.mark.slow
def test_weight_zero_gives_exactly_the_old_loss_and_needs_no_sft_rows():
    cfg = LossConfig(beta=0.0, clip_tau=0.05, chunk_size=4)
    hs, ws, wt, data = _batch(seed=43)
    old, old_metrics, old_grads = _run(cfg, hs, ws, wt, data)
    new, new_metrics, new_grads = _run(_objective(cfg, sft_weight=0.0), hs, ws, wt, data)
    assert torch.equal(old, new) and old_metrics == new_metrics
    assert all(torch.equal(a, b) for a, b in zip(old_grads, new_grads))
    # a positive weight without the second forward's hidden states is an error, not a silent zero
    with pytest.raises(KeyError, match="sft_hidden"):
        _run(_objective(cfg, sft_weight=0.1), hs, ws, wt, data)


def test_the_sft_term_splits_into_micro_batches_and_ranks_exactly():
    """5 rollouts on 1 rank, or {0, 1}, {2} on rank 0 and {3, 4} on rank 1: the same loss and averaged gradients."""
    cfg = _objective(LossConfig(student_temperature=1.1, chunk_size=2), sft_weight=0.7)
    hs_a, ws, wt, data_a = _batch(seed=47)
    hs_b, _, _, data_b = _batch(seed=48)
    sft_a, data_a = _sft_rows(49, data_a)
    sft_b, data_b = _sft_rows(50, data_b)
    mini = {k: (torch.cat([v, data_b[k][:2]]) if isinstance(v, torch.Tensor) else v) for k, v in data_a.items()}
    hs_all, sft_all = torch.cat([hs_a, hs_b[:2]]), torch.cat([sft_a, sft_b[:2]])
    mask = mini["loss_mask"]
    counts = {"batch_num_tokens": int(mask.sum()), "opsd_loss_sequences": int((mask.sum(-1) > 0).sum()),
              "opsd_response_tokens": int(mini["response_mask"].sum()),
              SFT_TOKENS_KEY: int(mini[SFT_INPUT_PREFIX + "response_mask"].sum())}
    whole, whole_metrics, whole_grads = _run_sft(cfg, hs_all, ws, wt, sft_all, mini | counts | {"dp_size": 1})
    grads = [torch.zeros_like(hs_all), torch.zeros_like(ws), torch.zeros_like(sft_all)]
    total, nll = 0.0, 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 5)):
        sub = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in mini.items()}
        loss, metrics, (gh, gw, gf) = _run_sft(cfg, hs_all[rows], ws, wt, sft_all[rows], sub | counts | {"dp_size": 2})
        grads[0][rows] += gh / 2
        grads[1] += gw / 2
        grads[2][rows] += gf / 2
        total += float(loss) / 2
        nll += metrics["opsd/sft_nll"] / 2  # summed per rank, averaged over ranks as verl reduces metrics
    assert total == pytest.approx(float(whole), rel=1e-12)
    assert nll == pytest.approx(whole_metrics["opsd/sft_nll"], rel=1e-12)
    for split, full in zip(grads, whole_grads):
        _close(split, full)
