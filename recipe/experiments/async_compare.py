"""Benchmark: rollouts that overlap training vs the synchronous trainer, side by side in one run.

    python -m recipe.experiments.async_compare toy                  # the toy world, 150 steps per mode
    python -m recipe.experiments.async_compare smollm2 --steps 6    # SmolLM2-135M (the real demo's student)

Each mode (``MODES``) is one OPSD launch of the CPU demo (``recipe.toy.cpu_demos.train_demo``) on 2 devices, with
the same data, order and samples: ``sync`` on 2 ranks with colocated rollout replicas; ``one_step_off`` /
``fully_async`` on 1 training rank + 1 rollout replica in separate pools (staleness 1). Prints held-out accuracy
(``toy``) or times and lag (``smollm2``) against ``sync``, and the modelled GPU speed-up from the synchronous run's
phase times (``recipe.async_rl.staleness.overlap_model``). Results and their columns: docs/results/async.md.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from recipe.async_rl.staleness import best_split

MODES = {"sync": [], "one_step_off": ["+experiment=async_one_step_off"],
         "fully_async": ["+experiment=async_fully", "async_training.staleness_threshold=1"]}
CPU_DEMO_OF = {"toy": "toy", "smollm2": "real"}
# generation shares the GPU model is evaluated at besides the measured ones (long caps: generation dominates)
MODEL_SHARES = (0.85, 0.95)
MODEL_SCALING = (0.0, 0.5, 1.0)


def run_mode(bench: str, mode: str, *, cache: str, run_dir: Path, steps: int | None, extra: list[str]) -> dict:
    """One OPSD launch of ``bench``'s demo in ``mode``; ``{"before", "after", "metrics", "wall_time_s"}``."""
    from recipe.launch.config import Settings, get_recipe
    from recipe.toy.cpu_demos import train_demo
    from recipe.toy.demo import toy
    from recipe.toy.real_demo import real

    settings = Settings(device="cpu", cache_dir=cache, ckpt_dir=str(run_dir), steps=steps, cpu_demo=CPU_DEMO_OF[bench],
                        cpu_num_ranks=2 if mode == "sync" else None)
    build = toy("opsd", settings) if bench == "toy" else real("opsd", settings)
    if bench == "smollm2":  # time and KL only: no held-out evaluation
        build = replace(build, evaluate=None)
    result = train_demo(get_recipe("opsd"), settings, [*MODES[mode], *extra], build)
    from omegaconf import OmegaConf

    config = OmegaConf.load(Path(result["ckpt_dir"]) / "launch_config.yaml")
    return {"before": result["before"], "after": result["after"], "metrics": result["metrics"],
            "wall_time_s": result["record"]["wall_time_s"],
            "samples_per_step": int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n)}


def _step_records(result: dict) -> list[dict]:
    """One merged record per trained step (a step may be logged in several records)."""
    by_step: dict[int, dict] = {}
    for row in result["metrics"]:
        if "step" in row:
            by_step.setdefault(int(row["step"]), {}).update(row)
    return [by_step[s] for s in sorted(by_step) if "opsd/loss" in by_step[s]]


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def timing(result: dict) -> dict:
    """Per-step means after step 1: step, exposed generation, update (teacher inside), weight push; samples."""
    rows = _step_records(result)[1:] or _step_records(result)
    update = _mean([r.get("timing_s/update_actor") for r in rows])
    push = _mean([r.get("timing_s/update_weights", r.get("timing_s/timing_s/param_sync")) for r in rows])
    return {"step_s": _mean([r.get("timing_s/step") for r in rows]), "gen_s": _mean([r.get("timing_s/gen") for r in rows]),
            "update_s": update, "push_s": push, "samples": result["samples_per_step"],
            "lag": _mean([r.get("async/lag_mean") for r in rows]), "steps": len(_step_records(result))}


def speedup_model_table(*, shares: dict[str, float], devices: tuple[int, ...] = (2, 8)) -> str:
    """The modelled GPU speed-up (a model, not a measurement) at each generation share, split and scaling."""
    lines = ["| generation share of the synchronous step | devices | best rollout devices, speed-up at "
             + " / ".join(f"a={a:g}" for a in MODEL_SCALING) + " |", "|---|---|---|"]
    for label, share in shares.items():
        for d in devices:
            cells = []
            for a in MODEL_SCALING:
                rollout, model = best_split(gen_s=share, train_s=1.0 - share, devices=d, gen_scaling=a)
                cells.append(f"{rollout}: {model.speedup:.2f}x")
            lines.append(f"| {label} {share:.2f} | {d} | {' / '.join(cells)} |")
    lines.append("(a: generation time ~ (devices lost)^a; a=1 throughput-bound, a=0 latency-bound: "
                 "recipe.async_rl.staleness.overlap_model)")
    return "\n".join(lines)


def toy_table(results: dict[str, dict]) -> str:
    from recipe.toy.demo import change_interval

    sync = results["sync"]
    lines = ["| mode | devices (train + rollout) | greedy acc after (%) | Avg@4 after (%) | greedy vs sync, 95% CI "
             "(pts) | Avg@4 vs sync, 95% CI (pts) | steps | s/step after step 1 | time/step vs sync |",
             "|---|---|---|---|---|---|---|---|---|"]
    sync_step = timing(sync)["step_s"]
    for mode, result in results.items():
        after, times = result["after"], timing(result)
        intervals = []
        for metric in ("greedy", "avg@4"):
            interval = None if mode == "sync" else change_interval(sync["after"], [after], metric)
            intervals.append("-" if interval is None else f"{100 * interval.estimate:+.1f} {interval.points()}")
        devices = "2 + colocated" if mode == "sync" else "1 + 1"
        lines.append(f"| {mode} | {devices} | {100 * after['greedy']:.1f} | {100 * after['avg@4']:.1f} "
                     f"| {intervals[0]} | {intervals[1]} | {times['steps']} | {times['step_s']:.2f} "
                     f"| {times['step_s'] / sync_step:.2f} |")
    before = sync["before"]
    lines.append(f"(before training: greedy {100 * before['greedy']:.1f}%, Avg@4 {100 * before['avg@4']:.1f}%; "
                 f"{before['n_problems']} held-out problems)")
    return "\n".join(lines)


def smollm2_table(results: dict[str, dict]) -> str:
    sync_times = timing(results["sync"])
    lines = ["| mode | s/step after step 1 | s/sample | exposed generation s/step | update s/step | push s/step | "
             "mean lag | time/step vs sync | opsd/fwd_kl per step |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, result in results.items():
        times = timing(result)
        kl = " ".join(f"{r['opsd/fwd_kl']:.3f}" for r in _step_records(result))
        per_sample = times["step_s"] / times["samples"]
        lines.append(f"| {mode} | {times['step_s']:.2f} | {per_sample:.3f} | {times['gen_s']:.2f} "
                     f"| {times['update_s']:.2f} | {times['push_s']:.2f} | {times['lag']:.2f} "
                     f"| {times['step_s'] / sync_times['step_s']:.2f} | {kl} |")
    return "\n".join(lines)


def generation_share(result: dict) -> float:
    """gen / (gen + update) of a synchronous run's steps after step 1 (push and overhead excluded)."""
    times = timing(result)
    return times["gen_s"] / (times["gen_s"] + times["update_s"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipe.experiments.async_compare",
                                     description="sync vs one-step-off vs fully-async OPSD, side by side, one table")
    parser.add_argument("bench", choices=sorted(CPU_DEMO_OF))
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--steps", type=int, default=None, help="default: the demo preset's (toy 150, smollm2 16)")
    parser.add_argument("--run-root", default=None, help="default: $OPSD_CACHE/async_compare/<bench>_<UTC time>")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every launch (after --)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    from recipe.launch.config import Settings

    args = build_parser().parse_args(argv)
    if "sync" not in args.modes:
        raise SystemExit("--modes must include sync (the ratios are against it)")
    cache = Settings.from_environ(os.environ).cache_dir
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = Path(args.run_root) if args.run_root else Path(cache) / "async_compare" / f"{args.bench}_{stamp}"
    results = {}
    for mode in args.modes:
        print(f"[async_compare] {args.bench} {mode}", flush=True)
        results[mode] = run_mode(args.bench, mode, cache=cache, run_dir=root / mode, steps=args.steps,
                                 extra=list(args.overrides))
    root.mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(
        {mode: {"timing": timing(r), "before": r["before"] and {k: v for k, v in r["before"].items() if k != "per_problem"},
                "after": r["after"] and {k: v for k, v in r["after"].items() if k != "per_problem"}}
         for mode, r in results.items()}, indent=2) + "\n")
    print(toy_table(results) if args.bench == "toy" else smollm2_table(results))
    shares = {f"measured ({args.bench}, sync)": generation_share(results["sync"])}
    shares.update({"long caps (assumed)": s for s in MODEL_SHARES[:1]})
    shares.update({"long caps, upper (assumed)": MODEL_SHARES[1]})
    print()
    print(speedup_model_table(shares=shares))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
