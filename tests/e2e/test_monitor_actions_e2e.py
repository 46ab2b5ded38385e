"""The collapse monitor's actions end to end on the CPU (``bash recipe/opsd/run_opsd.sh``, tiny model, 1 rank): a
collapse warning (forced at step 3 by the test hook ``monitor_actions_hook``) with ``rollback_on=[collapse]``,
learning rate x0.5 and at most one rollback. The first launch saves step 3 and logs a rollback request; the launcher
moves that save aside and relaunches from the step-2 save; the relaunch scales the restored optimizer's learning
rate by 0.5 (verl's logged ``actor/lr`` of step 3 is half the first launch's), meets the warning again at step 3,
and stops there: exit code 4, one line per action. One launch pair (~2 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.opsd.core.monitor import read_actions
from tests.e2e.conftest import bound

pytestmark = pytest.mark.e2e
REPO_ROOT = Path(__file__).resolve().parents[2]
# the hook forces the warning; the real collapse thresholds are out of reach of the tiny model's 5 steps
ARGS = ["trainer.save_freq=2", "opsd.diagnostics.monitor.early_end=1", "opsd.diagnostics.monitor.recent_window=1",
        "++opsd.diagnostics.monitor.entropy_ratio_threshold=100", "++opsd.diagnostics.monitor.grad_norm_ratio_threshold=100",
        "opsd.diagnostics.monitor.rollback_on=[collapse]", "opsd.diagnostics.monitor.rollback_value=0.5",
        "opsd.diagnostics.monitor.max_rollbacks=1"]


def _steps(path: Path) -> dict[int, dict]:
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out.setdefault(int(record["step"]), {}).update(record["data"])
    return out


def test_a_collapse_warning_rolls_back_once_then_stops(tiny_run_env, tmp_path):
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, **tiny_run_env(ckpt, STEPS="5"), "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "tests" / "e2e"), os.environ.get("PYTHONPATH", "")]),
           "VERL_USE_EXTERNAL_MODULES": "monitor_actions_hook", "MONITOR_HOOK_COLLAPSE_STEPS": "3"}
    env.pop("VERL_FILE_LOGGER_PATH", None)
    out = subprocess.run(["bash", str(REPO_ROOT / "recipe/opsd/run_opsd.sh"), *ARGS], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=bound(600))
    log = out.stdout + out.stderr + (ckpt / "train.log").read_text(errors="replace") if (ckpt / "train.log").exists() \
        else out.stdout + out.stderr
    assert out.returncode == 4, log[-4000:]
    actions = read_actions(str(ckpt))
    assert [(a["action"], a["step"], a["rollback"]) for a in actions] == [("rollback", 3, 1), ("stop", 3, 1)]
    assert "[launch] monitor rollback 1 at step 3 (collapse warning over steps 3-3): relaunching from step 2 with " \
           "learning rate x0.5" in log
    assert "[opsd] collapse monitor action: learning rate x0.5 from step 3" in log
    assert "[launch] monitor stop at step 3" in log and "exit code 4" in log
    # the abandoned step-3 save is aside; the line of saves is 2, 3 (the stop's)
    assert (ckpt / "rolled_back" / "rollback_1" / "global_step_3" / "data.pt").is_file()
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    first, second = _steps(ckpt / "metrics.jsonl"), _steps(ckpt / "metrics.1.jsonl")
    assert sorted(first) == [1, 2, 3] and sorted(second) == [3]
    assert second[3]["actor/lr"] == pytest.approx(0.5 * first[3]["actor/lr"], rel=1e-6)
    assert first[3]["opsd_monitor/action_rollback"] == 1.0 and second[3]["opsd_monitor/action_stop"] == 1.0
    assert second[3]["opsd_monitor/lr_scale"] == 0.5 and second[3]["training/resumed_from_step"] == 2
