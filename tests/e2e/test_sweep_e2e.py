"""The sweep runner end to end on the CPU: two presets trained, evaluated and tabulated with the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import bound

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_sweep_two_presets_cpu(tiny_model_dir, tiny_data, tmp_path):
    out = tmp_path / "sweep"
    cmd = [
        sys.executable, str(REPO_ROOT / "scripts" / "sweep.py"), "run", "--device", "cpu", "--model", "tiny_cpu",
        "--presets", "default", "divergence_jsd", "--out", str(out),
        "--eval-n", "2", "--eval-limit", "1", "--benchmarks", "aime2024", "--train-timeout", str(bound(240)), "--",
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tiny_data['train']}",
        f"data.val_files={tiny_data['val']}", "data.max_response_length=32",
        "trainer.total_training_steps=1", "trainer.save_freq=1",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_DEDUP_LOGS="0")
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(600))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, beta in (("default", 0.0), ("divergence_jsd", 0.5)):
        run_dir = out / "runs" / name
        assert json.loads((run_dir / "status.json").read_text()) == {"train": "ok", "eval": {"1": "ok"}}
        config = (run_dir / "config.yaml").read_text()
        assert f"beta: {beta}" in config  # the resolved config the run trained from
        assert (run_dir / "checkpoints" / "global_step_1" / "actor").is_dir()
    # each run's rows in order (recipe.launch.data_order): the same data, seed and batch, so one order
    orders = [json.loads((out / "runs" / name / "checkpoints" / "data_order.json").read_text())
              for name in ("default", "divergence_jsd")]
    assert orders[0]["rows"] == 4 and orders[0]["order_sha256"] == orders[1]["order_sha256"]
    rows = json.loads((out / "comparison.json").read_text())
    assert [r["label"] for r in rows] == ["OPSD (default)", "JSD"]
    assert all(r["base"] is not None and r["opsd"] is not None for r in rows)
    table = (out / "comparison.md").read_text()
    assert "| OPSD (default) | 1 | tiny_cpu/think |" in table and "| JSD | 1 | tiny_cpu/think |" in table
