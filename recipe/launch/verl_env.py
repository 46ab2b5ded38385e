"""What a launch adds to verl's environment (one copy: ``recipe.launch.run`` and the sweep use it).

``verl_environment``: for the RL recipes on every device ``recipe.rollout.extension`` in
``VERL_USE_EXTERNAL_MODULES`` (the guarded weight push, docs/vllm_cpu.md); on a CPU the CPU path's
variables (``recipe.cpu.env``, the plugin first in that list), with ``CPU_ROLLOUT=vllm`` also vLLM-CPU's
(``recipe.cpu.vllm_cpu``); modules the user listed follow, in their order (the tests load their hooks this
way: ``tests/hooks/opsd_test_hooks``). verl imports that list in the driver and every Ray worker, but a
worker inherits the variable only on the driver's node: ``runtime_env_overrides`` passes it to every
worker of the job through Ray's ``runtime_env`` (a cluster started with ``ray start`` on several nodes).
"""

from __future__ import annotations

from collections.abc import Mapping

from recipe.cpu.env import PLUGIN_MODULE, cpu_environment
from recipe.cpu.vllm_cpu import vllm_cpu_environment
from recipe.launch.config import Recipe

ROLLOUT_EXTENSION = "recipe.rollout.extension"
MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
RUNTIME_ENV_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{MODULES_ENV}"


def _modules(value: str | None) -> list[str]:
    return [m.strip() for m in (value or "").split(",") if m.strip()]


def verl_environment(recipe: Recipe, *, device: str, cpu_rollout: str = "hf",
                     environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a launch of ``recipe`` sets on top of ``environ``."""
    env: dict[str, str] = {}
    if device == "cpu":
        env.update(cpu_environment(environ))
        if cpu_rollout == "vllm" and recipe.vllm_platform:
            env.update(vllm_cpu_environment(environ))
    if recipe.vllm_platform:
        listed = _modules(env.get(MODULES_ENV, environ.get(MODULES_ENV)))
        first = [m for m in listed if m == PLUGIN_MODULE] + [ROLLOUT_EXTENSION]
        env[MODULES_ENV] = ",".join(first + [m for m in listed if m not in first])
    return env


def weight_push_path(rollout: str | None, modules: str | None) -> str:
    """How a launch with rollout engine ``rollout`` and external modules ``modules`` pushes the trainer's weights."""
    if rollout == "vllm":
        if ROLLOUT_EXTENSION in _modules(modules):
            return f"guarded vLLM push ({ROLLOUT_EXTENSION})"
        return "verl's vLLM push (unguarded)"
    if rollout == "hf":
        return "the CPU hf rollout's push (recipe.cpu.rollout)"
    return f"verl's {rollout} push"


def runtime_env_overrides(recipe: Recipe, env: Mapping[str, str]) -> list[str]:
    """The hydra override that gives every Ray worker of the job the launch's module list (Ray recipes)."""
    if recipe.torchrun or not env.get(MODULES_ENV):
        return []
    return [f'++{RUNTIME_ENV_KEY}="{env[MODULES_ENV]}"']
