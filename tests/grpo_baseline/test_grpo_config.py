"""recipe/grpo_baseline/config/grpo_trainer.yaml and released_grpo.yaml against the paper's GRPO runs,
sentence by sentence (a changed value of ours fails; the CPU platform: tests/cpu/test_platform.py)."""

import pytest

from recipe.launch.config import compose, get_recipe


def grpo_config(overrides=()):
    return compose(get_recipe("grpo"), list(overrides))


def test_grpo_yaml_matches_the_paper_control():
    cfg = grpo_config()
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    # app:grpo_configuration, sentence by sentence
    assert cfg.algorithm.adv_estimator == "grpo"
    assert actor.ppo_epochs == 1  # one PPO epoch per update
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)  # DAPO clip ratios
    # the paper's GRPO equation (eq. grpo_related): 1/|y| per response, then the mean over responses
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    assert actor.optim.weight_decay == 0.01 and actor.grad_clip == 1.0 and actor.optim.clip_grad == 1.0
    assert actor.entropy_coeff == 0  # no entropy bonus
    assert actor.use_kl_loss and actor.kl_loss_type == "low_var_kl" and actor.kl_loss_coef == 0.01
    assert cfg.algorithm.use_kl_in_reward is False  # no reward-side KL
    assert cfg.reward.reward_manager.name == "naive"  # no overlong-response penalty
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert (rollout.n, rollout.temperature, rollout.top_p, rollout.top_k) == (8, 0.6, 0.95, 20)
    assert cfg.reward.custom_reward_function.path.endswith("recipe/common/reward.py")
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.actor_rollout_ref.model.lora_rank == 0  # full-parameter updates
    # app:sft_grpo_control run size
    # prompts of at most 1,024 tokens: filtered at data preparation; no dataset-side filter (as OPSD), an
    # over-long row is refused at launch (tests/launch/test_data_order.py)
    assert cfg.data.max_prompt_length == 1024 and cfg.data.filter_overlong_prompts is False
    assert cfg.data.train_batch_size == 16 and actor.ppo_mini_batch_size == 8
    assert actor.optim.lr == 5e-7 and cfg.data.max_response_length == 20480
    assert cfg.trainer.total_training_steps == 100 and cfg.trainer.save_freq == 25
    assert cfg.data.seed == 42  # the paper's seed of its other stages (it states none for this run)
    assert "file" in cfg.trainer.logger  # timing_s/* per step in the metrics jsonl


@pytest.mark.slow
def test_released_grpo_changes_only_the_run_size():
    control = grpo_config()
    released = grpo_config(["+experiment=released_grpo"])
    actor = released.actor_rollout_ref.actor
    # app:released_grpo
    assert released.data.train_batch_size == 64 and actor.ppo_mini_batch_size == 64
    assert actor.optim.lr == 1e-6 and released.data.max_response_length == 24576
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert released.trainer.total_training_steps == 50
    assert released.data.seed == 1  # "the GRPO random sampler (seed 1)"
    # the control itself is unchanged
    for key in ("clip_ratio_low", "clip_ratio_high", "loss_agg_mode", "kl_loss_coef", "kl_loss_type", "entropy_coeff"):
        assert actor[key] == control.actor_rollout_ref.actor[key]
    for key in ("n", "temperature", "top_p", "top_k"):
        assert released.actor_rollout_ref.rollout[key] == control.actor_rollout_ref.rollout[key]
    assert released.reward == control.reward and released.data.max_prompt_length == 1024


@pytest.mark.slow
def test_grpo_runs_on_the_opsd_recipes_trainer():
    """Both recipes on verl's legacy RayPPOTrainer (OPSD refuses use_v1=true), so a compute
    comparison compares algorithms, not trainers; every preset keeps it."""
    for overrides in ([], ["+experiment=released_grpo"], ["+demo=tiny"], ["+demo=toy"]):
        assert grpo_config(overrides).trainer.use_v1 is False, overrides
    assert compose(get_recipe("opsd"), []).trainer.use_v1 is False


@pytest.mark.slow
def test_both_aggregations_are_presets():
    """Item: the paper's equation (the default) and DAPO / verl's token-mean, one preset each; nothing else changes."""
    base = grpo_config()
    for name, mode in (("agg_seq_mean_token_mean", "seq-mean-token-mean"), ("agg_token_mean", "token-mean")):
        cfg = grpo_config([f"+experiment={name}"])
        assert cfg.actor_rollout_ref.actor.loss_agg_mode == mode
        cfg.actor_rollout_ref.actor.loss_agg_mode = base.actor_rollout_ref.actor.loss_agg_mode
        assert cfg == base, name
    assert grpo_config(["+experiment=[released_grpo,agg_token_mean]"]).actor_rollout_ref.actor.loss_agg_mode == "token-mean"


def test_verl_aggregates_the_paper_equation_per_response():
    """seq-mean-token-mean in verl's agg_loss is 1/G sum_g 1/|y_g| sum_i l_gi (eq. grpo_related); token-mean
    weighs every token alike: with responses of 1 and 3 tokens they differ."""
    import torch
    from verl.trainer.ppo.core_algos import agg_loss

    loss = torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == (4 / 1 + 3 / 3) / 2  # 2.5
    assert agg_loss(loss, mask, "token-mean").item() == (4 + 3) / 4  # 1.75
