"""The surrogate's pS_old is the behaviour policy: when the update's own forward is not the policy that sampled
(stale samples of the async trainers, several optimizer steps per batch) the trainer sends its log-probs (the
rollout's for stale samples, the actor's before the update otherwise), the loss uses them, and a stale
configuration that cannot supply them is refused naming the setting.

The loss test in float64 through ``actor_loss.opsd_loss``: the samples come from a student one update older
(its lm_head moved), so the importance ratio pS_theta / pS_old is not 1 and the PPO clip acts; the loss and
its gradient equal verl's clipped surrogate written out against the old policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from recipe.opsd.actor_loss import OLD_LOG_PROBS_KEY, opsd_loss
from recipe.opsd.core.config import LossConfig
from recipe.opsd.core.objectives.base import needs_behaviour_log_probs

D = torch.float64
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "opsd" / "config")


def _micro_batch(seed=3):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 4, 5, generator=gen, dtype=D)
    weight = torch.randn(7, 5, generator=gen, dtype=D)
    # the behaviour policy: the same student one (large) update earlier, its lm_head elsewhere
    weight_old = weight + 0.6 * torch.randn(7, 5, generator=gen, dtype=D)
    teacher_hidden, teacher_weight = torch.randn(2, 4, 5, generator=gen, dtype=D), torch.randn(7, 5, generator=gen, dtype=D)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    ids = torch.randint(0, 7, (2, 4), generator=gen)
    return hidden, weight, weight_old, teacher_hidden, teacher_weight, mask, ids


def _log_probs(hidden, weight, ids, temperature):
    return torch.log_softmax(hidden @ weight.T / temperature, -1).gather(-1, ids[..., None])[..., 0]


def _loss(cfg, hidden, weight, teacher_hidden, teacher_weight, mask, ids, old=None):
    hs, ws = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    data = {"teacher_hidden": teacher_hidden, "loss_mask": mask, "response_mask": mask, "responses": ids, "dp_size": 1,
            "batch_num_tokens": int(mask.sum()), "opsd_loss_sequences": 2, "opsd_response_tokens": int(mask.sum())}
    if old is not None:
        data[OLD_LOG_PROBS_KEY] = old
    loss, metrics = opsd_loss({"student_hidden": hs, "student_weight": ws, "student_bias": None}, data,
                              loss_config=cfg, teacher_weight_VH=teacher_weight)
    loss.backward()
    return loss, metrics, hs.grad, ws.grad


def test_stale_samples_give_ratios_off_one_and_the_clip_acts():
    hidden, weight, weight_old, teacher_hidden, teacher_weight, mask, ids = _micro_batch()
    cfg = LossConfig(objective="sampled_token", student_temperature=1.1, clip_tau=None, chunk_size=3)
    old = _log_probs(hidden, weight_old, ids, 1.1) * mask
    loss, metrics, grad_h, grad_w = _loss(cfg, hidden, weight, teacher_hidden, teacher_weight, mask, ids, old=old)

    # verl's vanilla PPO surrogate against pS_old, written out: A = log pT(y) - log pS_old(y), r = pS / pS_old,
    # l = max(-A r, -A clip(r, 0.8, 1.2)), dual clip min(l, 3 |A|) for A < 0; the per-rollout mean of the paper
    hs, ws = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp = _log_probs(hs, ws, ids, 1.1)
    adv = (_log_probs(teacher_hidden, teacher_weight, ids, 1.1) - old).detach() * mask
    ratio = torch.exp(logp - old)
    terms = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    terms = torch.where(adv < 0, torch.minimum(terms, -adv * 3.0), terms)
    want = (terms[0].sum() / 4 + terms[1, :3].sum() / 3) / 2
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    torch.testing.assert_close(grad_h, hs.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_w, ws.grad, rtol=1e-10, atol=1e-12)

    r = ratio.detach()[mask]
    clipped = (((adv[mask] > 0) & (r > 1.2)) | ((adv[mask] < 0) & (r < 0.8)) | ((adv[mask] < 0) & (r * adv[mask] < 3 * adv[mask])))
    assert float((r - 1).abs().max()) > 0.2 and bool(clipped.any()), "the fixture must exercise the clip"
    assert metrics["opsd/pg_ratio"].aggregate() == pytest.approx(float(r.mean()), rel=1e-12)
    assert metrics["opsd/pg_clip_frac"].aggregate() == pytest.approx(float(clipped.double().mean()), rel=1e-12)
    assert metrics["opsd/pg_clip_frac"].aggregate() > 0

    # without the behaviour policy the update's own forward is pS_old: every ratio is exactly 1, nothing is clipped
    _, fresh, _, _ = _loss(cfg, hidden, weight, teacher_hidden, teacher_weight, mask, ids)
    assert fresh["opsd/pg_ratio"].aggregate() == 1.0 and fresh["opsd/pg_clip_frac"].aggregate() == 0.0


def test_rlsd_weights_use_the_behaviour_policy():
    """RLSD's evidence ratio compares the teacher with the policy that sampled: the weights logged with stale
    samples are those of log pT(y) - log pS_old(y), not of the current student."""
    hidden, weight, weight_old, teacher_hidden, teacher_weight, mask, ids = _micro_batch(seed=5)
    cfg = LossConfig(objective="rlsd", params={"eps_w": 0.5, "lam": 1.0, "lam_decay_steps": 0}, clip_tau=None,
                     chunk_size=3)
    old = _log_probs(hidden, weight_old, ids, 1.1) * mask
    adv_B = torch.tensor([1.0, -1.0], dtype=D)
    hs, ws = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    data = {"teacher_hidden": teacher_hidden, "loss_mask": mask, "response_mask": mask, "responses": ids, "dp_size": 1,
            "batch_num_tokens": 7, "opsd_loss_sequences": 2, "opsd_response_tokens": 7, "opsd_task_advantages": adv_B,
            "opsd_step_rlsd_lambda": 1.0, OLD_LOG_PROBS_KEY: old}
    _, metrics = opsd_loss({"student_hidden": hs, "student_weight": ws, "student_bias": None}, data, loss_config=cfg,
                           teacher_weight_VH=teacher_weight)
    delta = _log_probs(teacher_hidden, teacher_weight, ids, 1.1) - old
    want = torch.exp(adv_B.sign()[:, None] * delta).clamp(0.5, 1.5)[mask].mean()
    assert metrics["opsd/rlsd_weight"].aggregate() == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize(("objective", "task_weight", "stale", "updates", "want"), [
    ("divergence", 0.0, True, 4, False),      # no surrogate: the divergence has no pS_old
    ("divergence", 0.1, False, 1, False),     # the task term, fresh samples, one update
    ("divergence", 0.1, False, 2, True),      # ... several updates
    ("sampled_token", 0.0, True, 1, True),    # stale samples
    ("sampled_token", 0.0, False, 1, False),
    ("rlsd", 0.0, False, 2, True),            # the RLSD preset's two updates per batch
])
def test_which_settings_need_the_behaviour_policy(objective, task_weight, stale, updates, want):
    built = LossConfig(objective=objective, task_weight=task_weight).build_objective()
    assert needs_behaviour_log_probs(built, stale_samples=stale, updates_per_batch=updates) is want


def _compose(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="opsd_trainer", overrides=list(overrides))


@pytest.mark.parametrize("async_mode", ["async_one_step_off", "async_fully"])
def test_stale_samples_without_the_rollouts_log_probs_are_refused_naming_the_setting(async_mode):
    from recipe.opsd.startup import prepare_config

    overrides = ["opsd.loss.objective=sampled_token", f"+experiment={async_mode}"]
    prepare_config(_compose(overrides))  # the async presets ask for them
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.calculate_log_probs=false") as err:
        prepare_config(_compose([*overrides, "actor_rollout_ref.rollout.calculate_log_probs=false"]))
    assert "from the previous policy (async_training)" in str(err.value) and "set it to true" in str(err.value)
    # the divergence objective has no pS_old, and fresh samples take it from the actor: both start without them
    prepare_config(_compose([f"+experiment={async_mode}", "actor_rollout_ref.rollout.calculate_log_probs=false"]))
    prepare_config(_compose(["+experiment=objective_rlsd", "actor_rollout_ref.rollout.calculate_log_probs=false"]))
