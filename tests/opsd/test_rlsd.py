"""The RLSD objective (recipe.opsd.core.objectives.rlsd) in float64: its token weights, advantages and lambda
schedule by hand and against the reference trainer's formula (siyan-zhao/OPSD rlsd_trainer.py, written out
below), the sign of every token's advantage is the verifier's, and the loss through the unchanged glue
(``actor_loss.opsd_loss``) equals the surrogate written out."""

from __future__ import annotations

import math

import pytest
import torch

from recipe.opsd.core.objectives.rlsd import RLSDParams, rlsd_advantages, rlsd_lambda, rlsd_token_weights

D = torch.float64
LN2 = math.log(2.0)


def _weights(adv_B, lt, ls, mask, eps_w=0.2):
    return rlsd_token_weights(task_advantages_B=torch.tensor(adv_B, dtype=D), teacher_log_probs_BT=torch.tensor(lt, dtype=D),
                              old_log_probs_BT=torch.tensor(ls, dtype=D), mask_BT=torch.tensor(mask), eps_w=eps_w)


def test_token_weights_by_hand():
    # response 0 correct (Ahat +1.5), response 1 wrong (Ahat -0.5); per position log pT(y) - log pS(y):
    # ln 2 (teacher favours y: exp = 2, clipped to 1.2), ln 1.1 (1.1 inside the clip), -ln 2 (0.5 -> 0.8)
    lt = [[math.log(0.5), math.log(0.55), math.log(0.25)], [math.log(0.5), math.log(0.55), math.log(0.25)]]
    ls = [[math.log(0.25), math.log(0.5), math.log(0.5)], [math.log(0.25), math.log(0.5), math.log(0.5)]]
    mask = [[True, True, True], [True, True, False]]
    w = _weights([1.5, -0.5], lt, ls, mask)
    # negative advantage: the ratio is inverted (exp(-delta)): 1/2 -> 0.8, 1/1.1 = 0.90909..., masked: 1
    want = torch.tensor([[1.2, 1.1, 0.8], [0.8, 1 / 1.1, 1.0]], dtype=D)
    torch.testing.assert_close(w, want, rtol=0, atol=1e-15)
    # a wider clip keeps the evidence ratio itself
    w = _weights([1.5, -0.5], lt, ls, mask, eps_w=0.9)
    torch.testing.assert_close(w, torch.tensor([[1.9, 1.1, 0.5], [0.5, 1 / 1.1, 1.0]], dtype=D), rtol=0, atol=1e-15)


def test_advantages_by_hand_and_their_sign_is_the_verifiers():
    w = torch.tensor([[1.2, 1.1, 0.8], [0.8, 1 / 1.1, 1.0]], dtype=D)
    adv_B = torch.tensor([1.5, -0.5], dtype=D)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    a = rlsd_advantages(task_advantages_B=adv_B, token_weights_BT=w, mask_BT=mask, lam=1.0)
    torch.testing.assert_close(a, torch.tensor([[1.8, 1.65, 1.2], [-0.4, -0.5 / 1.1, 0.0]], dtype=D), rtol=0, atol=1e-15)
    # lam 0.5: half of the reweighting, A (1 + 0.5 (w - 1)); lam 0: GRPO's uniform credit
    a = rlsd_advantages(task_advantages_B=adv_B, token_weights_BT=w, mask_BT=mask, lam=0.5)
    torch.testing.assert_close(a, torch.tensor([[1.65, 1.575, 1.35], [-0.45, -0.5 * (1 + 0.5 * (1 / 1.1 - 1)), 0.0]],
                                               dtype=D), rtol=0, atol=1e-15)
    a = rlsd_advantages(task_advantages_B=adv_B, token_weights_BT=w, mask_BT=mask, lam=0.0)
    torch.testing.assert_close(a, torch.tensor([[1.5, 1.5, 1.5], [-0.5, -0.5, 0.0]], dtype=D), rtol=0, atol=0)
    # whatever the teacher says (here: log-ratios of +-30 nats), no token flips the response's sign
    gen = torch.Generator().manual_seed(0)
    lt, ls = 30 * torch.randn(4, 7, generator=gen, dtype=D), 30 * torch.randn(4, 7, generator=gen, dtype=D)
    adv_B = torch.tensor([2.0, -1.0, 0.0, -0.3], dtype=D)
    full = torch.ones(4, 7, dtype=torch.bool)
    w = rlsd_token_weights(task_advantages_B=adv_B, teacher_log_probs_BT=lt, old_log_probs_BT=ls, mask_BT=full, eps_w=0.2)
    assert float(w.min()) >= 0.8 and float(w.max()) <= 1.2
    a = rlsd_advantages(task_advantages_B=adv_B, token_weights_BT=w, mask_BT=full, lam=1.0)
    assert torch.equal(torch.sign(a), torch.sign(adv_B)[:, None].expand(4, 7))


def test_weights_carry_no_gradient_and_shapes_are_checked():
    ls = torch.zeros(1, 2, dtype=D, requires_grad=True)
    w = rlsd_token_weights(task_advantages_B=torch.ones(1, dtype=D), teacher_log_probs_BT=torch.zeros(1, 2, dtype=D),
                           old_log_probs_BT=ls, mask_BT=torch.ones(1, 2, dtype=torch.bool), eps_w=0.2)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="task_advantages_B must be"):
        rlsd_token_weights(task_advantages_B=torch.ones(2, dtype=D), teacher_log_probs_BT=torch.zeros(1, 2, dtype=D),
                           old_log_probs_BT=ls, mask_BT=torch.ones(1, 2, dtype=torch.bool), eps_w=0.2)


def _reference_token_advantages(*, sequence_advantages, teacher_logps, student_logps, completion_mask, global_step,
                                rlsd_lambda=0.5, rlsd_lambda_decay_steps=50, rlsd_epsilon_w=0.2):
    """siyan-zhao/OPSD rlsd_trainer.py, RLSDTrainer._current_rlsd_lambda + _generate_and_score_completions (the
    token advantages), written out with its own names: the formula this project must reproduce."""
    if rlsd_lambda_decay_steps <= 0:
        lambda_t = rlsd_lambda
    else:
        lambda_t = rlsd_lambda * (1.0 - min(float(global_step) / float(rlsd_lambda_decay_steps), 1.0))
    delta = teacher_logps - student_logps
    weights = torch.exp(sequence_advantages.sign().unsqueeze(1) * delta)
    weights = torch.clamp(weights, 1.0 - rlsd_epsilon_w, 1.0 + rlsd_epsilon_w)
    token_advantages = sequence_advantages.unsqueeze(1) * ((1.0 - lambda_t) + lambda_t * weights)
    return token_advantages * completion_mask, lambda_t


def test_the_lambda_schedule_by_hand():
    """lam 0.5 falls linearly to 0 over 50 optimizer steps, then stays 0 (GRPO); 0 decay steps: constant."""
    steps = [0, 1, 10, 25, 49, 50, 51, 200]
    assert [rlsd_lambda(optimizer_step=s, lam=0.5, lam_decay_steps=50) for s in steps] == pytest.approx(
        [0.5, 0.49, 0.4, 0.25, 0.01, 0.0, 0.0, 0.0], abs=1e-15)
    assert rlsd_lambda(optimizer_step=99, lam=1.0, lam_decay_steps=0) == 1.0
    # the objective's step value: training step s of a run with 2 optimizer steps per batch (the reference's 2
    # iterations) has taken 2 s optimizer steps, so lam reaches 0 at the 26th batch (s = 25)
    from recipe.opsd.core.config import LossConfig

    objective = LossConfig(objective="rlsd").build_objective()
    assert objective.step_value_names == ("rlsd_lambda",)
    assert [objective.step_values(step=s, total_steps=100, updates_per_step=2)["rlsd_lambda"] for s in (0, 5, 24, 25)] \
        == pytest.approx([0.5, 0.4, 0.02, 0.0], abs=1e-15)


@pytest.mark.parametrize("global_step", [0, 10, 25, 50, 80])
def test_token_advantages_equal_the_reference_trainers(global_step):
    """The weights and advantages of the objective's functions and the reference's formula on hand tensors (three
    responses: correct, wrong, a tied group; one masked position), at several points of the lambda schedule."""
    adv_B = torch.tensor([1.5, -0.5, 0.0], dtype=D)
    lo = torch.log(torch.tensor([[0.25, 0.5, 0.5, 0.1], [0.25, 0.5, 0.5, 0.3], [0.2, 0.2, 0.2, 0.2]], dtype=D))
    lt = torch.log(torch.tensor([[0.5, 0.55, 0.25, 0.3], [0.5, 0.55, 0.25, 0.05], [0.9, 0.1, 0.2, 0.2]], dtype=D))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    want, lam = _reference_token_advantages(sequence_advantages=adv_B, teacher_logps=lt, student_logps=lo,
                                            completion_mask=mask.to(D), global_step=global_step)
    params = RLSDParams()
    assert (params.eps_w, params.lam, params.lam_decay_steps) == (0.2, 0.5, 50)  # the reference's rlsd_train.py
    ours_lam = rlsd_lambda(optimizer_step=global_step, lam=params.lam, lam_decay_steps=params.lam_decay_steps)
    assert ours_lam == lam
    w = rlsd_token_weights(task_advantages_B=adv_B, teacher_log_probs_BT=lt, old_log_probs_BT=lo, mask_BT=mask,
                           eps_w=params.eps_w)
    got = rlsd_advantages(task_advantages_B=adv_B, token_weights_BT=w, mask_BT=mask, lam=ours_lam)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    # and by hand at step 10 (lam 0.4): A (0.6 + 0.4 w), w = clip(exp(sign(A) delta), 0.8, 1.2)
    if global_step == 10:
        hand = torch.tensor([[1.5 * (0.6 + 0.4 * 1.2), 1.5 * (0.6 + 0.4 * 1.1), 1.5 * (0.6 + 0.4 * 0.8), 1.5 * (0.6 + 0.4 * 1.2)],
                             [-0.5 * (0.6 + 0.4 * 0.8), -0.5 * (0.6 + 0.4 / 1.1), -0.5 * (0.6 + 0.4 * 1.2), 0.0],
                             [0.0, 0.0, 0.0, 0.0]], dtype=D)
        torch.testing.assert_close(got, hand, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("params", "match"), [({"eps_w": 0.0}, "eps_w must be >"), ({"eps_w": 1.0}, "eps_w must be in"),
                                              ({"lam": 1.5}, "lam must be in"), ({"lam": -0.1}, "lam must be >="),
                                              ({"lam_decay_steps": -1}, "lam_decay_steps must be an integer >= 0"),
                                              ({"lam_decay_steps": 2.5}, "lam_decay_steps must be an integer >= 0")])
def test_params_are_validated_naming_the_field(params, match):
    with pytest.raises(ValueError, match=match):
        RLSDParams(**params)


def test_the_config_refuses_a_task_weight_and_the_glue_asks_for_the_reward():
    from recipe.opsd.core.config import LossConfig

    with pytest.raises(ValueError, match="task_weight=0.1 is not supported by opsd.loss.objective='rlsd'"):
        LossConfig(objective="rlsd", task_weight=0.1)
    assert LossConfig(objective="rlsd").build_objective().uses_task_reward()
    assert not LossConfig().build_objective().uses_task_reward()
    assert LossConfig(task_weight=0.1).build_objective().uses_task_reward()


def test_the_loss_through_the_glue_is_the_surrogate_written_out():
    """``actor_loss.opsd_loss`` with objective rlsd on one micro-batch: at r = 1 the PPO surrogate is -A per token,
    so loss = -sum_bt weight_bt A_bt with A from the teacher's and student's own log-probs (temperatures 1.1 /
    0.9), and its gradient is -sum_bt weight_bt A_bt grad log pS(y_t)."""
    from recipe.opsd.actor_loss import TASK_ADVANTAGES_KEY, opsd_loss
    from recipe.opsd.core.config import LossConfig

    cfg = LossConfig(objective="rlsd", params={"eps_w": 0.3, "lam": 1.0, "lam_decay_steps": 0}, student_temperature=1.1,
                     teacher_temperature=0.9, clip_tau=None, chunk_size=2)
    gen = torch.Generator().manual_seed(1)
    hs = torch.randn(2, 3, 4, generator=gen, dtype=D, requires_grad=True)
    ht = torch.randn(2, 3, 4, generator=gen, dtype=D)
    ws = torch.randn(6, 4, generator=gen, dtype=D, requires_grad=True)
    wt = torch.randn(6, 4, generator=gen, dtype=D)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    ids = torch.randint(0, 6, (2, 3), generator=gen)
    adv_B = torch.tensor([0.7, -1.3], dtype=D)
    data = {"teacher_hidden": ht, "loss_mask": mask, "response_mask": mask, "responses": ids, "dp_size": 1,
            "batch_num_tokens": 5, "opsd_loss_sequences": 2, "opsd_response_tokens": 5, TASK_ADVANTAGES_KEY: adv_B,
            "opsd_step_rlsd_lambda": 1.0}
    loss, metrics = opsd_loss({"student_hidden": hs, "student_weight": ws, "student_bias": None}, data,
                              loss_config=cfg, teacher_weight_VH=wt)
    loss.backward()
    grad_hs, grad_ws = hs.grad.clone(), ws.grad.clone()

    hs2, ws2 = hs.detach().clone().requires_grad_(True), ws.detach().clone().requires_grad_(True)
    logp_s = torch.log_softmax(hs2 @ ws2.T / 1.1, -1).gather(-1, ids[..., None])[..., 0]
    logp_t = torch.log_softmax(ht @ wt.T / 0.9, -1).gather(-1, ids[..., None])[..., 0]
    delta = (logp_t - logp_s).detach()
    w = torch.exp(torch.sign(adv_B)[:, None] * delta).clamp(0.7, 1.3)
    a = adv_B[:, None] * w
    # the paper's per-rollout mean: (mean over row 0's 3 positions + mean over row 1's 2) / 2
    per_token = -a * torch.exp(logp_s - logp_s.detach())
    want = (per_token[0].sum() / 3 + per_token[1, :2].sum() / 2) / 2
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    want.backward()
    torch.testing.assert_close(grad_hs, hs2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_ws, ws2.grad, rtol=1e-10, atol=1e-12)
    # logged: the token means of the weights and advantages over the 5 response tokens
    assert metrics["opsd/rlsd_weight"].aggregate() == pytest.approx(float(w[mask].mean()), rel=1e-12)
    assert metrics["opsd/pg_advantage"].aggregate() == pytest.approx(float(a[mask].mean()), rel=1e-12)
