"""recipe/grpo_baseline/config/grpo_trainer.yaml and released_grpo.yaml against the paper's GRPO runs,
sentence by sentence (a changed value of ours fails; the CPU platform: tests/cpu/test_platform.py)."""

from recipe.launch.compose import compose
from recipe.launch.recipes import get_recipe


def grpo_config(overrides=()):
    return compose(get_recipe("grpo"), list(overrides))


def test_grpo_yaml_matches_the_paper_control():
    cfg = grpo_config()
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    # app:grpo_configuration, sentence by sentence
    assert cfg.algorithm.adv_estimator == "grpo"
    assert actor.ppo_epochs == 1  # one PPO epoch per update
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)  # DAPO clip ratios
    assert actor.loss_agg_mode == "token-mean"
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
    assert cfg.data.max_prompt_length == 1024 and cfg.data.filter_overlong_prompts is True
    assert cfg.data.train_batch_size == 16 and actor.ppo_mini_batch_size == 8
    assert actor.optim.lr == 5e-7 and cfg.data.max_response_length == 20480
    assert cfg.trainer.total_training_steps == 100 and cfg.trainer.save_freq == 25
    assert cfg.data.seed == 42  # the paper's seed of its other stages (it states none for this run)
    assert "file" in cfg.trainer.logger  # timing_s/* per step in the metrics jsonl


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


def test_grpo_runs_on_the_opsd_recipes_trainer():
    """Both recipes on verl's legacy RayPPOTrainer (OPSD refuses use_v1=true), so a compute
    comparison compares algorithms, not trainers; every preset keeps it."""
    for overrides in ([], ["+experiment=released_grpo"], ["+demo=tiny"], ["+demo=toy"]):
        assert grpo_config(overrides).trainer.use_v1 is False, overrides
    assert compose(get_recipe("opsd"), []).trainer.use_v1 is False
