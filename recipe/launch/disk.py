"""Disk use of a launch: the size of one checkpoint save, the free space, retention, a full disk.

``plan_disk`` (``recipe.launch.checks.check_launch``: every launch and ``--dry-run``) gives the
``[launch] disk: ...`` line and refuses a save that cannot fit; ``recipe.launch.run`` calls ``prune``
before and after the trainer (retention across the launches of one directory) and ``failure_line``
after a failed launch (a full disk); ``prune_demo_runs`` keeps a CPU demo's last ``DEMO_RUNS_KEPT``
run directories. docs/launch.md#what-a-launch-checks-before-ray.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import (cached_snapshot, check_resumable, hub_cache_dir, parameter_count, step_dirs,
                                       tree_bytes)
from recipe.launch import config as composer
from recipe.launch.checks import teacher_kind_flag
from recipe.launch.config import Recipe

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
ADAM_BYTES = 8
SMALL_FILES = 64 * 1024  # extra_state (scheduler, RNG), data.pt, fsdp_config.json: ~25 KB measured, a margin
DEMO_RUNS_KEPT = 3
_DEMO_RUN = re.compile(r"^\d{8}T\d{6}Z-(?P<recipe>\w+)$")  # <UTC stamp>-<recipe> (recipe.toy demos)


@dataclass(frozen=True)
class SaveSize:
    bytes: int
    parameters: int
    per_parameter: int
    parts: str  # what the bytes per parameter are


@dataclass
class DiskPlan:
    """``note``: the disk line; ``keep``: the retention count (None: every save) of ``keep_key``;
    ``resume_step``: the save the run resumes from (never removed)."""

    note: str
    keep: int | None
    keep_key: str
    resume_step: int | None
    save: SaveSize | None = None
    notes: list[str] = field(default_factory=list)


def retention_key(recipe: Recipe) -> str:
    return "trainer.max_ckpt_to_keep" if recipe.torchrun else "trainer.max_actor_ckpt_to_keep"


def _model_dir(model, environ) -> Path | None:
    path = Path(str(model)).expanduser()
    if path.is_dir():
        return path
    try:
        return cached_snapshot(str(model), hub_cache=hub_cache_dir(environ))
    except Exception:  # not a Hub id either: the input checks name it
        return None


def save_bytes(recipe: Recipe, cfg, *, model_dir: Path | None) -> SaveSize | None:
    """The size of one checkpoint save of ``recipe`` under ``cfg`` (None: the model's size is not known here).

    verl 0.9.1, FSDP: the sharded weights in ``model_dtype`` (fp32: 4 bytes bytes_per_parameter parameter), AdamW's two
    moments in fp32 (8 bytes) when the optimizer is saved, a full HF copy when ``save_contents`` holds
    ``hf_model`` (4 bytes), OPSD's EMA teacher (4 bytes), plus the config and tokenizer files."""
    parameters = parameter_count(model_dir) if model_dir is not None else None
    if not parameters:
        return None
    prefix = "" if recipe.torchrun else "actor_rollout_ref.actor."
    dtype = str(composer.select(cfg, f"{prefix}fsdp_config.model_dtype" if prefix else "engine.model_dtype", "fp32"))
    contents = list(composer.select(cfg, f"{prefix}checkpoint.save_contents", ["model", "optimizer", "extra"]) or [])
    ema_teacher = teacher_kind_flag(composer.select(cfg, "opsd.teacher.kind"), flag="follows_student")
    parts = {f"{dtype} weights": DTYPE_BYTES.get(dtype, 4) if "model" in contents else 0,
             "AdamW state": ADAM_BYTES if "optimizer" in contents else 0,
             "HF copy": 4 if "hf_model" in contents else 0,
             "EMA teacher": 4 if ema_teacher else 0}
    bytes_per_parameter = sum(parts.values())
    # + the config and tokenizer files, and the optimizer's extra state, the dataloader state, fsdp_config.json
    extra = sum(tree_bytes(p) for p in model_dir.iterdir() if p.is_file() and p.suffix not in (".safetensors", ".bin"))
    extra += SMALL_FILES
    return SaveSize(bytes=parameters * bytes_per_parameter + extra, parameters=parameters, per_parameter=bytes_per_parameter,
                    parts=", ".join(name for name, size in parts.items() if size))


def _count(number: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= scale:
            return f"{number / scale:.3g} {unit}"
    return str(number)


def saves_in_run(*, total: int | None, start: int, save_freq: int, last_step_saves: bool) -> int | None:
    """Saves from step ``start`` to ``total`` (verl: every ``save_freq`` steps and the last one)."""
    if total is None:
        return None
    steps = range(start + 1, int(total) + 1)
    saved = {s for s in steps if save_freq > 0 and s % save_freq == 0}
    if steps and (save_freq > 0 or last_step_saves):
        saved.add(int(total))
    return len(saved)


def prunable(ckpt_dir: Path, *, keep: int | None, resume_step: int | None) -> list[tuple[Path, str]]:
    """``(global_step_N, why)`` that ``prune`` removes.

    verl applies ``trainer.max_actor_ckpt_to_keep`` (SFT: ``trainer.max_ckpt_to_keep``) to the saves of one
    launch only, and removes a save's model shards but not its folder. This adds the older saves of earlier
    launches beyond that count, the folders verl emptied, and the partial saves past the one the run
    resumes from (a save interrupted by a full disk or a kill: it is written again); never the save the run
    resumes from."""
    found = step_dirs(ckpt_dir) if Path(ckpt_dir).is_dir() else []
    whole, removable = [], []
    for step, folder in found:
        if step == resume_step:
            whole.append((step, folder))
            continue
        try:
            check_resumable(folder)
        except cli.InputError:
            if resume_step is not None and step > resume_step:
                removable.append((folder, f"a partial save past the resumed step {resume_step} (it is written again)"))
            elif whole or (resume_step is not None and step < resume_step):
                removable.append((folder, "an emptied or partial save older than the last whole one"))
            continue
        if resume_step is None or step <= resume_step:
            whole.append((step, folder))
    if keep is not None and keep > 0:
        kept = [step for step, _ in whole[:keep]]
        removable += [(folder, f"retention keeps the {keep} newest save(s) ({', '.join(f'global_step_{s}' for s in kept)})")
                for step, folder in whole[keep:] if step != resume_step]
    return removable


def plan_disk(recipe: Recipe, cfg, *, ckpt_dir: Path, resume_step: int | None, environ) -> DiskPlan:
    """The disk line of a launch (the size one save writes, ``save_bytes``; the free space of the checkpoint
    directory's file system; how many saves retention keeps); raises NoSpaceError (exit 2) when one save
    cannot fit, counting what retention removes first (``prunable``)."""
    keep_key = retention_key(recipe)
    keep = composer.select(cfg, keep_key)
    keep = int(keep) if keep not in (None, "null") else None
    save = save_bytes(recipe, cfg, model_dir=_model_dir(composer.select(cfg, recipe.model_key), environ))
    free = cli.free_bytes(ckpt_dir)
    removable = prunable(ckpt_dir, keep=keep, resume_step=resume_step)
    freed = sum(tree_bytes(folder) for folder, _ in removable)
    freq = int(composer.select(cfg, "trainer.save_freq", -1) or -1)
    count = saves_in_run(total=composer.select(cfg, "trainer.total_training_steps"), start=resume_step or 0,
                         save_freq=freq, last_step_saves=recipe.torchrun)
    where = f"{cli.human_bytes(free)} free in {cli.existing_ancestor(ckpt_dir)}"
    if freed:
        where += f" (+{cli.human_bytes(freed)} of older saves retention removes first)"
    retention = (f"{keep_key}={keep} keeps the last {keep}" if keep else f"{keep_key}=null keeps every save")
    plan = DiskPlan(note="", keep=keep, keep_key=keep_key, resume_step=resume_step, save=save)
    if count == 0:
        plan.note = f"disk: no checkpoint saves (trainer.save_freq={freq}); {where}"
        return plan
    if save is None:
        plan.note = (f"disk: the size of one checkpoint save is not known before {recipe.model_key} is downloaded; "
                     f"{where}; {retention}")
        return plan
    size = cli.human_bytes(save.bytes)
    plan.note = (f"disk: one checkpoint save ~{size} ({_count(save.parameters)} parameters x {save.per_parameter} "
                 f"bytes: {save.parts}); {where}; {retention}")
    if save.bytes > free + freed:
        raise cli.NoSpaceError(
            f"one checkpoint save needs ~{size}, {cli.human_bytes(free + freed)} free there", file=ckpt_dir,
            hint="free space, or set CKPT_DIR to a file system with room")
    run_saves = count if keep is None else min(count, keep + 1)
    if count and save.bytes * run_saves > free + freed:
        plan.notes.append(
            f"the run's {count} saves need ~{cli.human_bytes(save.bytes * run_saves)} with {keep_key}={keep}, more "
            f"than the {cli.human_bytes(free + freed)} free: it will stop at a save when the disk is full; free space "
            f"or keep fewer saves ({keep_key}=1)")
    return plan


def prune(ckpt_dir: Path, plan: DiskPlan, *, log=print) -> int:
    """Remove what ``prunable`` lists (each removal printed); return the bytes freed."""
    freed = 0
    for folder, why in prunable(ckpt_dir, keep=plan.keep, resume_step=plan.resume_step):
        size = tree_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)
        freed += size
        log(f"[launch] removed {folder} ({cli.human_bytes(size)}): {why}")
    return freed


def failure_line(ckpt_dir: Path, plan: DiskPlan, *, log_text: str = "") -> str | None:
    """After a failed launch: one line when a save failed on a full disk (the partial save, the space one save
    needs, the last whole save to resume from); None otherwise."""
    free = cli.free_bytes(ckpt_dir)
    need = plan.save.bytes if plan.save else None
    full = any(text in log_text for text in cli.FULL_DISK_TEXTS) or (need is not None and free < need)
    if not full:
        return None
    tracker = Path(ckpt_dir) / "latest_checkpointed_iteration.txt"
    last = tracker.read_text().strip() if tracker.is_file() else None
    last = last if last and last.isdigit() else None
    partial = [folder.name for step, folder in step_dirs(ckpt_dir) if last is None or step > int(last)]
    stopped = f"the save {partial[0]} stopped part-way" if partial else "a write stopped part-way"
    needs = f"one save needs ~{cli.human_bytes(need)}, " if need is not None else ""
    resume = (f"the last whole save global_step_{last} is intact: free space and run the same command to resume from it"
              if last else "no whole save yet: free space and run the same command")
    return cli.NoSpaceError(f"no space left: {stopped} ({needs}{cli.human_bytes(free)} free)", file=ckpt_dir,
                            hint=f"{resume}, or keep fewer saves: {plan.keep_key}=1").line


def prune_demo_runs(run_dir: Path, *, recipe: str, keep: int = DEMO_RUNS_KEPT, log=print) -> None:
    """Keep the ``keep`` newest ``<stamp>-<recipe>`` run directories next to ``run_dir`` (this one included)."""
    parent = Path(run_dir).parent
    if not parent.is_dir():
        return
    runs = sorted((p for p in parent.iterdir() if p.is_dir() and p != Path(run_dir)
                   and (m := _DEMO_RUN.match(p.name)) and m["recipe"] == recipe), reverse=True)
    for old in runs[keep - 1:]:
        size = tree_bytes(old)
        shutil.rmtree(old, ignore_errors=True)
        log(f"[launch] removed the old demo run {old} ({cli.human_bytes(size)}): the {recipe} demo keeps its "
            f"{keep} latest runs in {parent} (copy one elsewhere to keep it)")
