"""The launcher's actions on the collapse monitor's decisions: stop with an exit code, or roll back and relaunch.

The OPSD trainer decides (``recipe.opsd.core.monitor``: ``stop_on`` / ``rollback_on``) and appends one request per
decision to ``<CKPT_DIR>/monitor_actions.jsonl``. ``execute_with_actions(launch, replan=...)`` runs the launch and
then acts on the requests of that launch: a stop returns ``STOPPED_EXIT_CODE`` (the step is saved); a rollback moves
the saves after the last whole save before the warning window to ``CKPT_DIR/rolled_back/rollback_<k>/`` and
relaunches from that save with the rollback's change (``relaunch_overrides``; ``relaunch_planner``). A launch that
starts from scratch first moves an earlier run's action log aside. Every action is a console line here and an
``opsd_monitor/action_*`` metric of its step (docs/analysis.md#collapse-monitor).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import check_resumable, choose_resume_dir
from recipe.launch.config import Recipe, Settings
from recipe.launch.run import DemoInputs, Launch, execute, next_free_path, plan
from recipe.opsd.core.monitor import (
    ACTIONS_FILE,
    ROLLBACK_OVERRIDES,
    STOPPED_EXIT_CODE,
    MonitorAction,
    read_actions,
    rollback_target,
)

TRACKER = "latest_checkpointed_iteration.txt"  # verl's record of the newest save
SET_ASIDE = "rolled_back"  # <ckpt>/rolled_back/rollback_<k>/global_step_<s>: the saves a rollback abandoned
RESUME_KEYS = ("trainer.resume_mode=", "trainer.resume_from_path=")


def whole_saves(ckpt_dir: str | Path) -> dict[int, Path]:
    """``{step: global_step_<step>}`` of the saves in ``ckpt_dir`` a resume can use (``check_resumable``)."""
    out = {}
    for folder in Path(ckpt_dir).glob("global_step_*"):
        suffix = folder.name.removeprefix("global_step_")
        if not suffix.isdigit():
            continue
        try:
            out[int(suffix)] = check_resumable(folder)
        except cli.InputError:
            continue
    return dict(sorted(out.items()))


def new_actions(ckpt_dir: str | Path, *, seen: int) -> list[MonitorAction]:
    """The actions logged after the first ``seen`` records."""
    return [MonitorAction.from_record(record) for record in read_actions(str(ckpt_dir))[seen:]]


def relaunch_overrides(action: MonitorAction, *, ckpt_dir: str | Path) -> tuple[int, list[str]]:
    """(the step the rollback resumes from, the hydra overrides of its relaunch): resume from the last whole save
    before the warning window (step 0: the initial model, no resume) and, for ``clip_tau``, the new value. The
    learning-rate scale needs no override: the trainer applies it to the restored optimizer."""
    if action.kind != "rollback":
        raise ValueError(f"relaunch_overrides: action {action.kind!r} is not a rollback")
    target = rollback_target(whole_saves(ckpt_dir), window_start=action.window[0])
    if target == 0:
        overrides = ["trainer.resume_mode=disable"]
    else:
        overrides = ["trainer.resume_mode=resume_path",
                     f"trainer.resume_from_path={Path(ckpt_dir).absolute() / f'global_step_{target}'}"]
    if action.setting in ROLLBACK_OVERRIDES:
        value = "null" if action.value is None else action.value
        overrides.append(f"{ROLLBACK_OVERRIDES[action.setting]}={value}")
    return target, overrides


def relaunch_planner(recipe: Recipe, settings: Settings, argv: Sequence[str], *, demo: DemoInputs | None = None,
                     show: bool = False) -> Callable[[list[str]], Launch]:
    """The ``replan`` of ``execute_with_actions``: the launch of ``argv`` planned again with a rollback's overrides
    appended (``show``: its header printed). The monitor's own change of a setting is the point of the relaunch: the
    resume check lists it instead of refusing it (``resume_with_changes``)."""

    def replan(extra: list[str]) -> Launch:
        again = plan(recipe, dataclasses.replace(settings, resume_with_changes=True), [*argv, *extra], demo=demo)
        if show:
            print(again.describe(), flush=True)
        return again

    return replan


def set_aside(ckpt_dir: str | Path, *, after_step: int, rollback: int) -> list[Path]:
    """Move the saves past ``after_step`` to ``rolled_back/rollback_<k>/`` and point verl's tracker at
    ``after_step`` (removed when 0), so a later ``resume_mode=auto`` resumes the rolled-back line. Returns the
    moved directories."""
    root = Path(ckpt_dir)
    moved = []
    for folder in sorted(root.glob("global_step_*")):
        suffix = folder.name.removeprefix("global_step_")
        if suffix.isdigit() and int(suffix) > after_step:
            target = root / SET_ASIDE / f"rollback_{rollback}" / folder.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(folder), str(target))
            moved.append(target)
    tracker = root / TRACKER
    if after_step > 0:
        tracker.write_text(str(after_step))
    elif tracker.exists():
        tracker.unlink()
    return moved


def rollback_changes(ckpt_dir: str | Path) -> set[str]:
    """The config keys the logged rollbacks of ``ckpt_dir`` changed: what a resume of its saves may differ in from the
    launch that wrote them (the learning-rate scale changes no key: the trainer applies it)."""
    return {ROLLBACK_OVERRIDES[record["setting"]] for record in read_actions(str(ckpt_dir))
            if record.get("action") == "rollback" and record.get("setting") in ROLLBACK_OVERRIDES}


def rotate_stale_log(ckpt_dir: str | Path) -> Path | None:
    """A launch that starts from scratch in ``ckpt_dir``: an earlier run's action log becomes
    ``monitor_actions.<n>.jsonl`` (its rollbacks are not this run's). Returns the new name, if any."""
    log = Path(ckpt_dir) / ACTIONS_FILE
    if not log.is_file():
        return None
    n = 1
    while (target := log.with_name(f"monitor_actions.{n}.jsonl")).exists():
        n += 1
    log.rename(target)
    return target


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
    """``execute(launch)``, then the monitor's stop / rollbacks (module docstring); after ``max_rollbacks`` rollbacks
    the trainer turns the next rollback warning into a stop. Returns the last launch's ``run_times.jsonl`` record
    with ``monitor_actions``: the actions acted on, in order."""
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
