"""Rollouts that overlap training, in the launcher: an ``async_training`` block checked before Ray
and the entry point it needs.

``+experiment=async_one_step_off`` / ``+experiment=async_fully`` (recipe/opsd/config/experiment,
recipe/grpo_baseline/config/experiment) add the block. The OPSD entry point runs every mode itself;
a GRPO launch with the block starts ``recipe.async_rl.main_grpo`` (verl's one-step-off / fully-async
trainers) instead of ``verl.trainer.main_ppo``. A wrong value is one line, exit 2, in a ``--dry-run`` too.
"""

from __future__ import annotations

import dataclasses

from recipe.async_rl.config import async_settings, derived_values
from recipe.launch import config as composer
from recipe.launch.config import Recipe

# recipes whose synchronous entry point cannot run an async block -> the one that can
ASYNC_ENTRY = {"grpo": "recipe.async_rl.main_grpo"}


def launch_recipe(recipe: Recipe, cfg) -> Recipe:
    """``recipe``, with the async entry point when ``cfg`` has an ``async_training.mode``; ValueError
    (one line) for a wrong block or a recipe without a rollout."""
    if composer.select(cfg, "async_training.mode") is None:
        return recipe
    if not recipe.vllm_platform:  # no rollout (SFT)
        raise ValueError(f"async_training: the {recipe.name} recipe has no rollout to overlap")
    derived_values(cfg, async_settings(cfg, opsd=recipe.name == "opsd"))  # raises AsyncConfigError (a ValueError)
    if recipe.name in ASYNC_ENTRY:
        return dataclasses.replace(recipe, module=ASYNC_ENTRY[recipe.name])
    return recipe
