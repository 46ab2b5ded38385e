"""The collapse monitor's action log, read after a launch: what the launcher does next.

The OPSD trainer appends one json line per stop / rollback request to ``<checkpoint dir>/monitor_actions.jsonl``
(``recipe.opsd.core.monitor``: the decision, ``MonitorAction``). After the launch ends the launcher
(``recipe.launch.rollback``) reads the requests this launch made (``new_actions``) and, for a rollback,
resumes from ``rollback_target`` of the whole saves before the warning window with ``relaunch_overrides``.
The saves of the abandoned steps are moved aside (``set_aside``), so that the run directory holds one
line of checkpoints (what a later resume, the merge and the checkpoint selection read).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import check_resumable
from recipe.opsd.core.monitor import (
    ACTIONS_FILE,
    ROLLBACK_OVERRIDES,
    STOPPED_EXIT_CODE,
    MonitorAction,
    read_actions,
    rollback_target,
)

__all__ = ["ACTIONS_FILE", "ROLLBACK_OVERRIDES", "STOPPED_EXIT_CODE", "MonitorAction", "read_actions", "whole_saves", "new_actions",
           "relaunch_overrides", "rollback_changes", "set_aside", "rotate_stale_log", "TRACKER"]

TRACKER = "latest_checkpointed_iteration.txt"  # verl's record of the newest save
SET_ASIDE = "rolled_back"  # <ckpt>/rolled_back/rollback_<k>/global_step_<s>: the saves a rollback abandoned


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
