"""The compatibility probe end to end on the CPU (``scripts/probe.py`` on the tiny demo): the frozen signals and four
cells' K monitored OPSD steps in one launch (``probe.cells`` on ``recipe.probe.main_cells``), the verdicts with their
indicators and thresholds, the outputs. The validation against full runs needs a demo with a held-out evaluation
(toy, real): docs/results/probe.md.

The cells (greedy rollouts: top-k 1): the full-solution context at temperature 1 and the ``none`` context at 0.5, each
without a clip and with a clip tau of 1e-6 that caps every entry. Each cell starts from the initial student on the same
batches, so the ``none`` cells, whose teacher is the initial student reading the student's own prompt, have a forward KL
of exactly 0 at their first step although the cells before them trained the student; the clipped full-solution cell's
step 1 has the unclipped cell's forward KL (the same samples of the same weights) and a smaller loss (the workers
switched the loss). The rollout server logs the temperature of every request (``opsd_test_hooks.rollout``): verl's
agent loop sampled each cell at its own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opsd_test_hooks import launch_env
from tests.e2e.conftest import bound

REPO_ROOT = Path(__file__).resolve().parents[2]
VERDICTS = {"gain", "ineffective length growth", "stable degradation", "collapse", "no measurable effect"}


@pytest.mark.e2e
def test_probe_of_four_cells_in_one_launch_on_the_tiny_demo(tmp_path):
    out = tmp_path / "probe"
    requests = tmp_path / "requests.jsonl"
    env = dict(os.environ, CPU_DEMO="tiny", OPSD_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", RAY_DEDUP_LOGS="0",
               **launch_env("opsd_test_hooks.rollout", OPSD_TEST_ROLLOUT_REQUESTS_LOG=str(requests)))
    cells_spec = [f"{context},think:think,{tau},{t}" for context, t in (("full_solution", 1.0), ("none", 0.5))
                  for tau in ("none", "1e-6")]
    cmd = [sys.executable, "scripts/probe.py", "--out-dir", str(out), "--steps", "4", "--batch", "2",
           "--signal-prompts", "2", *[arg for spec in cells_spec for arg in ("--cell", spec)],
           "--", "actor_rollout_ref.rollout.top_k=1"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(400))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    result = json.loads((out / "probe.json").read_text())
    cells = result["cells"]
    assert [(c["cell"]["context"], c["cell"]["clip_tau"], c["cell"]["temperature"]) for c in cells] == [
        ("full_solution", None, 1.0), ("full_solution", 1e-6, 1.0), ("none", None, 0.5), ("none", 1e-6, 0.5)]
    sampled = [json.loads(line)["temperature"] for line in requests.read_text().splitlines()]
    assert sampled == [1.0] * 16 + [0.5] * 16  # 4 cells x 4 steps x 2 prompts, each cell at its temperature
    assert {c["launch_dir"] for c in cells} == {str(out / "launches" / "1")} and cells[0]["launch_cells"] == 4
    train_log = (out / "launches" / "1" / "train.log").read_text()  # verl's output of the 16 steps
    assert all(f"[opsd] cell {i}/4: steps {4 * i - 3}-{4 * i}," in train_log for i in range(1, 5)), train_log[-3000:]
    for index, cell in enumerate(cells):  # each cell's K steps, logged, at the probe's batch
        steps = [row for row in cell["rows"] if "opsd/loss" in row]
        assert [row["step"] for row in steps] == [1, 2, 3, 4] and {row["opsd/cell"] for row in steps} == {index}
        assert cell["rollouts_per_step"] == 2 and len(cell["step_times_s"]) == 4
        assert cell["indicators"]["early_steps"] and cell["indicators"]["late_steps"]
        verdict = cell["verdict"]
        assert verdict["verdict"] in VERDICTS and verdict["reasons"]
        for reason in verdict["reasons"]:
            assert {"indicator", "value", "threshold", "source"} <= set(reason), reason
        # the launch's wall time shared by its four cells, plus each cell's share of the frozen signals
        assert cell["cost"]["cell_s"] >= cell["cost"]["launch_s"] > 0 and cell["cost"]["probe_steps"] == 4
        frozen = cell["frozen"]  # measured on the training prompts
        assert frozen["rollouts"] == 4 and math.isfinite(frozen["fwd_kl"]) and frozen["fwd_kl"] >= 0

    first = {name: [row for row in c["rows"] if "opsd/loss" in row][0] for name, c in zip("ABCD", cells)}
    assert first["A"]["opsd/fwd_kl"] > 0 and first["A"]["opsd/loss"] == pytest.approx(first["A"]["opsd/fwd_kl"], rel=1e-6)
    assert first["B"]["opsd/fwd_kl"] == pytest.approx(first["A"]["opsd/fwd_kl"], rel=1e-6, abs=1e-12)
    assert first["B"]["opsd/loss"] < 0.5 * first["B"]["opsd/fwd_kl"]
    trained = [row["opsd/fwd_kl"] for row in cells[0]["rows"] if "opsd/loss" in row]
    assert trained[-1] != trained[0]  # the first cell moved the student before the none cells started
    for name in "CD":  # not 0 after: Adam turns the rounding noise of a zero gradient (~1e-8) into full steps
        assert first[name]["opsd/fwd_kl"] == 0.0
    assert set(result["recommendation"]) >= {"cell", "why"}
    text = (out / "probe.md").read_text()
    assert all(f"| {c['name']} |" in text for c in cells) and "recommendation:" in text and "thresholds:" in text
    assert (out / "probe.png").stat().st_size > 0
    # a second probe into the same directory would overwrite it: refused with one line, exit 2
    again = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(120))
    assert again.returncode == 2 and "probe.json" in again.stderr and "Traceback" not in again.stderr, again.stderr
