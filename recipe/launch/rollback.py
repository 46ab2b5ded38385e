"""A launch that follows the collapse monitor's actions: stop with an exit code, or roll back and relaunch.

``execute_with_actions(launch, replan=...)`` runs ``execute(launch)``; when the launch ends it reads the
requests the trainer logged in ``<CKPT_DIR>/monitor_actions.jsonl`` during that launch
(``opsd.diagnostics.monitor``: ``stop_on`` / ``rollback_on``; ``recipe.opsd.core.monitor``):

- a stop: the trainer saved the step; the launcher prints the reason and returns exit code 4
  (``STOPPED_EXIT_CODE``);
- a rollback: the saves after the last whole save before the warning window are moved to
  ``CKPT_DIR/rolled_back/rollback_<k>/``, and ``replan(extra)`` plans the relaunch with the resume
  overrides (``recipe.analysis.monitor_actions.relaunch_overrides``: ``trainer.resume_mode=resume_path``
  and ``trainer.resume_from_path``, and for ``rollback_setting=clip_tau`` the new ``opsd.loss.clip_tau``;
  the learning-rate scale is applied by the trainer to the restored optimizer), which then runs the same way.
  After ``max_rollbacks`` rollbacks the trainer turns the next rollback warning into a stop.

A launch that starts from scratch first moves an earlier run's action log aside (its rollbacks are not
this run's). Every action is a console line here (``[launch] monitor ...``) and an ``opsd_monitor/action_*``
metric of its step in the trainer's log.

The relaunch resumes a save written with another ``opsd.loss.clip_tau``:
``recipe.analysis.monitor_actions.rollback_changes`` names the keys the logged rollbacks changed, the documented
exception of the resume check's "same config" rule.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from recipe.analysis.monitor_actions import (
    STOPPED_EXIT_CODE,
    new_actions,
    read_actions,
    relaunch_overrides,
    rotate_stale_log,
    set_aside,
)
from recipe.common.checkpoints import choose_resume_dir
from recipe.launch.run import Launch, execute, next_free_path

RESUME_KEYS = ("trainer.resume_mode=", "trainer.resume_from_path=")


def _resumes(launch: Launch) -> bool:
    trainer = launch.config.trainer
    try:
        folder, _ = choose_resume_dir(resume_mode=str(trainer.get("resume_mode", "auto")),
                                      default_local_dir=str(launch.ckpt_dir),
                                      resume_from_path=trainer.get("resume_from_path"))
    except Exception:  # an unreadable save: the launch's own checks report it
        return True
    return folder is not None


def execute_with_actions(launch: Launch, *, replan: Callable[[list[str]], Launch], log: Path | None = None,
                         on_line=None, timeout_s: float | None = None) -> dict:
    """``execute(launch)``, then the monitor's stop / rollbacks (module docstring). Returns the last launch's
    ``run_times.jsonl`` record with ``monitor_actions``: the actions acted on, in order."""
    if not _resumes(launch):
        stale = rotate_stale_log(launch.ckpt_dir)
        if stale is not None:
            print(f"[launch] monitor: this run starts from scratch; an earlier run's action log moved to {stale}",
                  flush=True)
    seen = len(read_actions(str(launch.ckpt_dir)))
    acted = []
    extra: list[str] = []
    while True:
        record = execute(launch, log=log, on_line=on_line, timeout_s=timeout_s)
        actions = new_actions(launch.ckpt_dir, seen=seen)
        seen += len(actions)
        record["monitor_actions"] = acted
        if record["exit_code"] != 0 or not actions:
            return record
        action = actions[-1]
        acted.append(action.record())
        if action.kind == "stop":
            print(f"[launch] monitor stop at step {action.step}: {action.reason}; the step is saved in "
                  f"{launch.ckpt_dir} (exit code {STOPPED_EXIT_CODE})", flush=True)
            record["exit_code"] = STOPPED_EXIT_CODE
            return record
        target, overrides = relaunch_overrides(action, ckpt_dir=launch.ckpt_dir)
        moved = set_aside(launch.ckpt_dir, after_step=target, rollback=action.rollback)
        extra = [o for o in extra if not o.startswith(RESUME_KEYS)] + overrides
        change = (f"learning rate x{action.value:g}" if action.setting == "lr_scale" else overrides[-1])
        print(f"[launch] monitor rollback {action.rollback} at step {action.step} ({action.signature} warning over "
              f"steps {action.window[0]}-{action.window[1]}): relaunching from "
              f"{'the initial model' if target == 0 else f'step {target}'} with {change}; "
              f"{len(moved)} later save(s) moved to {launch.ckpt_dir / 'rolled_back'}", flush=True)
        metrics = Path(launch.env["VERL_FILE_LOGGER_PATH"])
        launch = replan(extra)
        if Path(launch.env["VERL_FILE_LOGGER_PATH"]) == metrics:  # a path the caller fixed: verl would truncate it
            launch.env["VERL_FILE_LOGGER_PATH"] = str(next_free_path(metrics.with_suffix(""), "jsonl"))
