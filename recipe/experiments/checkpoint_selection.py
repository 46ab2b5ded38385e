"""The best save of a monitored run: every whole save evaluated on the held-out problems, chosen by Avg@n.

``select_checkpoint(ckpt_dir, evaluate=..., before=..., metric="avg@4")`` merges each whole ``global_step_<s>`` of
``ckpt_dir`` (not the saves a rollback abandoned under ``rolled_back/``) into ``<ckpt_dir>/selection/step_<s>/model``,
evaluates it with ``evaluate(model_dir, out_dir)`` (per-problem scores under ``per_problem[metric]``) and returns
each step's metric, its change against ``before`` with a paired bootstrap interval over the problems, and the best
step (0: no save beats the start, keep the initial model). The chosen save's interval is optimistic (the maximum
over saves on the same problems): choose on another split when the difference matters.

    CPU_DEMO=toy python -m recipe.experiments.checkpoint_selection CKPT_DIR
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recipe.evaluation import stats
from recipe.launch.monitor_actions import whole_saves


def change(before: dict[str, Any], after: dict[str, Any], metric: str) -> stats.Interval:
    ids = sorted(before["per_problem"][metric])
    return stats.paired_bootstrap(base_SP=[before["per_problem"][metric][p] for p in ids],
                                  ckpt_SP=[[after["per_problem"][metric][p] for p in ids]])


def select_checkpoint(ckpt_dir: str | Path, *, evaluate: Callable[[Path, Path], dict[str, Any]], before: dict[str, Any],
                      metric: str, log=print) -> dict[str, Any]:
    """Evaluate every whole save of ``ckpt_dir``; ``{"rows": [...], "best": step, "metric": metric}`` (also written
    to ``<ckpt_dir>/selection/selection.json``)."""
    from recipe.common.merge import merge_checkpoint

    root = Path(ckpt_dir) / "selection"
    rows = []
    for step, folder in whole_saves(ckpt_dir).items():
        model = root / f"step_{step}" / "model"
        if not (model / "config.json").is_file():
            model.parent.mkdir(parents=True, exist_ok=True)
            merge_checkpoint(folder, model, log=model.parent / "merge.log")
        after = evaluate(model, root / f"step_{step}" / "eval")
        interval = change(before, after, metric)
        rows.append({"step": step, metric: after[metric], "change": interval.estimate, "low": interval.low,
                     "high": interval.high, "mean_length": after.get("mean_length")})
        log(f"[select] step {step}: {metric} {100 * after[metric]:.1f}% ({100 * interval.estimate:+.1f} pts, 95% CI "
            f"[{100 * interval.low:+.1f}, {100 * interval.high:+.1f}] vs the start)")
    if not rows:
        raise FileNotFoundError(f"no whole global_step_<s> save in {ckpt_dir} to select from")
    # the start is a candidate too: a run none of whose saves beats it keeps its initial model
    start = {"step": 0, metric: before[metric], "change": 0.0, "low": 0.0, "high": 0.0,
             "mean_length": before.get("mean_length")}
    best = max([start, *rows], key=lambda r: (r[metric], r["step"]))
    result = {"metric": metric, "start": before[metric], "rows": rows, "best": best["step"],
              "best_model": str(root / f"step_{best['step']}" / "model") if best["step"] else "the initial model"}
    root.mkdir(parents=True, exist_ok=True)
    (root / "selection.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"[select] best checkpoint: step {best['step']} ({metric} {100 * best[metric]:.1f}% vs {100 * before[metric]:.1f}% "
        f"at the start: {100 * best['change']:+.1f} pts, 95% CI [{100 * best['low']:+.1f}, {100 * best['high']:+.1f}]); "
        f"{result['best_model']}")
    return result


def table(result: dict[str, Any]) -> str:
    metric = result["metric"]
    lines = [f"| step | {metric} (%) | change vs start, 95% CI (pts) | mean length |", "|---|---|---|---|",
             f"| 0 (start) | {100 * result['start']:.1f} | - | - |"]
    for row in result["rows"]:
        mark = " (chosen)" if row["step"] == result["best"] else ""
        length = "-" if row["mean_length"] is None else f"{row['mean_length']:.1f}"
        lines.append(f"| {row['step']}{mark} | {100 * row[metric]:.1f} | {100 * row['change']:+.1f} "
                     f"[{100 * row['low']:+.1f}, {100 * row['high']:+.1f}] | {length} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    from recipe.launch.config import Settings, get_recipe
    from recipe.toy.cpu_demos import demo_for

    parser = argparse.ArgumentParser(prog="python -m recipe.experiments.checkpoint_selection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt_dir", type=Path, help="the run's checkpoint directory (CKPT_DIR)")
    parser.add_argument("--metric", default="avg@4", help="the per-problem metric to select on (default avg@4)")
    args = parser.parse_args(argv)
    settings = Settings.from_environ(os.environ)
    recipe = get_recipe("opsd")
    build = demo_for(recipe, settings).load()(recipe.name, settings)
    if build.evaluate is None:
        raise SystemExit(f"error: the CPU demo {settings.demo} has no held-out evaluation to select with")
    before = build.evaluate(Path(build.inputs.model_path), build.before_dir or args.ckpt_dir / "eval" / "before")
    print(table(select_checkpoint(args.ckpt_dir, evaluate=build.evaluate, before=before, metric=args.metric)))
    return 0


if __name__ == "__main__":
    import sys

    from recipe.common import cli

    sys.exit(cli.run(main))
