"""``python -m recipe.launch {opsd|grpo|sft} [--dry-run] [hydra overrides...]``: what run_*.sh exec.

The environment contract (DEVICE, MODEL_PATH, TRAIN_FILES, ...) is ``recipe.launch.config.Settings``.
On a CPU without MODEL_PATH / TRAIN_FILES the run is a CPU demo (``recipe.toy.cpu_demos``).
``--dry-run`` composes the final hydra config exactly as the launch would, prints the command,
the effective settings and the full resolved config, and starts nothing (no GPU needed: set
``DEVICE=gpu`` to see a GPU launch). A launch whose collapse monitor stops it exits with code 4; one it
rolls back is relaunched from an earlier checkpoint (``recipe.launch.monitor_actions``).
"""

from __future__ import annotations

import os
import sys

from recipe.common.cli import error_line
from recipe.launch.config import RECIPES, Settings, get_recipe
from recipe.launch.monitor_actions import execute_with_actions, relaunch_planner
from recipe.launch.run import config_errors, plan
from recipe.toy.cpu_demos import TrainingFailed, run_demo


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in RECIPES:
        print(f"usage: python -m recipe.launch {{{'|'.join(RECIPES)}}} [--dry-run] [hydra overrides...]", file=sys.stderr)
        return 2
    recipe = get_recipe(args.pop(0))
    dry_run = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    try:
        settings = Settings.from_environ(os.environ)
        if settings.demo is not None:
            return run_demo(recipe, settings, args, dry_run=dry_run)
        launch = plan(recipe, settings, args, dry_run=dry_run)
    except config_errors() as err:  # a start-up check's error carries its own line
        print(error_line(err), file=sys.stderr)
        return 2
    except TrainingFailed as err:  # a demo's training launch failed: the trainer's exit code
        print(err.line, file=sys.stderr)
        return err.exit_code or 1
    except RuntimeError as err:  # another demo stage failed: the message carries the end of its log
        print(f"[launch] {err}", file=sys.stderr)
        return 1
    if launch.finished and not dry_run:  # a relaunch of a finished run: nothing to train (recipe.launch.resume)
        print(launch.finished, flush=True)
        return 0
    print(launch.describe(), flush=True)
    if dry_run:
        print(launch.resolved_yaml(), end="")
        return 0

    try:  # a relaunch the collapse monitor asks for prints its header too
        record = execute_with_actions(launch, replan=relaunch_planner(recipe, settings, args, show=True))
    except config_errors() as err:  # the directory is locked (recipe.launch.lock), a GPU / cluster pre-flight refusal
        print(error_line(err), file=sys.stderr)
        return 2
    if record.get("disk_full"):  # the trainer stopped on a full disk: one line (recipe.launch.disk)
        print(record["disk_full"], file=sys.stderr)
    return record["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
