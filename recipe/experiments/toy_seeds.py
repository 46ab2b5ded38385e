"""The toy acceptance study: OPSD arms x data seeds on one toy student, gains as mean +- sd.

``seed_study`` launches ``recipe.experiments.toy_compare.run_method("opsd", ...)`` once per (arm, seed) (same
student, same steps; the seed is verl's ``data.seed``, i.e. the order of the training problems)
and reads, per run, the held-out accuracy after training and the training signal of the metrics
jsonl. ``study_table`` prints one row per arm: greedy / Avg@n gain in points (mean +- sample sd
over seeds, and each seed, and a 95% paired bootstrap interval that resamples both the
held-out problems and the seeds: ``recipe.evaluation.stats``), and the training divergence of
the first vs last 10 steps.

Arms (hydra overrides on top of the OPSD toy preset, ``recipe/opsd/config/demo/toy.yaml``):
- ``full_solution``: the toy preset (teacher = frozen student with the reference solution);
- ``control``: ``opsd.teacher_context=none``, the no-privilege control (teacher prompt = student
  prompt, so the loss is 0 at the first step; ``opsd.teacher.allow_zero_loss=true`` passes the
  start-up refusal of that setting: here the null result is the point);
- ``paper_clip``: the toy preset with the paper's per-entry clip ``tau_clip = 0.05``;
- ``answer_only``: the answer-only teacher context.

CLI: ``python scripts/toy_seed_study.py --seeds 1 2 3``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

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
    out = {}
    for key, name in (("opsd/fwd_kl", "fwd_kl"), ("opsd/loss", "loss"), ("opsd/top1_agree", "top1_agree")):
        values = [row[key] for row in metrics if key in row]
        out[f"{name}_first"] = _mean(values[:window])
        out[f"{name}_last"] = _mean(values[-window:])
    out["step1_loss"] = metrics[0].get("opsd/loss", float("nan")) if metrics else float("nan")
    return out


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
        ci = {metric: "-" if interval is None else interval.points() for metric, interval in intervals.items()}
        signals = [run["signal"] for run in by_seed.values()]
        first, last = _mean([s["fwd_kl_first"] for s in signals]), _mean([s["fwd_kl_last"] for s in signals])
        change = f"{100 * (last - first) / first:+.0f}%" if first > 0 else "-"
        lines.append(
            f"| {arm} | {_mean_sd(mean, sd)} | {', '.join(f'{g:+.1f}' for g in gains)} | {ci['greedy']} "
            f"| {_mean_sd(avg_mean, avg_sd)} | {ci[avg]} | {first:.4f} -> {last:.4f} ({change}) "
            f"| {_mean([s['step1_loss'] for s in signals]):.2g} "
            f"| {_mean([s['top1_agree_first'] for s in signals]):.3f} -> {_mean([s['top1_agree_last'] for s in signals]):.3f} |"
        )
    lines.append(f"(before training: greedy {100 * before['greedy']:.1f}%, Avg@{eval_n} {100 * before[avg]:.1f}% "
                 f"on {before['n_problems']} held-out problems; seeds = verl data.seed; 95% CI: paired percentile "
                 "bootstrap resampling problems and seeds, recipe.evaluation.stats)")
    return "\n".join(lines) + "\n"
