"""Compose a recipe's final config with hydra, as verl will, without starting anything.

- ``compose(recipe, overrides)``: the DictConfig verl's entry point builds from the same overrides;
  ``with_values(cfg, overrides)``: that config with more value overrides, without composing again.
- ``token_budget_fixes(cfg, recipe)``: dynamic-batching token budgets derived from the caps
  (a budget below one full sequence aborts verl mid-run; budgets are never hard-coded).
- ``missing(cfg)``: mandatory (``???``) values left unset.
- ``summary(cfg, recipe)``: the settings a reader checks first, one line each.
"""

from __future__ import annotations

from collections.abc import Sequence

from recipe.launch.recipes import Recipe


def compose(recipe: Recipe, overrides: Sequence[str]):
    """The recipe's config with ``overrides`` applied (unresolved, like hydra hands it to verl)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(recipe.config_dir), version_base=None):
        return hydra_compose(config_name=recipe.config_name, overrides=list(overrides))


def with_values(cfg, overrides: Sequence[str]):
    """A copy of the composed ``cfg`` with value overrides (``key=v``, ``+key=v``, ``++key=v``) applied the way
    hydra applies them at the end of a composition: the config ``compose`` gives with them appended
    (tests/launch/test_compose.py), one composition less when a launch derives values from a first one."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(cfg)
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key, value = override.key_or_group, override.value()
        if override.is_delete() or override.package is not None:
            raise ValueError(f"with_values: {override.input_line!r} is not a value override")
        if override.is_add() and OmegaConf.select(cfg, key, throw_on_missing=False) is not None \
                and not isinstance(value, (dict, list)):
            raise ValueError(f"with_values: {override.input_line!r} adds {key}, which the config has")
        OmegaConf.update(cfg, key, value, merge=True, force_add=override.is_add() or override.is_force_add())
    return cfg


def select(cfg, key: str, default=None):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=default)


def _disabled(cfg, key: str) -> bool:
    """True when a parent node of ``key`` has ``enable: false`` (verl leaves such nodes' ``???`` unset)."""
    parts = key.split(".")
    return any(select(cfg, ".".join(parts[:i] + ["enable"])) is False for i in range(1, len(parts)))


def missing(cfg) -> list[str]:
    """Mandatory values (``???``) still unset, ignoring disabled sub-configs.

    The keys ``OmegaConf.missing_keys`` names, found on the plain container (15x faster on a verl config)."""
    from omegaconf import MISSING, OmegaConf

    def walk(node, prefix: str):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, f"{prefix}.{key}" if prefix else str(key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from walk(value, f"{prefix}[{index}]")
        elif node == MISSING:
            yield prefix

    keys = walk(OmegaConf.to_container(cfg, resolve=False), "")
    return sorted(key for key in keys if not _disabled(cfg, key))


def token_budget_fixes(cfg, recipe: Recipe) -> list[tuple[str, int, str]]:
    """``(key, value, why)`` for every dynamic-batching token budget below one full sequence.

    RL recipes: a sequence is ``data.max_prompt_length + data.max_response_length`` tokens; the
    actor's ``ppo_max_token_len_per_gpu`` and the log-prob passes' budgets must hold one.
    SFT: ``data.max_token_len_per_gpu`` must hold one ``data.max_length`` row (verl's SFT engine
    asserts it per micro-batch). Budgets already large enough are kept (a preset may raise them).
    """
    if recipe.torchrun:
        need = int(select(cfg, "data.max_length"))
        checks = [("data.use_dynamic_bsz", "data.max_token_len_per_gpu")]
        why = f"= data.max_length {need}"
    else:
        prompt, response = int(select(cfg, "data.max_prompt_length")), int(select(cfg, "data.max_response_length"))
        need = prompt + response
        why = f"= data.max_prompt_length {prompt} + data.max_response_length {response}"
        checks = [
            ("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
            ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"),
            ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"),
        ]
    fixes = []
    for flag, budget in checks:
        value = select(cfg, budget)
        if select(cfg, flag) and value is not None and int(value) < need:
            fixes.append((budget, need, f"{why} (was {value})"))
    return fixes


SUMMARY_KEYS = {
    "rl": (
        "actor_rollout_ref.model.path", "data.train_files", "data.val_files", "trainer.device",
        "trainer.nnodes", "trainer.n_gpus_per_node", "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.tensor_model_parallel_size", "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.n", "data.max_prompt_length", "data.max_response_length",
        "actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.temperature", "data.seed",
        "trainer.total_training_steps", "trainer.save_freq", "trainer.resume_mode", "trainer.experiment_name",
        "trainer.default_local_dir", "trainer.logger",
    ),
    "sft": (
        "model.path", "data.train_files", "trainer.device", "trainer.nnodes", "trainer.n_gpus_per_node",
        "data.train_batch_size", "data.max_length", "data.use_dynamic_bsz", "data.max_token_len_per_gpu",
        "optim.lr", "trainer.seed", "trainer.total_training_steps", "trainer.save_freq", "trainer.experiment_name",
        "trainer.default_local_dir", "trainer.logger",
    ),
}


def summary(cfg, recipe: Recipe) -> str:
    """``key = value`` lines (resolved) of the settings that define the run, plus the ``opsd`` block."""
    from omegaconf import OmegaConf

    keys = list(SUMMARY_KEYS["sft" if recipe.torchrun else "rl"])
    if select(cfg, "opsd") is not None:
        flat = OmegaConf.to_container(cfg.opsd, resolve=True)
        keys += [f"opsd.{k}" for k in _flatten(flat)]
    width = max(len(k) for k in keys)
    lines = []
    for key in keys:
        value = select(cfg, key, default="<unset>")
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        lines.append(f"  {key:<{width}} = {value}")
    return "\n".join(lines)


def _flatten(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            keys += _flatten(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys
