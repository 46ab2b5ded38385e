"""The first-hour GPU check (scripts/gpu_check.py, recipe.tools.gpu_check): composed by --dry-run here (no
GPU), and its judgement of a finished run's metrics and weight-sync probe records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.analysis.memory_model import GiB, ModelShape, UpdateSetting, memory_terms
from recipe.tools.gpu_check import KNOWN_SHAPES, report, run_check

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dry_run_composes_three_opsd_steps_of_qwen3_0p6b_on_vllm_with_the_probe(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OPSD_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    command = next(line for line in done.stdout.splitlines() if line.startswith("[launch] opsd on gpu:"))
    for part in ("-m recipe.opsd.main_opsd", "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
                 "trainer.total_training_steps=3", "actor_rollout_ref.rollout.name=vllm",
                 "actor_rollout_ref.rollout.dtype=float32", "trainer.n_gpus_per_node=1"):
        assert part in command, part
    expected = memory_terms(shape=ModelShape.from_hf_config(KNOWN_SHAPES["Qwen/Qwen3-0.6B"], name="q"),
                            setting=UpdateSetting(n_gpus=1, micro_batch=4, seq_tokens=512 + 256))["peak"] / GiB
    probe_log = tmp_path / "gpu_check" / "Qwen--Qwen3-0.6B" / "sync_probe.jsonl"
    assert (f"[gpu_check] 3 OPSD steps of Qwen/Qwen3-0.6B; weight-sync probe log {probe_log}; memory model "
            f"(actor update per GPU): {expected:.1f} GiB") in done.stdout
    assert not (tmp_path / "gpu_check" / "data").exists()  # a dry run builds nothing


def test_without_a_gpu_the_check_is_refused_in_one_line(tmp_path):
    from recipe.common.cli import InputError

    with pytest.raises(InputError) as refused:
        run_check(cache_dir=tmp_path, detect_gpus=lambda: 0)
    assert refused.value.line == "error: nvidia-smi: lists no GPU on this machine (--dry-run shows the launch without one)"


def _metrics(steps=3):
    return {s: {"step": s, "timing_s/step": 30.0 if s == 1 else 10.0, "timing_s/gen": 4.0, "timing_s/update_actor": 3.0,
                "perf/throughput": 900.0, "response_length/mean": 200.0, "perf/max_memory_allocated_gb": 11.0,
                "perf/max_memory_reserved_gb": 13.0} for s in range(1, steps + 1)}


def _probe(diffs, updates):
    return [{"global_steps": s, "max_abs_logprob_diff": d, **({"update_max_abs_logprob_diff": u} if s else {})}
            for s, (d, u) in enumerate(zip(diffs, updates))]


def test_a_run_in_sync_within_the_memory_model_passes_with_its_table():
    lines, failures = report(_metrics(), _probe([2e-5, 3e-5, 2e-5, 1e-5], [0, 0.1, 0.2, 0.1]), predicted_gib=12.0,
                             samples_per_step=16)
    assert failures == []
    assert "| step | 30.00 | 10.00 |" in lines and "| gen | 4.00 | 4.00 |" in lines
    assert "rollout: generated tokens per second (timing_s/gen, after step 1): 800" in lines  # 200 x 16 / 4
    assert any("allocated 11.0 GiB, reserved 13.0 GiB; memory model (actor update, no CUDA context): 12.0 GiB" in l
               for l in lines)


def test_a_stale_rollout_a_missing_push_and_memory_beyond_the_model_fail():
    _, failures = report(_metrics(), _probe([2e-5, 0.09, 2e-5, 1e-5], [0, 0.1, 0.2, 0.1]), predicted_gib=12.0,
                         samples_per_step=16)
    assert failures == ["after the push of step 1 the rollout differs from the trainer's weights by 9.0e-02, one "
                        "update moves it 1.0e-01: the rollout does not serve the trainer's weights"]
    _, failures = report(_metrics(), _probe([2e-5, 3e-5], [0, 0.1]), predicted_gib=12.0, samples_per_step=16)
    assert failures == ["the probe saw pushes at steps [0, 1], expected start-up and every step"]
    _, failures = report(_metrics(), _probe([0, 0, 0, 0], [0, 1, 1, 1]), predicted_gib=8.0, samples_per_step=16)
    assert failures and "peak reserved memory 13.0 GiB exceeds the memory model's 8.0 GiB" in failures[0]
