"""Test hook (``PYTHONPATH=tests/e2e VERL_USE_EXTERNAL_MODULES=monitor_actions_hook``): the collapse monitor reports
a collapse warning at the steps listed in ``MONITOR_HOOK_COLLAPSE_STEPS`` (comma-separated), whatever the metrics,
so that an end-to-end run exercises the monitor's actions (rollback, relaunch, stop) on the tiny model."""

import os

from recipe.opsd.core import monitor

STEPS_ENV = "MONITOR_HOOK_COLLAPSE_STEPS"
_original = monitor.TrainingDynamicsMonitor._check


def _check(self, step):
    out, fired = _original(self, step)
    steps = {int(s) for s in os.environ.get(STEPS_ENV, "").split(",") if s.strip()}
    if step in steps and self.recent_rows():
        out[f"{monitor.MONITOR_PREFIX}/collapse_warning"] = 1.0
        fired = [*fired, ("collapse", f"test hook: collapse warning at step {step}")]
    return out, fired


monitor.TrainingDynamicsMonitor._check = _check
