"""A relaunch on a checkpoint directory: a finished run is not trained again, another config is not resumed.

verl resumes from the newest save of ``trainer.default_local_dir`` (``trainer.resume_mode=auto``), then
trains one more step whatever the step count, and resumes a save with whatever config it is given.
``check_resume(...)`` (``recipe.launch.checks.check_launch``) decides before Ray starts: a finished run
exits 0; a config that differs from the one of the launch that wrote the save (``reference_config``) in
a key a relaunch may not change (``may_change``) is refused, one line per key. docs/launch.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recipe.common.checkpoints import dataloader_state
from recipe.common.cli import InputError
from recipe.launch.config import Override, Recipe

CONFIG_GLOB = "launch_config*.yaml"
ANYWAY_VARIABLE = "RESUME_WITH_CHANGES"
# Keys a relaunch may change and still resume its checkpoint: the step count, what is logged and
# where, the checkpoint / validation cadence and retention, the resume mode.
MAY_CHANGE = {
    "trainer.total_training_steps", "trainer.total_epochs",  # the step count
    "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.log_val_generations",
    "trainer.log_fingerprints",  # the logger
    "trainer.save_freq", "trainer.test_freq", "trainer.val_before_train", "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep", "trainer.resume_mode",  # cadence, retention
}
# ... whole sections: Ray's start-up options (the launcher's runtime_env), the sweep runner's labels,
# the OPSD diagnostics (the monitor, step dumps, the pre-flight gate, the non-finite guard)
MAY_CHANGE_PREFIXES = ("ray_kwargs.", "sweep.", "opsd.diagnostics.")
# ... the logger's names wherever verl copies them (actor_rollout_ref.rollout.trace.experiment_name)
MAY_CHANGE_NAMES = ("project_name", "experiment_name")
# ... and the paths: every key naming a file or directory (a moved model, data set or repository)
PATH_SUFFIXES = ("path", "_dir", "_files")
# the mark of a continuation preset (recipe/opsd/config/experiment/steps_300_continued.yaml): the keys it sets may change
CONTINUATION_MARK = "sweep.continue_from"
SHOWN = 20  # differing keys listed at most


@dataclass
class Resume:
    """What a launch does with its checkpoint directory: ``finished`` (the line to print, then exit 0),
    ``notes`` (printed with the launch header), ``reference`` (the config compared with)."""

    step: int | None = None
    finished: str | None = None
    reference: Path | None = None
    notes: list[str] = field(default_factory=list)


class ConfigChangedError(InputError):
    """The launch would resume a save written with another config (``detail``: the changed settings)."""


def flatten(tree, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}, "c": [1, 2]} -> {"a.b": 1, "c": [1, 2]}`` (lists are values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def step_of(folder: Path) -> int:
    return int(Path(folder).name.removeprefix("global_step_"))


def reference_config(resume_dir: Path) -> Path | None:
    """The ``launch_config*.yaml`` of the launch that wrote ``resume_dir``, or None (a run started by verl
    directly, a copied directory: not compared).

    Every launch writes its resolved config to ``launch_config[.N].yaml`` in its checkpoint directory when it
    starts (``recipe.launch.run.execute``) and holds the directory's lock while it runs (``recipe.launch.lock``),
    so the launches of one directory never overlap: the save of step N was written by the last launch that
    started before it, i.e. the newest ``launch_config*.yaml`` older than the save's dataloader state (the
    last file of a save)."""
    run_dir = Path(resume_dir).parent
    state = dataloader_state(resume_dir)
    saved = (state or Path(resume_dir)).stat().st_mtime_ns
    configs = [(path.stat().st_mtime_ns, path) for path in run_dir.glob(CONFIG_GLOB)]
    older = [item for item in configs if item[0] <= saved]
    return max(older)[1] if older else None


def continuation_keys(recipe: Recipe, overrides: Sequence[str]) -> set[str]:
    """Keys set by the command line's continuation presets (a preset file holding ``sweep.continue_from``)."""
    from omegaconf import OmegaConf

    keys: set[str] = set()
    for text in overrides:
        item = Override.parse(text)
        if not item.is_group or item.value is None:
            continue
        group = item.key.split("@")[0]
        for name in item.value.strip("[]").split(","):
            path = recipe.config_dir / group / f"{name.strip()}.yaml"
            if not path.is_file():
                continue
            tree = OmegaConf.to_container(OmegaConf.load(path))
            tree.pop("defaults", None)
            flat = flatten(tree)
            if any(key == CONTINUATION_MARK or key.startswith(CONTINUATION_MARK + ".") for key in flat):
                keys |= set(flat)
    return keys


def may_change(key: str, allowed: set[str]) -> bool:
    last = key.rsplit(".", 1)[-1]
    return (key in MAY_CHANGE or key in allowed or key.startswith(MAY_CHANGE_PREFIXES) or last in MAY_CHANGE_NAMES
            or last.endswith(PATH_SUFFIXES))


def config_changes(reference: dict, current: dict, *, allowed: set[str] = frozenset()) -> list[tuple[str, object, object]]:
    """``(key, reference value, current value)`` of every differing key a relaunch may not change."""
    old, new = flatten(reference), flatten(current)
    missing = object()
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, missing), new.get(key, missing)
        if before != after and not may_change(key, allowed):
            changes.append((key, "(not set)" if before is missing else before, "(not set)" if after is missing else after))
    return changes


def check_resume(recipe: Recipe, cfg, *, resume_dir: Path | None, ckpt_dir: Path, overrides: Sequence[str],
                 anyway: bool = False) -> Resume:
    """What a relaunch on ``resume_dir`` (from ``recipe.launch.checks``) does; raises ConfigChangedError when refusing.

    - the save is at or past ``trainer.total_training_steps``: the run is finished; ``finished`` says so (the
      step and the save) and the launch exits 0 without training (raising ``STEPS`` continues it);
    - the resolved config of the launch that wrote it (``reference_config``) differs from this launch's in a
      key a relaunch may not change (``may_change``): refused, one line per differing key, with the way to
      start fresh (another ``CKPT_DIR``) or to resume anyway (``RESUME_WITH_CHANGES=1``, ``anyway``).
    """
    if resume_dir is None:
        return Resume()
    from omegaconf import OmegaConf

    step = step_of(resume_dir)
    resume = Resume(step=step, reference=reference_config(resume_dir))
    if resume.reference is None:
        resume.notes.append(f"resuming {resume_dir}: no launch_config*.yaml of the launch that wrote it in "
                            f"{resume_dir.parent}, so its config is not compared with this one")
    else:
        current = OmegaConf.to_container(cfg, resolve=True)
        changes = config_changes(OmegaConf.to_container(OmegaConf.load(resume.reference)), current,
                                 allowed=continuation_keys(recipe, overrides))
        if changes and anyway:
            resume.notes.append(f"resuming {resume_dir} with {len(changes)} setting(s) changed from "
                                f"{resume.reference.name} ({ANYWAY_VARIABLE}=1): {', '.join(k for k, _, _ in changes)}")
        elif changes:
            lines = [f"  {key}: {before} -> {after} (saved -> now)" for key, before, after in changes[:SHOWN]]
            if len(changes) > SHOWN:
                lines.append(f"  ... and {len(changes) - SHOWN} more")
            raise ConfigChangedError(
                f"saved by a launch with another config ({resume.reference}); this launch differs in "
                f"{len(changes)} setting(s)", file=resume_dir,
                hint=f"to start a new run set CKPT_DIR to another directory (or remove {ckpt_dir}); to resume this "
                     f"save with the new values anyway set {ANYWAY_VARIABLE}=1", detail="\n".join(lines))
    total = cfg.trainer.get("total_training_steps")
    if total is not None and step >= int(total):
        resume.finished = (f"[launch] {ckpt_dir} holds a finished run: its save {resume_dir.name} is step {step} of "
                           f"trainer.total_training_steps={total}; nothing to train (raise STEPS or "
                           f"trainer.total_training_steps to continue it, or set CKPT_DIR to another directory for a "
                           f"new run)")
    return resume
