"""The probe's check against full runs (``scripts/probe.py --validate``): each chosen cell trained in full by the CPU
demo per seed, its held-out greedy evaluations before and after, the outcome next to the probe's verdict
(``agreement``) and, with ``--control``, each cell against a control arm's runs (``versus_control``)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipe.opsd.core import regimes
from recipe.probe.cells import Cell
from recipe.probe.report import _f


def _eval_file(eval_dir: Path) -> Path:
    """The greedy evaluation's results.json of a demo's evaluation directory (toy: ``greedy/``; real: itself)."""
    for path in (eval_dir / "greedy" / "results.json", eval_dir / "results.json"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"no results.json of a greedy evaluation under {eval_dir}")


def _greedy(eval_dir: Path) -> dict[str, Any]:
    """The greedy evaluation's accuracy, per-problem scores and behaviour (``regimes.Behaviour`` fields); the
    sampled evaluation's mean length when the directory holds one (``sampled_n*/``)."""
    results = json.loads(_eval_file(eval_dir).read_text())
    macro = results["macro"]
    scores = {pid: score for per in results["per_problem"].values() for pid, score in per.items()}
    sampled = sorted(eval_dir.glob("sampled_n*/results.json"))
    return {"accuracy": macro["avg@1"], "mean_length": macro.get("mean_length"), "boxed_rate": macro.get("boxed_rate"),
            "eot_rate": 1.0 - macro.get("truncated_rate", 0.0), "repetitive_rate": macro.get("repetitive_rate", 0.0),
            "sampled_length": json.loads(sampled[0].read_text())["macro"]["mean_length"] if sampled else None,
            "per_problem": scores}


def behaviour(evaluation: dict[str, Any]) -> regimes.Behaviour:
    return regimes.Behaviour(greedy_length=evaluation["mean_length"], eot_rate=evaluation["eot_rate"],
                             boxed_rate=evaluation["boxed_rate"], repetitive_rate=evaluation["repetitive_rate"],
                             sampled_length=evaluation.get("sampled_length"))


def full_runs(cells: Sequence[Cell], *, recipe, settings, demo, extra: Sequence[str], seeds: Sequence[int], out_dir: Path,
              log=print) -> list[dict[str, Any]]:
    """Each cell's full run per seed (``data.seed`` = the actor's data-loader seed), trained and evaluated before /
    after by the demo (``recipe.toy.cpu_demos.train_demo``); the greedy held-out evaluations."""
    from recipe.toy.cpu_demos import train_demo

    runs = []
    for cell in cells:
        for seed in seeds:
            run_dir = out_dir / "full" / f"{cell.slug}_seed{seed}"
            build = demo.load()(recipe.name, dataclasses.replace(settings, ckpt_dir=str(run_dir)))
            start = time.time()
            result = train_demo(recipe, dataclasses.replace(settings, ckpt_dir=str(run_dir)),
                                [*extra, *cell.overrides(), f"data.seed={seed}",
                                 f"actor_rollout_ref.actor.data_loader_seed={seed}"], build)
            before_dir = build.before_dir or Path(run_dir) / "eval" / "before"
            runs.append({"name": cell.name, "seed": seed, "run_dir": str(run_dir), "wall_time_s": round(time.time() - start),
                         "train_s": result["record"]["wall_time_s"], "before": _greedy(Path(before_dir)),
                         "after": _greedy(Path(run_dir) / "eval" / "after"),
                         "monitor_warnings": sorted({k.split("/")[1].removesuffix("_warning") for r in result["metrics"]
                                                     for k, v in r.items() if k.endswith("_warning") and v})})
            log(f"[probe] full run {cell.name} seed {seed}: greedy {100 * runs[-1]['before']['accuracy']:.1f} -> "
                f"{100 * runs[-1]['after']['accuracy']:.1f}%")
    return runs


def agreement(probe: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per cell: the probe's verdict, the full runs' outcome (paired bootstrap interval of the greedy accuracy change
    over the held-out problems and the seeds, length and boxed-rate change) and whether they agree."""
    from recipe.evaluation import stats

    rows = []
    for cell in probe["cells"]:
        mine = [r for r in runs if r["name"] == cell["name"]]
        if not mine:
            continue
        before = mine[0]["before"]
        ids = sorted(before["per_problem"])
        ci = stats.paired_bootstrap(base_SP=[before["per_problem"][p] for p in ids],
                                    ckpt_SP=[[r["after"]["per_problem"][p] for p in ids] for r in mine])
        mean = lambda key: sum(r["after"][key] for r in mine) / len(mine) if all(  # noqa: E731
            r["after"].get(key) is not None for r in mine) else None
        change = {"estimate": ci.estimate, "low": ci.low, "high": ci.high}
        after = {key: mean(key) for key in ("mean_length", "eot_rate", "boxed_rate", "repetitive_rate", "sampled_length")}
        result = regimes.label(change_low=ci.low, change_high=ci.high, before=behaviour(before),
                               after=behaviour(after)).name
        verdict = cell["verdict"]["verdict"]
        rows.append({"name": cell["name"], "verdict": verdict, "basis": cell["verdict"]["basis"], "outcome": result,
                     "agree": verdict == result, "compatible_agree": (verdict == "gain") == (result == "gain"),
                     "seeds": [r["seed"] for r in mine], "accuracy_before": before["accuracy"],
                     "accuracy_after": [r["after"]["accuracy"] for r in mine], "change": change,
                     "length_before": before["mean_length"], "length_after": mean("mean_length"),
                     "boxed_before": before["boxed_rate"], "boxed_after": mean("boxed_rate"),
                     "probe_cost_s": cell["cost"]["cell_s"], "full_train_s": [r["train_s"] for r in mine]})
    return {"rows": rows, "agree": sum(r["agree"] for r in rows), "compatible_agree": sum(r["compatible_agree"] for r in rows),
            "cells": len(rows)}


def agreement_table(result: dict[str, Any]) -> str:
    lines = ["| cell | probe verdict | full run: greedy before -> after (%) | change, 95% CI (pts) | length before -> after "
             "| boxed before -> after (%) | outcome | agree | probe cost / full training (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        after = ", ".join(f"{100 * a:.1f}" for a in r["accuracy_after"])
        c = r["change"]
        boxed = "-" if r["boxed_before"] is None or r["boxed_after"] is None else \
            f"{100 * r['boxed_before']:.0f} -> {100 * r['boxed_after']:.0f}"
        train = sum(r["full_train_s"]) / len(r["full_train_s"])
        lines.append(f"| {r['name']} | {r['verdict']} ({r['basis']}) | {100 * r['accuracy_before']:.1f} -> {after} "
                     f"| {100 * c['estimate']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] "
                     f"| {_f(r['length_before'])} -> {_f(r['length_after'])} | {boxed} | {r['outcome']} "
                     f"| {'yes' if r['agree'] else 'no'} | {r['probe_cost_s']:.0f} / {train:.0f} ({100 * r['probe_cost_s'] / train:.0f}%) |")
    lines.append(f"\nagreement: {result['agree']} of {result['cells']} cells (gain vs not gain: "
                 f"{result['compatible_agree']} of {result['cells']})")
    return "\n".join(lines)


def read_runs(path: Path) -> list[dict[str, Any]]:
    """The full runs a probe directory's ``full_runs.jsonl`` logged (none when it has none)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def control_cell(control_runs: Sequence[dict[str, Any]]) -> str:
    """The one cell a control arm's full runs are of (ValueError otherwise)."""
    names = sorted({r["name"] for r in control_runs})
    if len(names) != 1:
        raise ValueError(f"the control's full runs must be one cell's; found {names or 'none'}")
    return names[0]


def versus_control(runs: Sequence[dict[str, Any]], control_runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell's full runs against a control arm's (e.g. the same cell with the ``unrelated`` teacher context): the
    greedy held-out accuracy after training, cell - control, paired by seed (the same data order) and problem, with
    the paired bootstrap over both. Only the seeds both arms ran count; a cell sharing none is left out."""
    from recipe.evaluation import stats

    control_name = control_cell(control_runs)
    control = {r["seed"]: r for r in control_runs}
    rows = []
    for name in dict.fromkeys(r["name"] for r in runs):
        mine = {r["seed"]: r for r in runs if r["name"] == name and r["seed"] in control}
        if not mine or name == control_name:
            continue
        seeds = sorted(mine)
        ids = sorted(set.intersection(*(set(mine[s]["after"]["per_problem"]) & set(control[s]["after"]["per_problem"])
                                        for s in seeds)))
        ci = stats.paired_bootstrap(base_SP=[[control[s]["after"]["per_problem"][p] for p in ids] for s in seeds],
                                    ckpt_SP=[[mine[s]["after"]["per_problem"][p] for p in ids] for s in seeds],
                                    pair_seeds=True)
        rows.append({"name": name, "control": control_name, "seeds": seeds, "problems": len(ids),
                     "after": [mine[s]["after"]["accuracy"] for s in seeds],
                     "control_after": [control[s]["after"]["accuracy"] for s in seeds],
                     "difference": {"estimate": ci.estimate, "low": ci.low, "high": ci.high}})
    return rows


def control_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| cell | control | seeds | cell after (%) | control after (%) | cell - control, 95% CI (pts) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        d = r["difference"]
        lines.append(f"| {r['name']} | {r['control']} | {', '.join(map(str, r['seeds']))} "
                     f"| {', '.join(f'{100 * a:.1f}' for a in r['after'])} "
                     f"| {', '.join(f'{100 * a:.1f}' for a in r['control_after'])} "
                     f"| {100 * d['estimate']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")
    lines.append("\ncell - control: greedy held-out accuracy after training, paired by seed and problem (paired "
                 "bootstrap over both, recipe.evaluation.stats)")
    return "\n".join(lines)
