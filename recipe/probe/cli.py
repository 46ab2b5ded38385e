"""``scripts/probe.py``: the probe over a grid of cells, its check against full runs and a control arm."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from recipe.probe import probe
from recipe.probe.cells import Cell, grid
from recipe.probe.report import frozen_table


def _cell(spec: str) -> Cell:
    """``--cell CONTEXT,STUDENT:TEACHER,TAU,T[,beta=B][,lr=L]`` -> its Cell."""
    parts = spec.split(",")
    extra = dict(part.partition("=")[::2] for part in parts[4:])
    try:
        if len(parts) < 4 or set(extra) - {"beta", "lr"}:
            raise ValueError(spec)
        (cell,) = grid(contexts=[parts[0]], modes=[parts[1]], clip_taus=[parts[2]], temperatures=[float(parts[3])])
        return dataclasses.replace(cell, **{key: float(value) for key, value in extra.items()})
    except ValueError:
        from recipe.common import cli

        raise cli.InputError(f"--cell {spec!r} must be CONTEXT,STUDENT:TEACHER,TAU,T[,beta=B][,lr=L], e.g. "
                             "full_solution,native:native,none,1.1,beta=1") from None


def build_parser():
    import argparse

    from recipe.common import cli

    parser = argparse.ArgumentParser(prog="python scripts/probe.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, type=Path, help="probe.json, probe.md, probe.png and the launches")
    parser.add_argument("--contexts", nargs="+", default=None, help="teacher contexts (default: the config's)")
    parser.add_argument("--modes", nargs="+", default=None, help="student:teacher reasoning modes (default: the config's)")
    parser.add_argument("--clip-taus", nargs="+", default=None, help="per-entry clip values, none = no clip (default: the config's)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=None,
                        help="rollout and loss temperatures (default: the config's)")
    parser.add_argument("--cell", action="append", default=None, metavar="CONTEXT,STUDENT:TEACHER,TAU,T[,beta=B][,lr=L]",
                        help="one cell (repeatable) instead of the grid of the four axes, e.g. "
                             "full_solution,native:native,none,0.7 or unrelated,native:native,none,1.1,beta=1")
    parser.add_argument("--steps", type=int, default=12, help="monitored OPSD steps per cell (K >= 4)")
    parser.add_argument("--batch", type=int, default=None, help="prompts per step of the K steps (default: the config's)")
    parser.add_argument("--signal-prompts", type=int, default=32, help="prompts of the frozen signals (2 rollouts each)")
    parser.add_argument("--no-frozen", action="store_true", help="skip the frozen signals")
    parser.add_argument("--frozen-only", action="store_true",
                        help="the frozen signals of every cell only (frozen.json, frozen.md): a cheap first pass")
    parser.add_argument("--validate", action="store_true",
                        help="run cells in full and compare (a CPU demo: its held-out evaluation); with an existing "
                             "probe.json in --out-dir the probe is not run again")
    parser.add_argument("--validate-cells", nargs="+", type=int, default=None,
                        help="indices (probe.json order) of the cells to run in full (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42], help="data seeds of the --validate runs")
    parser.add_argument("--control", type=Path, default=None, metavar="OUT_DIR",
                        help="with --validate: another probe's --out-dir whose full runs are the control arm (one cell, "
                             "the same seeds); each validated cell's held-out accuracy against it")
    parser.add_argument("overrides", nargs="*", help="hydra overrides of every cell (after --)")
    cli.add_debug_argument(parser)
    return parser

def main(argv: list[str] | None = None) -> int:
    import os

    from recipe.common import cli
    from recipe.launch.config import Settings, get_recipe
    from recipe.launch.run import plan
    from recipe.toy.cpu_demos import demo_for

    args = build_parser().parse_args(argv)
    if args.steps < 4:
        raise cli.InputError(f"--steps {args.steps}: the probe compares two windows of at least 2 steps; use >= 4")
    from recipe.probe import validation

    control_runs = None
    if args.control is not None:  # checked before any launch
        control_file = args.control / "full_runs.jsonl"
        if not (args.validate and control_file.is_file()):
            raise cli.InputError(f"--control {args.control}: " + ("needs --validate" if not args.validate else
                                 "has no full_runs.jsonl (run that probe with --validate first)"))
        control_runs = validation.read_runs(control_file)
        with cli.reraise_as_input(ValueError, file=control_file):
            validation.control_cell(control_runs)
    done = args.out_dir / "probe.json"
    if not args.validate:
        cli.refuse_overwrite([done], overwrite=False, other="another --out-dir")
    recipe = get_recipe("opsd")
    settings = Settings.from_environ(os.environ)
    demo = demo_for(recipe, settings) if settings.demo is not None else None
    if args.validate and demo is None:
        raise cli.InputError("--validate evaluates held-out problems before and after each full run: a CPU demo's "
                             "(CPU_DEMO=toy or real) evaluation; with MODEL_PATH / TRAIN_FILES run the probe without it")
    if done.is_file():
        probe_result = json.loads(done.read_text())
        cells = [Cell(**c["cell"]) for c in probe_result["cells"]]
        extra = probe_result["extra_overrides"]
    else:
        inputs = demo.load()(recipe.name, settings).inputs if demo is not None else None
        extra = list(args.overrides)
        base = plan(recipe, settings, extra, demo=inputs).config
        opsd = base.opsd
        if args.cell:
            cells = [_cell(spec) for spec in args.cell]
        else:
            cells = grid(contexts=args.contexts or [opsd.teacher_context],
                         modes=args.modes or [f"{opsd.student_mode}:{opsd.teacher_mode}"],
                         clip_taus=args.clip_taus or [str(opsd.loss.clip_tau)],
                         temperatures=args.temperatures or [float(base.actor_rollout_ref.rollout.temperature)])
        if args.frozen_only:
            full = plan(recipe, settings, extra, demo=inputs)
            rollout = base.actor_rollout_ref.rollout
            signals = probe.frozen_signals(str(full.overrides.get(recipe.model_key)), str(full.overrides.get(recipe.train_key)),
                                     cells, cap=int(base.data.max_response_length), top_p=float(rollout.top_p),
                                     top_k=int(rollout.top_k), num_prompts=args.signal_prompts)
            args.out_dir.mkdir(parents=True, exist_ok=True)
            (args.out_dir / "frozen.json").write_text(json.dumps(signals, indent=1) + "\n")
            text = frozen_table(signals)
            (args.out_dir / "frozen.md").write_text(text + "\n")
            print(text)
            return 0
        probe_result = probe.run_probe(cells, recipe=recipe, settings=settings, demo_inputs=inputs, extra=extra, steps=args.steps,
                          batch=args.batch, out_dir=args.out_dir, signal_prompts=args.signal_prompts,
                          frozen=not args.no_frozen)
    if not args.validate:
        return 0
    chosen = [cells[i] for i in (args.validate_cells if args.validate_cells is not None else range(len(cells)))]
    log_file = args.out_dir / "full_runs.jsonl"
    runs = validation.read_runs(log_file)
    for cell in chosen:
        seeds = [seed for seed in args.seeds if not any(r["name"] == cell.name and r["seed"] == seed for r in runs)]
        for run in validation.full_runs([cell], recipe=recipe, settings=settings, demo=demo, extra=extra, seeds=seeds,
                             out_dir=args.out_dir):
            runs.append(run)
            with open(log_file, "a") as handle:
                handle.write(json.dumps(run, default=str) + "\n")
    result = validation.agreement(probe_result, runs)
    text = validation.agreement_table(result)
    if control_runs is not None:
        chosen_names = {c.name for c in chosen}
        result["versus_control"] = validation.versus_control([r for r in runs if r["name"] in chosen_names], control_runs)
        text += "\n\n" + validation.control_table(result["versus_control"])
    (args.out_dir / "validation.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out_dir / "validation.md").write_text(text + "\n")
    print(text)
    return 0
