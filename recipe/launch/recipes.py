"""What the launcher knows about each recipe: its hydra config, its verl entry point, its keys.

    opsd   recipe/opsd/config/opsd_trainer.yaml           python -m recipe.opsd.main_opsd
    grpo   recipe/grpo_baseline/config/grpo_trainer.yaml  python -m verl.trainer.main_ppo
    sft    recipe/sft/config/sft_trainer.yaml             torchrun -m verl.trainer.sft_trainer
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REWARD_FUNCTION = REPO_ROOT / "recipe" / "common" / "reward.py"


@dataclass(frozen=True)
class Recipe:
    """One trainer the launcher starts.

    config_dir / config_name: the hydra config (its groups: model, experiment, demo; platform
    from recipe/cpu/config). module: the verl entry point run with ``python -m``.
    platform: the CPU option of the ``platform`` group. model_key / train_key / val_key: where
    MODEL_PATH / TRAIN_FILES / VAL_FILES go. torchrun: launched by torchrun, one process per GPU
    (verl's SFT trainer). reward: the project's grader is the verl reward (RL recipes).
    vllm_platform: the CPU option with verl's vLLM rollout (CPU_ROLLOUT=vllm); None for a recipe
    without a rollout (SFT), which has no use for the guarded weight push either (recipe.launch.verl_env).
    startup_checks: ``"module:function"`` the recipe's entry point runs before Ray starts; the launcher
    runs it too, on the resolved final config of every launch and ``--dry-run`` (named by string: the
    launcher imports no recipe). It raises an error whose ``line`` attribute (else its text) is shown.
    """

    name: str
    config_dir: Path
    config_name: str
    module: str
    platform: str
    model_key: str
    train_key: str
    val_key: str | None
    torchrun: bool = False
    reward: bool = True
    vllm_platform: str | None = None
    startup_checks: str | None = None

    def command(self, python: str, overrides: Sequence[str], *, nproc: int = 1) -> list[str]:
        """The argv that starts the trainer with ``overrides`` (each key once)."""
        config = [f"--config-path={self.config_dir}", f"--config-name={self.config_name}"]
        if self.torchrun:
            return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    "-m", self.module, *config, *overrides]
        return [python, "-m", self.module, *config, *overrides]

    def run_startup_checks(self, cfg):
        """The recipe's start-up checks on a resolved copy of ``cfg`` (none when it has none); returns that
        copy as the checks completed it (e.g. the chat-template switch OPSD derives from its student mode)."""
        import importlib

        from omegaconf import OmegaConf

        resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        if self.startup_checks is not None:
            module, function = self.startup_checks.split(":")
            getattr(importlib.import_module(module), function)(resolved)
        return resolved

    def reward_overrides(self) -> list[str]:
        if not self.reward:
            return []
        return [f"reward.custom_reward_function.path={REWARD_FUNCTION}", "reward.custom_reward_function.name=compute_score"]

    def presets(self, group: str) -> list[str]:
        """Option names of a config group of this recipe (``model``, ``experiment``, ``demo``)."""
        return sorted(p.stem for p in (self.config_dir / group).glob("*.yaml"))


RECIPES = {
    recipe.name: recipe
    for recipe in (
        Recipe("opsd", REPO_ROOT / "recipe" / "opsd" / "config", "opsd_trainer", "recipe.opsd.main_opsd", "cpu",
               "actor_rollout_ref.model.path", "data.train_files", "data.val_files", vllm_platform="cpu_vllm",
               startup_checks="recipe.opsd.startup:startup_checks"),
        Recipe("grpo", REPO_ROOT / "recipe" / "grpo_baseline" / "config", "grpo_trainer", "verl.trainer.main_ppo",
               "cpu", "actor_rollout_ref.model.path", "data.train_files", "data.val_files", vllm_platform="cpu_vllm"),
        Recipe("sft", REPO_ROOT / "recipe" / "sft" / "config", "sft_trainer", "verl.trainer.sft_trainer", "cpu_sft",
               "model.path", "data.train_files", None, torchrun=True, reward=False),
    )
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; one of {sorted(RECIPES)}")
    return RECIPES[name]
