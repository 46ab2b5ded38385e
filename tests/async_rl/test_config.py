"""The ``async_training`` block: parsing, refusals, and the verl values each mode derives, on the
recipes' composed configs (both recipes, both presets, GPU and the CPU platform)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.async_rl.config import (
    CPU_CHECKPOINT_BACKEND,
    AsyncConfigError,
    AsyncSettings,
    apply_derived,
    async_settings,
    derived_values,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"opsd": (REPO / "recipe/opsd/config", "opsd_trainer"),
           "grpo": (REPO / "recipe/grpo_baseline/config", "grpo_trainer")}


def _compose(recipe: str, *overrides: str):
    config_dir, name = CONFIGS[recipe]
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_no_block_is_the_synchronous_trainer():
    assert async_settings(_compose("opsd"), opsd=True) is None
    assert async_settings(OmegaConf.create({"async_training": {"staleness_threshold": 1}}), opsd=False) is None


@pytest.mark.parametrize("recipe", sorted(CONFIGS))
@pytest.mark.slow
def test_one_step_off_preset_derives_the_rollout_pool_and_on_cpu_the_weight_push(recipe):
    cfg = _compose(recipe, "+experiment=async_one_step_off")
    settings = async_settings(cfg, opsd=recipe == "opsd")
    assert settings == AsyncSettings(mode="one_step_off", opsd=recipe == "opsd")
    gpu = {key: value for key, value, _ in derived_values(cfg, settings)}
    assert gpu == {"actor_rollout_ref.rollout.nnodes": 1, "actor_rollout_ref.rollout.n_gpus_per_node": 1}
    cpu = _compose(recipe, "+experiment=async_one_step_off", "+platform=cpu", "trainer.n_gpus_per_node=2")
    values = {key: value for key, value, _ in derived_values(cpu, settings)}
    assert values["actor_rollout_ref.rollout.checkpoint_engine.backend"] == CPU_CHECKPOINT_BACKEND
    assert values["ray_kwargs.ray_init.num_gpus"] == 3  # 2 training ranks + 1 rollout replica


@pytest.mark.parametrize("recipe, prompts, mini, batches", [("opsd", 32, 32, 1), ("grpo", 16, 8, 2)])
def test_fully_async_keeps_prompts_per_step_and_steps(recipe, prompts, mini, batches):
    cfg = _compose(recipe, "+experiment=async_fully", "trainer.total_training_steps=7")
    settings = async_settings(cfg, opsd=recipe == "opsd")
    assert (settings.mode, settings.staleness_threshold) == ("fully_async", 1.0)
    lines = apply_derived(cfg, settings)
    assert all(line.startswith("[async] fully_async: ") for line in lines)
    assert cfg.data.train_batch_size == 0 and cfg.data.gen_batch_size == 1
    # the mini-batch was an interpolation of data.train_batch_size in the OPSD yaml: resolved before it became 0
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == mini
    assert cfg.async_training.require_batches == batches
    # verl's rollouter: total_train_steps = total_rollout_steps / (mini x require_batches x trigger) = 7
    assert cfg.rollout.total_rollout_steps == 7 * prompts
    assert cfg.rollout.total_rollout_steps // (mini * batches) == 7


@pytest.mark.parametrize("block, opsd, match", [
    ({"mode": "two_step_off"}, False, "async_training.mode='two_step_off' is not one of"),
    ({"mode": "fully_async", "staleness_threshold": -1}, False, "staleness_threshold=-1.0 must be >= 0"),
    ({"mode": "fully_async", "trigger_parameter_sync_step": 0}, False, "must be >= 1"),
    ({"mode": "fully_async", "trigger_parameter_sync_step": 2}, True, "the OPSD step pushes the weights after every"),
])
def test_wrong_values_are_one_line(block, opsd, match):
    with pytest.raises(AsyncConfigError, match=match) as err:
        async_settings(OmegaConf.create({"async_training": block}), opsd=opsd)
    assert "\n" not in err.value.line


def test_fully_async_needs_whole_mini_batches_per_step():
    cfg = _compose("grpo", "+experiment=async_fully", "data.train_batch_size=12")
    with pytest.raises(AsyncConfigError, match="data.train_batch_size=12 .*ppo_mini_batch_size=8"):
        derived_values(cfg, async_settings(cfg, opsd=False))


POOLS = {"actor_rollout_ref.hybrid_engine", "actor_rollout_ref.rollout.checkpoint_engine.backend",
         "actor_rollout_ref.rollout.free_cache_engine", "async_training.mode", "rollout.n_gpus_per_node", "rollout.nnodes"}
FULLY = POOLS | {f"async_training.{key}" for key in (
    "concurrent_samples_per_replica", "partial_rollout", "require_batches", "staleness_threshold",
    "trigger_parameter_sync_step", "use_dynamic_resource_scheduling", "use_trainer_do_validate")} | {
    "data.gen_batch_size", "rollout.total_rollout_steps"}
PRESET_KEYS = {
    ("opsd", "async_one_step_off"): POOLS,
    ("opsd", "async_fully"): FULLY,
    ("grpo", "async_one_step_off"): POOLS,
    ("grpo", "async_fully"): FULLY,
}


def _flat(node, prefix=""):
    if isinstance(node, dict):
        out = {} if node else {prefix[:-1]: {}}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


@pytest.mark.slow
@pytest.mark.parametrize("recipe, preset", sorted(PRESET_KEYS))
def test_each_preset_changes_only_the_machinery_of_its_mode(recipe, preset):
    base = _flat(OmegaConf.to_container(_compose(recipe), resolve=True))
    cfg = _flat(OmegaConf.to_container(_compose(recipe, f"+experiment={preset}"), resolve=True))
    absent = object()
    assert {k for k in set(base) | set(cfg) if base.get(k, absent) != cfg.get(k, absent)} == PRESET_KEYS[(recipe, preset)]
    text = (CONFIGS[recipe][0] / "experiment" / f"{preset}.yaml").read_text()
    assert text.startswith("# @package _global_\n# ")
