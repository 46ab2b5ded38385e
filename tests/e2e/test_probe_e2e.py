"""The compatibility probe end to end on the CPU (``scripts/probe.py`` on the tiny demo): the frozen signals and one
cell's K monitored OPSD steps through the launcher, the verdict with its indicators and thresholds, the outputs.
The validation against full runs needs a demo with a held-out evaluation (toy, real): docs/results/probe.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import bound

from recipe.experiments.probe import Cell

REPO_ROOT = Path(__file__).resolve().parents[2]
VERDICTS = {"gain", "ineffective length growth", "stable degradation", "collapse", "no measurable effect"}


@pytest.mark.e2e
def test_probe_of_the_configs_cell_on_the_tiny_demo(tmp_path):
    out = tmp_path / "probe"
    env = dict(os.environ, CPU_DEMO="tiny", OPSD_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", RAY_DEDUP_LOGS="0")
    cmd = [sys.executable, "scripts/probe.py", "--out-dir", str(out), "--steps", "4", "--batch", "2",
           "--signal-prompts", "2"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(400))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    result = json.loads((out / "probe.json").read_text())
    (cell,) = result["cells"]  # no axis given: the config's own cell
    assert cell["cell"] == {"context": "full_solution", "student_mode": "think", "teacher_mode": "think",
                            "clip_tau": 0.05, "temperature": 1.1}
    # the K steps ran through the launcher at the probe's batch, each logged
    assert [row["step"] for row in cell["rows"] if "opsd/loss" in row] == [1, 2, 3, 4]
    assert cell["rollouts_per_step"] == 2 and len(cell["step_times_s"]) == 4
    assert cell["indicators"]["early_steps"] and cell["indicators"]["late_steps"]
    # the frozen signals of the same cell, measured on the training prompts
    frozen = cell["frozen"]
    assert frozen["rollouts"] == 4 and math.isfinite(frozen["fwd_kl"]) and frozen["fwd_kl"] >= 0
    verdict = cell["verdict"]
    assert verdict["verdict"] in VERDICTS and verdict["reasons"]
    for reason in verdict["reasons"]:
        assert {"indicator", "value", "threshold", "source"} <= set(reason), reason
    assert cell["cost"]["cell_s"] >= cell["cost"]["launch_s"] > 0 and cell["cost"]["probe_steps"] == 4
    assert set(result["recommendation"]) >= {"cell", "why"}
    text = (out / "probe.md").read_text()
    assert f"| {cell['name']} |" in text and "recommendation:" in text and "thresholds:" in text
    assert (out / "probe.png").stat().st_size > 0
    assert (out / "cells" / Cell(**cell["cell"]).slug / "train.log").is_file()  # verl's output of the K steps
    # a second probe into the same directory would overwrite it: refused with one line, exit 2
    again = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(120))
    assert again.returncode == 2 and "probe.json" in again.stderr and "Traceback" not in again.stderr, again.stderr
