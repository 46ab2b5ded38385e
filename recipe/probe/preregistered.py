"""The probe's pre-registered test (``preregistration.json``, committed before any test cell ran): per world, every
test cell's probe verdict against its full runs' regime, with a 95% Wilson interval, next to the frozen baselines.

    CPU_DEMO=toy python scripts/probe.py preregistered --world toy --out-dir prereg_toy
    CPU_DEMO=real python scripts/probe.py preregistered --world real --out-dir prereg_real

Resumable: a probe (``probe/probe.json``) or a full run (``full_runs.jsonl``) already in ``--out-dir`` is reused.
``--full-runs-only`` / ``--probe-only`` run one half. Results: ``preregistered.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from recipe.probe.cells import Cell

FROZEN = Path(__file__).with_name("preregistration.json")
SECOND_SEED = 1


def frozen_spec() -> dict[str, Any]:
    return json.loads(FROZEN.read_text())


def frozen_sha256() -> str:
    return hashlib.sha256(FROZEN.read_bytes()).hexdigest()


def test_cells(world: dict[str, Any], *, student_mode: str, teacher_mode: str, clip_tau: float | None,
               temperature: float) -> list[Cell]:
    """The world's test cells, each axis it does not set taken from the launch's config."""
    cells = []
    for entry in world["test"]:
        spec = entry["cell"]
        cells.append(Cell(context=spec["context"], student_mode=spec.get("student_mode", student_mode),
                          teacher_mode=spec.get("teacher_mode", teacher_mode), clip_tau=spec.get("clip_tau", clip_tau),
                          temperature=float(spec.get("temperature", temperature)), beta=spec.get("beta"),
                          lr=spec.get("lr")))
    return cells


def wilson(k: int, n: int, *, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def baseline_predictions(baselines: dict[str, Any], fwd_kl: float | None) -> dict[str, str]:
    """Each frozen baseline's label for a cell whose frozen initial forward KL is ``fwd_kl``."""
    rule = baselines["fwd_kl_rule"]
    if rule["threshold"] is None or fwd_kl is None:
        kl_label = rule["at_or_below"] if rule["threshold"] is None else baselines["majority"]["label"]
    else:
        kl_label = rule["at_or_below"] if fwd_kl <= rule["threshold"] else rule["above"]
    return {"majority": baselines["majority"]["label"], "fwd_kl_rule": kl_label}


def needs_second_seed(rows: list[dict[str, Any]], name: str) -> bool:
    """The first full run's interval of the greedy accuracy change includes 0 (the frozen second-seed rule)."""
    row = next((r for r in rows if r["name"] == name), None)
    return row is not None and len(row["seeds"]) == 1 and row["change"]["low"] <= 0 <= row["change"]["high"]


def scored(agreement: dict[str, Any], probe: dict[str, Any], world: dict[str, Any]) -> dict[str, Any]:
    """The probe's and each baseline's agreement with the full runs' regimes over the world's test cells."""
    frozen = {c["name"]: (c.get("frozen") or {}).get("fwd_kl") for c in probe["cells"]}
    rows = []
    for row in agreement["rows"]:
        predictions = {"probe": row["verdict"], **baseline_predictions(world["baselines"], frozen.get(row["name"]))}
        rows.append({**row, "fwd_kl": frozen.get(row["name"]), "predictions": predictions})
    summary = {}
    for predictor in ("probe", "majority", "fwd_kl_rule"):
        right = sum(r["predictions"][predictor] == r["outcome"] for r in rows)
        summary[predictor] = {"agree": right, "cells": len(rows), "interval": wilson(right, len(rows))}
    return {"rows": rows, "summary": summary}


def report(result: dict[str, Any], *, world_name: str, sha256: str) -> str:
    names = {c["name"]: entry["name"] for c, entry in zip(result["cells"], result["world"]["test"])}
    lines = [f"Pre-registration: recipe/probe/preregistration.json, sha256 {sha256}.", "",
             "| test cell | probe verdict | majority | forward-KL rule | full runs: greedy before -> after (%) "
             "| change, 95% CI (pts) | regime | probe right |", "|---|---|---|---|---|---|---|---|"]
    for row in result["scored"]["rows"]:
        p, c = row["predictions"], row["change"]
        after = ", ".join(f"{100 * a:.1f}" for a in row["accuracy_after"])
        lines.append(f"| {names.get(row['name'], row['name'])} | {p['probe']} ({row['basis']}) | {p['majority']} "
                     f"| {p['fwd_kl_rule']} | {100 * row['accuracy_before']:.1f} -> {after} "
                     f"| {100 * c['estimate']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] | {row['outcome']} "
                     f"| {'yes' if p['probe'] == row['outcome'] else '**no**'} |")
    lines += ["", f"| predictor ({world_name}) | right | of | 95% Wilson interval |", "|---|---|---|---|"]
    for predictor, s in result["scored"]["summary"].items():
        low, high = s["interval"]
        lines.append(f"| {predictor} | {s['agree']} | {s['cells']} | [{100 * low:.0f}%, {100 * high:.0f}%] |")
    wrong = [r for r in result["scored"]["rows"] if r["predictions"]["probe"] != r["outcome"]]
    lines += ["", "Wrong probe verdicts: " + ("; ".join(f"{names.get(r['name'], r['name'])}: said {r['verdict']}, "
                                                      f"was {r['outcome']}" for r in wrong) or "none")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import os

    from recipe.common import cli
    from recipe.launch.config import Settings, get_recipe
    from recipe.launch.run import plan
    from recipe.probe import probe, validation
    from recipe.toy.cpu_demos import demo_for

    parser = argparse.ArgumentParser(prog="python scripts/probe.py preregistered", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", required=True, choices=("toy", "real"))
    parser.add_argument("--out-dir", required=True, type=Path)
    half = parser.add_mutually_exclusive_group()
    half.add_argument("--full-runs-only", action="store_true", help="the test cells' full runs only")
    half.add_argument("--probe-only", action="store_true", help="the probe over the test cells only")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    spec = frozen_spec()
    world = spec["worlds"][args.world]
    settings = Settings.from_environ(os.environ)
    if settings.demo != args.world:
        raise cli.InputError(f"the {args.world} world runs its CPU demo: set CPU_DEMO={args.world}",
                             file=f"CPU_DEMO={settings.demo or ''}")
    recipe = get_recipe("opsd")
    demo = demo_for(recipe, settings)
    inputs = demo.load()(recipe.name, settings).inputs
    base = plan(recipe, settings, [], demo=inputs).config
    cells = test_cells(world, student_mode=str(base.opsd.student_mode), teacher_mode=str(base.opsd.teacher_mode),
                       clip_tau=base.opsd.loss.clip_tau, temperature=float(base.actor_rollout_ref.rollout.temperature))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    probe_file = args.out_dir / "probe" / "probe.json"
    if not args.full_runs_only and not probe_file.is_file():
        protocol = world["probe"]
        probe.run_probe(cells, recipe=recipe, settings=settings, demo_inputs=inputs, extra=[], steps=protocol["steps"],
                        batch=protocol["batch"], out_dir=args.out_dir / "probe", signal_prompts=protocol["signal_prompts"])
    if args.probe_only:
        return 0
    log_file = args.out_dir / "full_runs.jsonl"
    runs = validation.read_runs(log_file)

    def run(cell: Cell, seed: int) -> None:
        if any(r["name"] == cell.name and r["seed"] == seed for r in runs):
            return
        for done in validation.full_runs([cell], recipe=recipe, settings=settings, demo=demo,
                                         extra=[f"trainer.total_training_steps={world['full_run']['steps']}"],
                                         seeds=[seed], out_dir=args.out_dir):
            runs.append(done)
            with open(log_file, "a") as handle:
                handle.write(json.dumps(done, default=str) + "\n")

    for cell in cells:
        for seed in world["full_run"]["seeds"]:
            run(cell, seed)
    stub = {"cells": [{"name": c.name, "verdict": {"verdict": "-", "basis": "-"}, "cost": {"cell_s": 0.0}} for c in cells]}
    for cell in cells:  # the frozen rule: a second seed where the first run's interval includes 0
        if needs_second_seed(validation.agreement(stub, runs)["rows"], cell.name):
            run(cell, SECOND_SEED)
    if args.full_runs_only or not probe_file.is_file():
        return 0
    probe_result = json.loads(probe_file.read_text())
    agreement = validation.agreement(probe_result, runs)
    result = {"world": world, "cells": [{"name": c.name} for c in cells], "scored": scored(agreement, probe_result, world)}
    text = report(result, world_name=args.world, sha256=frozen_sha256())
    (args.out_dir / "preregistered.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out_dir / "preregistered.md").write_text(text + "\n")
    print(text)
    return 0
