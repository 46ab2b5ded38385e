"""Rollouts that overlap training: the ``async_training`` block, checked, and what it implies (no verl import).

``async_settings(cfg, opsd=...)`` reads the block (``mode``: ``one_step_off`` or ``fully_async``; no block:
the synchronous trainer). ``derived_values`` / ``apply_derived`` set the keys an async launch derives from
the user's, so that ``data.train_batch_size`` (prompts per step) and ``trainer.total_training_steps`` mean
the same run in every mode; the entry points (``recipe.async_rl.main_grpo``, ``recipe.opsd.main_opsd``)
apply them before Ray starts and print each. The modes and each setting: the commented presets
``+experiment=async_one_step_off`` / ``+experiment=async_fully`` and docs/opsd_recipe.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipe.common.cli import InputError

MODES = ("one_step_off", "fully_async")
# the CPU path's trainer-to-rollout weight push across pools (recipe.cpu.checkpoint_engine)
CPU_CHECKPOINT_BACKEND = "object_store"
CPU_CHECKPOINT_MODULE = "recipe.cpu.checkpoint_engine"


class AsyncConfigError(InputError):
    """An ``async_training`` block that cannot work (its message begins with the setting)."""


@dataclass(frozen=True)
class AsyncSettings:
    """The project's reading of the ``async_training`` block (verl's keys plus ``mode``).

    mode: one_step_off | fully_async. staleness_threshold: fully_async only, >= 0 (verl's semantics: the
    rollout may produce ``(1 + staleness_threshold)`` steps' worth of samples per weight version; 0 = every
    sample from the current weights, the synchronous schedule on separate pools).
    trigger_parameter_sync_step: optimizer steps between weight pushes (fully_async; 1 = after every
    step). opsd: the OPSD recipe (its step is one optimizer step per batch).
    """

    mode: str
    staleness_threshold: float = 0.0
    trigger_parameter_sync_step: int = 1
    opsd: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise AsyncConfigError(f"async_training.mode={self.mode!r} is not one of {list(MODES)} (remove the block for the "
                                   "synchronous trainer)")
        if self.staleness_threshold < 0:
            raise AsyncConfigError(f"async_training.staleness_threshold={self.staleness_threshold} must be >= 0 (0 = synchronous)")
        if self.trigger_parameter_sync_step < 1:
            raise AsyncConfigError(f"async_training.trigger_parameter_sync_step={self.trigger_parameter_sync_step} must be >= 1")
        if self.opsd and self.trigger_parameter_sync_step != 1:
            raise AsyncConfigError(f"async_training.trigger_parameter_sync_step={self.trigger_parameter_sync_step}: the OPSD step "
                                   "pushes the weights after every optimizer step; use 1")


def _select(cfg, key: str, default=None):
    node = cfg
    for part in key.split("."):
        if node is None:
            return default
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # an interpolation that does not resolve here
            return default
    return default if node is None else node


def async_settings(cfg, *, opsd: bool) -> AsyncSettings | None:
    """The run's ``AsyncSettings``; None without an ``async_training.mode`` (the synchronous trainer)."""
    block = _select(cfg, "async_training")
    if block is None or _select(block, "mode") is None:
        return None
    return AsyncSettings(
        mode=str(_select(block, "mode")),
        staleness_threshold=float(_select(block, "staleness_threshold", 0.0)),
        trigger_parameter_sync_step=int(_select(block, "trigger_parameter_sync_step", 1)),
        opsd=opsd,
    )


def derived_values(cfg, settings: AsyncSettings) -> list[tuple[str, Any, str]]:
    """``(key, value, why)`` for every value an async launch derives from ``cfg`` (resolved numbers)."""
    derived: list[tuple[str, Any, str]] = []
    rollout_nodes, rollout_gpus = int(_select(cfg, "rollout.nnodes", 1)), int(_select(cfg, "rollout.n_gpus_per_node", 1))
    derived += [
        ("actor_rollout_ref.rollout.nnodes", rollout_nodes, "the rollout pool (rollout.nnodes)"),
        ("actor_rollout_ref.rollout.n_gpus_per_node", rollout_gpus, "the rollout pool (rollout.n_gpus_per_node)"),
    ]
    if _select(cfg, "trainer.device") == "cpu":
        trainer_gpus = int(_select(cfg, "trainer.n_gpus_per_node", 1)) * int(_select(cfg, "trainer.nnodes", 1))
        derived += [
            ("actor_rollout_ref.rollout.checkpoint_engine.backend", CPU_CHECKPOINT_BACKEND,
             "the CPU weight push between pools (no NCCL)"),
            ("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module", CPU_CHECKPOINT_MODULE,
             "registers that backend in every process"),
            ("ray_kwargs.ray_init.num_gpus", trainer_gpus + rollout_nodes * rollout_gpus,
             "placeholder Ray GPUs for the training and the rollout pool"),
        ]
    if settings.mode != "fully_async":
        return derived
    prompts = int(_select(cfg, "data.train_batch_size"))
    mini = int(_select(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size"))
    if prompts <= 0 or mini <= 0 or prompts % mini:
        raise AsyncConfigError(f"async_training.mode=fully_async trains data.train_batch_size={prompts} prompts per step in mini-batches "
                               f"of actor_rollout_ref.actor.ppo_mini_batch_size={mini}: the first must be a positive "
                               "multiple of the second")
    steps = int(_select(cfg, "trainer.total_training_steps"))
    return derived + [
        ("actor_rollout_ref.actor.ppo_mini_batch_size", mini, "resolved before data.train_batch_size becomes 0"),
        ("async_training.require_batches", prompts // mini, f"{prompts} prompts per step (data.train_batch_size)"),
        ("rollout.total_rollout_steps", steps * prompts * settings.trigger_parameter_sync_step,
         f"trainer.total_training_steps={steps} steps of {prompts} prompts"),
        ("data.train_batch_size", 0, "verl's rollouter feeds one prompt at a time"),
        ("data.gen_batch_size", 1, "verl's rollouter feeds one prompt at a time"),
    ]


def apply_derived(cfg, settings: AsyncSettings) -> list[str]:
    """Set ``derived_values`` on the OmegaConf ``cfg`` (in place); returns one printable line per value."""
    from omegaconf import open_dict

    lines = []
    values = derived_values(cfg, settings)
    with open_dict(cfg):
        for key, value, why in values:
            node = cfg
            for part in key.split(".")[:-1]:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
            node[key.split(".")[-1]] = value
            lines.append(f"[async] {settings.mode}: {key}={value} ({why})")
    return lines
