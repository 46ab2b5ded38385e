"""OPSD vs GRPO (and RLSD) on the toy student: the toy demo of each method, one table (docs/toy_world.md).

``run_method("opsd" | "grpo" | "rlsd", ...)`` is one toy-demo launch (``recipe.toy.cpu_demos.train_demo`` with
``recipe.toy.demo.toy``: the recipe's toy preset, the toy student, a given run directory; every method on the same
parquet, ``data.seed`` and batch) and returns the held-out evaluation before / after and the per-step metrics.
``table`` adds 95% paired bootstrap intervals over the held-out problems (``recipe.evaluation.stats``).

    python scripts/toy_studies.py compare --steps 30                       # OPSD and GRPO
    python scripts/toy_studies.py compare --methods opsd --steps 5 -- opsd.teacher_context=none opsd.teacher.allow_zero_loss=true
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from recipe.common import cli
from recipe.evaluation import stats
from recipe.toy.demo import change_interval

METHODS = ("opsd", "grpo", "rlsd")
# RLSD (recipe/opsd/core/objectives/rlsd.py) is the OPSD recipe with the objective_rlsd preset (the reference's
# setting: 8 rollouts per prompt, 2 updates per batch, the current policy as teacher, lam 0.5 -> 0 over 50 optimizer
# steps), on the GRPO control's toy settings where the OPSD recipe has its own: learning rate, sampling temperature,
# clip-higher, gradient clip 1.0, weight decay 0.01 (no reference-KL term: the OPSD recipe has none).
RECIPE_OF = {"rlsd": "opsd"}
METHOD_OVERRIDES = {"rlsd": (
    "+experiment=objective_rlsd", "actor_rollout_ref.actor.optim.lr=5e-5", "actor_rollout_ref.rollout.temperature=0.6",
    "opsd.loss.student_temperature=0.6", "opsd.loss.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.optim.clip_grad=1.0",
    "actor_rollout_ref.actor.optim.weight_decay=0.01")}


def run_method(method: str, *, cache: str | Path, run_dir: str | Path, steps: int | None = None,
               extra: Sequence[str] = (), eval_n: int = 4, eval_limit: int | None = None,
               timeout_s: float | None = 3600) -> dict:
    """Train ``method`` with its toy preset into ``run_dir``; ``{"before", "after", "train"}``.

    ``train``: ``wall_time_s``, ``steps`` (logged), ``step_times_s`` (verl's ``timing_s/step``), ``metrics``.
    """
    from recipe.launch.config import Settings, get_recipe
    from recipe.toy.cpu_demos import train_demo
    from recipe.toy.demo import toy

    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {list(METHODS)}")
    settings = Settings(device="cpu", cache_dir=str(cache), ckpt_dir=str(run_dir), steps=steps, cpu_demo="toy")
    recipe = RECIPE_OF.get(method, method)
    build = toy(recipe, settings, eval_n=eval_n, eval_limit=eval_limit)
    result = train_demo(get_recipe(recipe), settings, [*METHOD_OVERRIDES.get(method, ()), *extra], build,
                        timeout_s=timeout_s)
    metrics = result["metrics"]
    return {"before": result["before"], "after": result["after"],
            "train": {"wall_time_s": result["record"]["wall_time_s"], "steps": len(metrics), "metrics": metrics,
                      "step_times_s": [row["timing_s/step"] for row in metrics if "timing_s/step" in row]}}


def _mean(values) -> float:
    return sum(values) / len(values) if values else float("nan")


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _ci(interval: stats.Interval | None) -> str:
    return "-" if interval is None else interval.points()


def headline(metrics: dict) -> dict:
    """The metrics without the per-problem scores (for progress lines)."""
    return {key: value for key, value in metrics.items() if key != "per_problem"}


def table(before: dict, results: dict[str, dict], *, eval_n: int) -> str:
    """Markdown table: accuracy before/after (+ 95% CI of the change), length, wall time, time per step, ratio."""
    n = eval_n
    lines = [
        f"| method | greedy acc before -> after (%) | Avg@{n} before -> after (%) | Avg@{n} change 95% CI (pts) "
        f"| Pass@{n} before -> after (%) "
        f"| mean length before -> after | steps | wall time (s) | time/step (s) | time/step after step 1 (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, result in results.items():
        after, trained = result["after"], result["train"]
        times = trained["step_times_s"]
        lines.append(
            f"| {method} | {_pct(before['greedy'])} -> {_pct(after['greedy'])} "
            f"| {_pct(before[f'avg@{n}'])} -> {_pct(after[f'avg@{n}'])} "
            f"| {_ci(change_interval(before, [after], f'avg@{n}'))} "
            f"| {_pct(before[f'pass@{n}'])} -> {_pct(after[f'pass@{n}'])} "
            f"| {before['mean_length']:.1f} -> {after['mean_length']:.1f} | {trained['steps']} "
            f"| {trained['wall_time_s']:.0f} | {_mean(times):.2f} | {_mean(times[1:]):.2f} |"
        )
    if {"opsd", "grpo"} <= set(results):
        opsd, grpo = results["opsd"]["train"], results["grpo"]["train"]
        lines.append("")
        lines.append(f"OPSD/GRPO compute ratio (1 CPU device each): time per step "
                     f"{_mean(opsd['step_times_s']) / _mean(grpo['step_times_s']):.2f} "
                     f"({_mean(opsd['step_times_s'][1:]) / _mean(grpo['step_times_s'][1:]):.2f} after step 1), "
                     f"launch wall time {opsd['wall_time_s'] / grpo['wall_time_s']:.2f}")
    pairs = [(a, b) for a, b in (("opsd", "grpo"), ("rlsd", "grpo"), ("opsd", "rlsd")) if {a, b} <= set(results)]
    lines += [""] if pairs and not lines[-1] == "" else []
    for a, b in pairs:
        for metric, title in (("greedy", "greedy acc"), (f"avg@{n}", f"Avg@{n}")):
            interval = change_interval(results[b]["after"], [results[a]["after"]], metric)
            if interval is not None:
                lines.append(f"{a.upper()} - {b.upper()} after training, {title}: {100 * interval.estimate:+.1f} pts, "
                             f"95% CI {interval.points()} (paired by problem)")
    lines.append(f"(held-out problems: {before['n_problems']}; greedy = top-k 1; Avg@{n}/Pass@{n}: T 1.0, "
                 f"no-think mode, recipe.evaluation.harness; 95% CI: paired percentile bootstrap over problems, "
                 f"{stats.DEFAULT_RESAMPLES:,} resamples, recipe.evaluation.stats)")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="OPSD and/or GRPO on the toy student: before/after table.")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["opsd", "grpo"],
                        help="rlsd: the OPSD recipe with the RLSD objective on the GRPO control's settings")
    parser.add_argument("--steps", type=int, default=None, help="default: the toy presets' (150)")
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate only the first N held-out problems")
    parser.add_argument("--run-root", default=None, help="default: <student cache dir>/runs/compare_<UTC time>")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per training launch")
    parser.add_argument("--out", default=None, help="also write the markdown table here (summary.json: in the run root)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both launches (after --)")
    cli.add_debug_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    from recipe.launch.config import Settings
    from recipe.toy.student import StudentConfig, build_student

    args = build_parser().parse_args(argv)
    if args.out:
        cli.refuse_overwrite([args.out], overwrite=args.overwrite, other="another --out")
    cli.refuse_nonempty_dir(args.run_root, flag="--run-root")  # before the (minutes-long) student build
    cache = Settings.from_environ(os.environ).cache_dir
    root = build_student(StudentConfig(), cache=cache)
    run_root = Path(args.run_root) if args.run_root else root / "runs" / time.strftime("compare_%Y%m%dT%H%M%SZ",
                                                                                        time.gmtime())
    cli.refuse_nonempty_dir(run_root, flag="--run-root")
    results = {method: run_method(method, cache=cache, run_dir=run_root / method, steps=args.steps,
                                  extra=args.overrides, eval_n=args.eval_n, eval_limit=args.eval_limit,
                                  timeout_s=args.timeout)
               for method in args.methods}
    before = next(iter(results.values()))["before"]
    text = table(before, results, eval_n=args.eval_n)
    print(text, end="")
    summary = {"before": before, **{m: {"after": r["after"], "wall_time_s": r["train"]["wall_time_s"],
                                        "step_times_s": r["train"]["step_times_s"]} for m, r in results.items()}}
    (run_root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.out:
        Path(args.out).write_text(text)
    return 0
