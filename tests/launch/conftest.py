"""Fixtures of the launcher tests: real inputs, since every launch checks them before Ray starts.

- ``launch_inputs``: ``LaunchInputs`` built once per session: ``model`` (the tiny Qwen3 directory,
  ``recipe.models.tiny``), ``train`` / ``val`` (verl RL parquets of the CPU demo ``tiny``), ``sft``
  (its ``messages`` parquet), ``hub_cache`` (a Hugging Face cache holding the ``config.json`` of
  every Hub id the recipes' presets name, so a preset's model counts as downloaded without a
  network) and ``env`` (HF_HUB_CACHE = that cache, HF_HUB_OFFLINE=1: pass it as a launch's
  environment, ``plan(..., environ=launch_inputs.env)``).
- autouse: this process is offline (``huggingface_hub.constants.HF_HUB_OFFLINE``), so that a start-up
  check that loads a preset's tokenizer fails at once instead of retrying the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LaunchInputs:
    model: Path
    train: Path
    val: Path
    sft: Path
    hub_cache: Path

    @property
    def env(self) -> dict[str, str]:
        return {"HF_HUB_CACHE": str(self.hub_cache), "HF_HUB_OFFLINE": "1"}


def preset_hub_ids() -> set[str]:
    """Hub ids the recipes' presets name (``model_preset.hf_id``, ``opsd.teacher.path``)."""
    ids = set()
    for path in REPO_ROOT.glob("recipe/*/config/*/*.yaml"):
        cfg = OmegaConf.load(path)
        for key in ("model_preset.hf_id", "opsd.teacher.path"):
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
            if isinstance(value, str) and value.count("/") == 1 and not value.startswith(("/", ".", "$")):
                ids.add(value)
    return ids


def fake_hub_cache(root: Path, repo_ids) -> Path:
    """A Hugging Face cache in which each of ``repo_ids`` has a snapshot holding a ``config.json``."""
    for repo_id in repo_ids:
        repo = root / f"models--{repo_id.replace('/', '--')}"
        commit = "0" * 40
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return root


@pytest.fixture(scope="session")
def launch_inputs(tmp_path_factory) -> LaunchInputs:
    from recipe.models.tiny import build_tiny_model
    from recipe.toy.demo import write_tiny_data

    root = tmp_path_factory.mktemp("launch_inputs")
    model = build_tiny_model(root / "model", seed=0)
    data = write_tiny_data(root / "data")
    return LaunchInputs(model=Path(model), train=Path(data["train"]), val=Path(data["val"]), sft=Path(data["sft"]),
                        hub_cache=fake_hub_cache(root / "hub", preset_hub_ids()))


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def fake_save(ckpt_dir: Path, step: int, model: Path, *, sft: bool = False, tracker: bool = True,
              data: bool = True) -> Path:
    """A whole verl save ``ckpt_dir/global_step_<step>`` of ``model`` as ``check_resumable`` sees it (empty
    torch files), the tracker file naming it; ``data=False``: a save interrupted before its dataloader state."""
    import shutil

    import torch

    folder = Path(ckpt_dir) / f"global_step_{step}"
    shards = folder if sft else folder / "actor"
    (shards / "huggingface").mkdir(parents=True, exist_ok=True)
    torch.save({}, shards / "model_world_size_1_rank_0.pt")
    (shards / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model / name, shards / "huggingface" / name)
    if data:
        torch.save({}, folder / ("data_0.pt" if sft else "data.pt"))
    if tracker:
        (Path(ckpt_dir) / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


@pytest.fixture(scope="session")
def make_save():
    """``make(ckpt_dir, step, model, sft=False, tracker=True, data=True) -> global_step_<step>`` (``fake_save``)."""
    return fake_save
