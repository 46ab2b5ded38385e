"""The paper's post-training pipeline: SFT -> merge -> GRPO -> merge -> OPSD (docs/launch.md#pipeline).

    python -m recipe.tools.pipeline [--dry-run] [sft:OVERRIDE ...] [grpo:OVERRIDE ...] [opsd:OVERRIDE ...]

Each stage is one launch of ``recipe.launch`` starting from the previous stage's merged checkpoint (OPSD: student
and frozen teacher are both the merged GRPO actor); a stage whose merged directory exists is skipped, so rerunning
continues an interrupted pipeline. Every stage's inputs are checked before the first stage starts (what an earlier
stage makes is not). Environment: BASE_MODEL, SFT_FILES, GRPO_TRAIN_FILES, GRPO_VAL_FILES, OPSD_TRAIN_FILES,
OPSD_VAL_FILES, WORK_DIR (default ``$OPSD_CACHE/checkpoints/pipeline``); on a CPU every stage runs the ``tiny``
demo preset, and whatever is unset is the tiny demo's model and data.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from recipe.common.cli import error_line
from recipe.common.merge import merge_checkpoint
from recipe.launch.checks import LaunchInputError
from recipe.launch.config import Settings, get_recipe
from recipe.launch.run import config_errors, execute, plan
from recipe.toy.cpu_demos import get_demo

STAGES = ("sft", "grpo", "opsd")
# Per-stage variables of the pipeline: (model source, train files, val files).
STAGE_VARIABLES = {"sft": ("BASE_MODEL", "SFT_FILES", None), "grpo": (None, "GRPO_TRAIN_FILES", "GRPO_VAL_FILES"),
                   "opsd": (None, "OPSD_TRAIN_FILES", "OPSD_VAL_FILES")}
RUN_VARIABLES = ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "CKPT_DIR", "STEPS", "CPU_DEMO")


def split_stage_overrides(args: list[str]) -> dict[str, list[str]]:
    """``["sft:a=1", "opsd:+model=x"]`` -> ``{"sft": ["a=1"], "grpo": [], "opsd": ["+model=x"]}``."""
    out: dict[str, list[str]] = {stage: [] for stage in STAGES}
    for arg in args:
        stage, sep, override = arg.partition(":")
        if not sep or stage not in STAGES or not override:
            raise ValueError(f"pipeline argument {arg!r} is not <stage>:<hydra override> with stage in {list(STAGES)}")
        out[stage].append(override)
    return out


def _path(environ, name: str | None) -> str | None:
    value = environ.get(name, "").strip() if name else ""
    return str(Path(value).expanduser().absolute()) if value and Path(value).expanduser().exists() else value or None


def stage_settings(stage: str, base: Settings, environ, *, work_dir: Path) -> Settings:
    """The launch settings of one stage: its model (BASE_MODEL or the previous stage's merge), data, ckpt dir."""
    model_var, train_var, val_var = STAGE_VARIABLES[stage]
    previous = {"grpo": work_dir / "sft_merged", "opsd": work_dir / "grpo_merged"}.get(stage)
    return dataclasses.replace(
        base, model_path=str(previous) if previous else _path(environ, model_var), train_files=_path(environ, train_var),
        val_files=_path(environ, val_var), ckpt_dir=str(work_dir / stage), steps=None,
        cpu_demo="tiny" if base.device == "cpu" else None)


def _stage_plan(stage: str, base: Settings, environ, overrides: list[str], *, work_dir: Path, build: bool,
                dry_run: bool = False):
    """Plan one stage; what an earlier stage (or, unbuilt, the CPU demo) makes is not checked; an input
    error names the pipeline's variable (SFT_FILES, not TRAIN_FILES)."""
    recipe = get_recipe(stage)
    settings = stage_settings(stage, base, environ, work_dir=work_dir)
    demo = get_demo("tiny").load()(stage, settings, build=build).inputs if settings.device == "cpu" else None
    made = {str(work_dir / f"{earlier}_merged") for earlier in STAGES[:STAGES.index(stage)]}
    if demo is not None and not build:
        made |= {p for p in (demo.model_path, demo.train_files, demo.val_files) if p and not Path(p).exists()}
    model_var, train_var, val_var = STAGE_VARIABLES[stage]
    names = {"MODEL_PATH": model_var or "MODEL_PATH", "TRAIN_FILES": train_var, "VAL_FILES": val_var or "VAL_FILES"}
    try:
        return recipe, plan(recipe, settings, overrides, demo=demo, pending=frozenset(made), dry_run=dry_run)
    except LaunchInputError as err:
        raise err.renamed(names) from None


def run_pipeline(args: list[str], environ, *, dry_run: bool) -> int:
    given = [name for name in RUN_VARIABLES if environ.get(name)]
    if given:
        raise ValueError(f"{given} are set per stage by the pipeline: use BASE_MODEL, SFT_FILES, GRPO_TRAIN_FILES, "
                         "GRPO_VAL_FILES, OPSD_TRAIN_FILES, OPSD_VAL_FILES, WORK_DIR")
    overrides = split_stage_overrides(args)
    base = Settings.from_environ(environ)
    work_dir = Path(environ.get("WORK_DIR") or Path(base.cache_dir) / "checkpoints" / "pipeline").expanduser().absolute()
    if base.device == "gpu":
        missing = [name for name in ("BASE_MODEL", "SFT_FILES", "GRPO_TRAIN_FILES", "OPSD_TRAIN_FILES")
                   if not environ.get(name)]
        if missing:
            raise ValueError(f"set {missing} for the GPU pipeline (docs/launch.md)")
    start = time.time()
    todo = [stage for stage in STAGES if stage == "opsd" or not (work_dir / f"{stage}_merged").is_dir()]
    if not dry_run:  # every stage's inputs before the first stage starts (a dry run plans each stage once below)
        for stage in todo:
            _stage_plan(stage, base, environ, overrides[stage], work_dir=work_dir, build=False)
    for stage in STAGES:
        merged = work_dir / f"{stage}_merged"
        if stage not in todo:
            print(f"[pipeline] {stage}: {merged} exists, skipped", flush=True)
            continue
        recipe, launch = _stage_plan(stage, base, environ, overrides[stage], work_dir=work_dir, build=not dry_run,
                                     dry_run=dry_run)
        if launch.finished and not dry_run:  # a stage whose run is finished (its merge is what is left)
            print(launch.finished.replace("[launch]", f"[pipeline] {stage}:", 1), flush=True)
            if stage != "opsd":
                merge_checkpoint(launch.ckpt_dir, merged)
            continue
        print(f"[pipeline] ===== {stage} from {launch.overrides.get(recipe.model_key)} "
              f"({time.strftime('%H:%M:%S', time.gmtime())} UTC) =====", flush=True)
        print(launch.describe(), flush=True)
        if dry_run:
            print(f"[pipeline] {stage} final config:\n{launch.resolved_yaml()}", end="", flush=True)
            continue
        record = execute(launch)
        if record.get("disk_full"):  # the stage stopped on a full disk: one line (recipe.launch.disk)
            print(record["disk_full"].replace("[launch]", f"[pipeline] {stage}:", 1), file=sys.stderr, flush=True)
        if record["exit_code"] != 0:
            return record["exit_code"]
        if stage != "opsd":
            merge_checkpoint(launch.ckpt_dir, merged)
    if not dry_run:
        print(f"[pipeline] done in {time.time() - start:.0f} s; checkpoints in {work_dir}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = "--dry-run" in args
    try:
        return run_pipeline([a for a in args if a != "--dry-run"], os.environ, dry_run=dry_run)
    except config_errors() as err:  # one error line (recipe.launch.checks / resume / lock)
        print(error_line(err), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
