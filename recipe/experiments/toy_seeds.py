"""The toy acceptance study: OPSD arms x data seeds on one toy student, gains as mean +- sd.

``seed_study`` runs ``recipe.experiments.toy_compare.run_method("opsd", ...)`` once per (arm, seed) (the seed is
verl's ``data.seed``: the order of the training problems); ``study_table`` prints per arm the greedy / Avg@n gain
(mean +- sample sd, each seed, a 95% paired bootstrap interval over problems and seeds) and the training divergence
of the first vs last 10 steps. ``ARMS``: hydra overrides of the OPSD toy preset (described in docs/toy_world.md).

    python scripts/toy_studies.py seeds --seeds 1 2 3                          # full_solution + control
    python scripts/toy_studies.py seeds --arms full_solution paper_clip --steps 100 --out study.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

from recipe.common import cli

from recipe.experiments.toy_compare import run_method
from recipe.toy.demo import change_interval

ARMS = {
    "full_solution": (),
    "control": ("opsd.teacher_context=none", "opsd.teacher.allow_zero_loss=true"),
    "paper_clip": ("opsd.loss.clip_tau=0.05",),
    "answer_only": ("opsd.teacher_context=answer_only",),
}
WINDOW = 10  # steps averaged at the start and at the end of a run


def _mean(values) -> float:
    return sum(values) / len(values) if values else float("nan")


def signal_windows(metrics: list[dict], *, window: int = WINDOW) -> dict[str, float]:
    """Mean ``opsd/fwd_kl``, ``opsd/loss`` and ``opsd/top1_agree`` over the first and last ``window`` steps."""
    windows = {}
    for key, name in (("opsd/fwd_kl", "fwd_kl"), ("opsd/loss", "loss"), ("opsd/top1_agree", "top1_agree")):
        values = [row[key] for row in metrics if key in row]
        windows[f"{name}_first"] = _mean(values[:window])
        windows[f"{name}_last"] = _mean(values[-window:])
    windows["step1_loss"] = metrics[0].get("opsd/loss", float("nan")) if metrics else float("nan")
    return windows


def seed_study(*, cache: Path, run_root: Path, before: dict, arms: dict[str, tuple[str, ...]], seeds: list[int],
               steps: int | None = None, extra: tuple[str, ...] = (), eval_n: int = 4, eval_limit: int | None = None,
               timeout_s: float = 3600, log=print) -> dict:
    """Run every (arm, seed); return ``{arm: {seed: {"after": ..., "signal": ..., "wall_time_s": ...}}}``."""
    results: dict[str, dict[int, dict]] = {}
    for arm, overrides in arms.items():
        for seed in seeds:
            result = run_method("opsd", cache=cache, run_dir=run_root / f"{arm}_seed{seed}", steps=steps,
                                extra=[f"data.seed={seed}", *overrides, *extra], eval_n=eval_n, eval_limit=eval_limit,
                                timeout_s=timeout_s)
            entry = {"after": result["after"], "signal": signal_windows(result["train"]["metrics"]),
                     "wall_time_s": result["train"]["wall_time_s"]}
            results.setdefault(arm, {})[seed] = entry
            gain = 100 * (entry["after"]["greedy"] - before["greedy"])
            log(f"[toy seeds] {arm} seed {seed}: greedy {100 * before['greedy']:.1f} -> "
                f"{100 * entry['after']['greedy']:.1f} ({gain:+.1f}), fwd_kl {entry['signal']['fwd_kl_first']:.4f} -> "
                f"{entry['signal']['fwd_kl_last']:.4f}")
    return results


def gain_stats(results_by_seed: dict[int, dict], before: dict, metric: str) -> tuple[float, float, list[float]]:
    """(mean, sample sd, per-seed) gain in points of ``metric`` after vs before."""
    gains = [100 * (run["after"][metric] - before[metric]) for _, run in sorted(results_by_seed.items())]
    sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
    return _mean(gains), sd, gains


def _mean_sd(mean: float, sd: float) -> str:
    """``+x.x +- y.y``; one seed has no sample sd, so it says so instead of printing nan."""
    return f"{mean:+.1f} (1 seed)" if math.isnan(sd) else f"{mean:+.1f} +- {sd:.1f}"


def study_table(results: dict[str, dict[int, dict]], before: dict, *, eval_n: int) -> str:
    """Markdown: per arm, greedy and Avg@n gains (mean +- sd, per seed) and the training signal windows."""
    avg = f"avg@{eval_n}"
    lines = [
        f"| arm | greedy gain (pts), mean +- sd | per seed | greedy gain 95% CI | Avg@{eval_n} gain (pts), mean +- sd "
        f"| Avg@{eval_n} gain 95% CI "
        f"| fwd_kl first {WINDOW} -> last {WINDOW} steps (change) | step-1 loss | top-1 agree first -> last |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in results.items():
        mean, sd, gains = gain_stats(by_seed, before, "greedy")
        avg_mean, avg_sd, _ = gain_stats(by_seed, before, avg)
        afters = [run["after"] for _, run in sorted(by_seed.items())]
        intervals = {metric: change_interval(before, afters, metric) for metric in ("greedy", avg)}
        interval_text = {metric: "-" if interval is None else interval.points()
                         for metric, interval in intervals.items()}
        signals = [run["signal"] for run in by_seed.values()]
        first, last = _mean([s["fwd_kl_first"] for s in signals]), _mean([s["fwd_kl_last"] for s in signals])
        change = f"{100 * (last - first) / first:+.0f}%" if first > 0 else "-"
        lines.append(
            f"| {arm} | {_mean_sd(mean, sd)} | {', '.join(f'{g:+.1f}' for g in gains)} | {interval_text['greedy']} "
            f"| {_mean_sd(avg_mean, avg_sd)} | {interval_text[avg]} | {first:.4f} -> {last:.4f} ({change}) "
            f"| {_mean([s['step1_loss'] for s in signals]):.2g} "
            f"| {_mean([s['top1_agree_first'] for s in signals]):.3f} -> {_mean([s['top1_agree_last'] for s in signals]):.3f} |"
        )
    lines.append(f"(before training: greedy {100 * before['greedy']:.1f}%, Avg@{eval_n} {100 * before[avg]:.1f}% "
                 f"on {before['n_problems']} held-out problems; seeds = verl data.seed; 95% CI: paired percentile "
                 "bootstrap resampling problems and seeds, recipe.evaluation.stats)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from recipe.launch.config import Settings
    from recipe.toy.demo import evaluate_toy
    from recipe.toy.student import StudentConfig, build_student

    parser = argparse.ArgumentParser(description="The toy acceptance study: OPSD (full solution) vs the "
                                                 "no-privilege control over data seeds.")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["full_solution", "control"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="verl data.seed of each run")
    parser.add_argument("--steps", type=int, default=None, help="default: the toy preset's (150)")
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--eval-limit", type=int, default=None)
    parser.add_argument("--run-root", default=None, help="default: <student cache dir>/runs/seeds_<UTC time>")
    parser.add_argument("--out", default=None, help="also write the markdown table here (results.json beside it)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file (and its .json)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every launch (after --)")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if args.out:
        cli.refuse_overwrite([args.out, Path(args.out).with_suffix(".json")], overwrite=args.overwrite,
                             other="another --out")
    cli.refuse_nonempty_dir(args.run_root, flag="--run-root")  # before the (minutes-long) student build
    cache = Path(Settings.from_environ(os.environ).cache_dir)
    root = build_student(StudentConfig(), cache=cache)
    run_root = Path(args.run_root) if args.run_root else root / "runs" / time.strftime("seeds_%Y%m%dT%H%M%SZ",
                                                                                        time.gmtime())
    cli.refuse_nonempty_dir(run_root, flag="--run-root")
    print(f"[toy seeds] student {root / 'student'}; runs in {run_root}", flush=True)
    before = evaluate_toy(root / "student", root / "student_eval" / "none", benchmark=root / "data" / "heldout.jsonl",
                          eval_n=args.eval_n, eval_limit=args.eval_limit)
    results = seed_study(cache=cache, run_root=run_root, before=before, arms={arm: ARMS[arm] for arm in args.arms},
                         seeds=args.seeds, steps=args.steps, extra=tuple(args.overrides), eval_n=args.eval_n,
                         eval_limit=args.eval_limit)
    text = study_table(results, before, eval_n=args.eval_n)
    print(text, end="")
    payload = {"before": before, "steps": args.steps, "overrides": args.overrides, "results": results}
    (run_root / "study.json").write_text(json.dumps(payload, indent=2) + "\n")
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0
