"""The pipeline's dry run: every stage composed, each starting from the previous stage's merged model."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.tools.pipeline import split_stage_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu_env(launch_inputs, tmp_path):
    """The GPU pipeline's variables on real inputs (every stage's inputs are checked before the first starts)."""
    grpo, ot_val = tmp_path / "dapo.parquet", tmp_path / "ot_val.parquet"
    grpo.write_bytes(launch_inputs.train.read_bytes())
    ot_val.write_bytes(launch_inputs.val.read_bytes())
    return {"DEVICE": "gpu", "BASE_MODEL": str(launch_inputs.model), "SFT_FILES": str(launch_inputs.sft),
            "GRPO_TRAIN_FILES": str(grpo), "OPSD_TRAIN_FILES": str(launch_inputs.train), "OPSD_VAL_FILES": str(ot_val),
            "NGPUS": "8", **launch_inputs.env}


def _dry_run(tmp_path, *args, **env):
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", "scripts/pipeline_sft_grpo_opsd.sh", "--dry-run", *args], cwd=REPO_ROOT, env=full,
                          capture_output=True, text=True, timeout=180)


def _stage_configs(stdout: str) -> dict:
    """The resolved yaml each stage prints after ``[pipeline] <stage> final config:``, by stage."""
    configs = {}
    for block in stdout.split("[pipeline] ")[1:]:
        head, _, rest = block.partition("\n")
        if head.endswith(" final config:"):
            configs[head.split()[0]] = OmegaConf.create(rest)
    return configs


@pytest.mark.slow
def test_gpu_pipeline_chains_the_merged_checkpoints(tmp_path, gpu_env):
    work = tmp_path / "work"
    proc = _dry_run(tmp_path, "grpo:trainer.save_freq=50", "opsd:+model=qwen3_4b", WORK_DIR=str(work), **gpu_env)
    assert proc.returncode == 0, proc.stderr
    configs = _stage_configs(proc.stdout)
    assert list(configs) == ["sft", "grpo", "opsd"]
    sft, grpo, opsd = configs["sft"], configs["grpo"], configs["opsd"]
    assert sft.model.path == gpu_env["BASE_MODEL"] and sft.data.train_files == gpu_env["SFT_FILES"]
    assert sft.trainer.default_local_dir == str(work / "sft") and sft.data.max_token_len_per_gpu == 12288
    assert grpo.actor_rollout_ref.model.path == str(work / "sft_merged") and grpo.trainer.save_freq == 50
    assert grpo.data.train_files == grpo.data.val_files == gpu_env["GRPO_TRAIN_FILES"]
    assert grpo.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 1024 + 20480
    assert opsd.actor_rollout_ref.model.path == str(work / "grpo_merged")  # student = teacher = GRPO actor
    assert opsd.data.val_files == gpu_env["OPSD_VAL_FILES"] and opsd.model_preset.name == "qwen3_4b"
    assert not work.exists()  # a dry run creates nothing

    (work / "sft_merged").mkdir(parents=True)  # a finished stage is skipped on rerun
    again = _dry_run(tmp_path, WORK_DIR=str(work), **gpu_env)
    assert "[pipeline] sft: " in again.stdout and "skipped" in again.stdout
    assert list(_stage_configs(again.stdout)) == ["grpo", "opsd"]


@pytest.mark.slow
def test_gpu_pipeline_requires_its_data_and_refuses_run_variables(tmp_path, gpu_env):
    proc = _dry_run(tmp_path, DEVICE="gpu", BASE_MODEL="/models/base")
    assert proc.returncode == 2 and "SFT_FILES" in proc.stderr
    proc = _dry_run(tmp_path, MODEL_PATH="/m", **gpu_env)
    assert proc.returncode == 2 and "set per stage by the pipeline" in proc.stderr
    proc = _dry_run(tmp_path, **{**gpu_env, "OPSD_VAL_FILES": str(tmp_path / "missing.parquet")})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: data.val_files={tmp_path / 'missing.parquet'} (OPSD_VAL_FILES): no such data file "
        "(set OPSD_VAL_FILES to an existing parquet file)")


def test_stage_overrides_are_routed():
    assert split_stage_overrides(["sft:a=1", "opsd:+model=x", "opsd:b=2"]) == {
        "sft": ["a=1"], "grpo": [], "opsd": ["+model=x", "b=2"]}
    with pytest.raises(ValueError, match="<stage>:<hydra override>"):
        split_stage_overrides(["a=1"])
