"""The CPU platform (hydra group ``platform`` + ``recipe.cpu.env``) changes machinery, never the algorithm.

Each recipe's resolved config with and without ``+platform=...`` is diffed key by key: the keys that
change must all be machinery (kernels, FSDP flavour, offload, rollout backend, worker counts,
placeholder devices, batching by count). A platform entry that touched the learning rate, a
temperature, a cap or a loss option would fail here. Composing against the installed verl schema
also catches a key verl renamed.
"""

import pytest
from omegaconf import OmegaConf

from recipe.cpu.env import PLUGIN_MODULE, cpu_environment
from recipe.launch.config import compose, get_recipe

RL_MACHINERY = {
    "actor_rollout_ref.model.override_config.attn_implementation", "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.use_remove_padding", "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.actor.fsdp_config.strategy", "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "actor_rollout_ref.ref.strategy",
    "actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
    "critic.use_dynamic_bsz", "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "distillation.teacher_models.teacher_model.inference.name", "actor_rollout_ref.rollout.agent.num_workers",
    "actor_rollout_ref.rollout.n_gpus_per_node", "reward.num_workers",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units", "trainer.device", "trainer.nnodes",
    "trainer.n_gpus_per_node", "ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.num_cpus",
    "ray_kwargs.ray_init.include_dashboard", "data.dataloader_num_workers",
    # compute precision (fp32 on a CPU: bf16 is emulated there), a kernel choice, not an algorithm setting
    *(f"actor_rollout_ref.{role}.fsdp_config.mixed_precision.{key}" for role in ("actor", "ref")
      for key in ("param_dtype", "reduce_dtype", "buffer_dtype")),
}
# verl's vLLM engine on the CPU (platform/cpu_vllm.yaml): eager mode, no sleep mode, engine step size.
VLLM_MACHINERY = RL_MACHINERY | {
    "actor_rollout_ref.rollout.enforce_eager", "actor_rollout_ref.rollout.free_cache_engine",
    "actor_rollout_ref.rollout.enable_sleep_mode", "actor_rollout_ref.rollout.max_num_batched_tokens",
}
SFT_MACHINERY = {
    "model.override_config.attn_implementation", "model.use_remove_padding", "engine.strategy",
    "engine.use_torch_compile", "trainer.device", "trainer.nnodes", "trainer.n_gpus_per_node", "data.num_workers",
    *(f"engine.mixed_precision.{key}" for key in ("param_dtype", "reduce_dtype", "buffer_dtype")),
}


def _flat(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


@pytest.mark.parametrize(("recipe", "platform", "machinery"), [
    ("opsd", "cpu", RL_MACHINERY), ("grpo", "cpu", RL_MACHINERY), ("sft", "cpu_sft", SFT_MACHINERY),
    ("opsd", "cpu_vllm", VLLM_MACHINERY), ("grpo", "cpu_vllm", VLLM_MACHINERY),
])
@pytest.mark.slow
def test_platform_changes_only_machinery(recipe, platform, machinery):
    spec = get_recipe(recipe)
    assert platform in (spec.platform, spec.vllm_platform)
    plain = _flat(OmegaConf.to_container(compose(spec, []), resolve=True))
    cpu = _flat(OmegaConf.to_container(compose(spec, [f"+platform={platform}"]), resolve=True))
    changed = {k for k in plain.keys() | cpu.keys() if plain.get(k, "<absent>") != cpu.get(k, "<absent>")}
    assert changed, "the platform changed nothing"
    assert changed <= machinery, sorted(changed - machinery)
    assert cpu["trainer.device"] == "cpu"
    # FSDP computes in fp32 on a CPU (bf16 is emulated 5-8x slower without avx512_bf16 / AMX)
    dtypes = {k: v for k, v in cpu.items() if ".mixed_precision." in k}
    assert len(dtypes) == (3 if recipe == "sft" else 6) and set(dtypes.values()) == {"fp32"}, dtypes


@pytest.mark.slow
def test_cpu_vllm_is_the_cpu_platform_with_verls_vllm_engine():
    spec = get_recipe("grpo")
    cpu = _flat(OmegaConf.to_container(compose(spec, ["+platform=cpu"]), resolve=True))
    vllm = _flat(OmegaConf.to_container(compose(spec, ["+platform=cpu_vllm"]), resolve=True))
    changed = {k for k in cpu.keys() | vllm.keys() if cpu.get(k, "<absent>") != vllm.get(k, "<absent>")}
    # the rollout engine (verl's distillation teacher engine interpolates it) and the vLLM options only
    assert changed == VLLM_MACHINERY - RL_MACHINERY | {
        "actor_rollout_ref.rollout.name", "distillation.teacher_models.teacher_model.inference.name"}
    assert vllm["actor_rollout_ref.rollout.name"] == "vllm" and vllm["actor_rollout_ref.rollout.enable_sleep_mode"] is False


@pytest.mark.slow
def test_ray_gpus_follow_the_ranks():
    cfg = compose(get_recipe("grpo"), ["+platform=cpu", "trainer.n_gpus_per_node=2"])
    assert cfg.ray_kwargs.ray_init.num_gpus == 2 and cfg.actor_rollout_ref.rollout.name == "hf"


def test_cpu_environment_lists_the_plugin_first_and_keeps_the_users_choices():
    env = cpu_environment({})
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_ENGINE_DEVICE"] == "cuda" and env["HF_HUB_OFFLINE"] == "1"
    assert env["RAY_prestart_worker_first_driver"] == "0"  # a Ray system config: read by the raylet the driver starts
    assert env["VERL_USE_EXTERNAL_MODULES"] == PLUGIN_MODULE and env["WANDB_MODE"] == "offline"
    mine = cpu_environment({"VERL_USE_EXTERNAL_MODULES": f"my.ext,{PLUGIN_MODULE}", "WANDB_MODE": "disabled"})
    assert mine["VERL_USE_EXTERNAL_MODULES"] == f"{PLUGIN_MODULE},my.ext" and mine["WANDB_MODE"] == "disabled"
