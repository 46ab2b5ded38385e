"""The paper's figures from run logs and result JSON (PNG, CPU only): ``python scripts/make_figures.py``.

Subcommands (each writes one PNG to ``--out``; ``--overwrite`` replaces it): ``dynamics`` (training curves),
``accuracy`` (Avg@n / Pass@n vs step), ``cap-sweep`` (OPSD vs Base across rollout caps), ``pca`` and ``windows``
(from signals.json files of scripts/analyze_signals.py). The spec JSON of ``accuracy`` and of ``cap-sweep``:

    {"Qwen3-1.7B": {"0": "eval/base", "50": "eval/step50/results.json", ...}}
    {"Qwen3-1.7B": {"base": "eval/base", "caps": {"128": "eval/opsd128", "256": ...}}}

Paths in a spec are relative to the spec file; each names an evaluation ``results.json``
(scripts/evaluate.py) or its directory. Drawing: recipe/analysis/plots.py; examples: docs/analysis.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recipe.analysis import plots
from recipe.analysis.run_logs import read_run_metrics
from recipe.analysis.signal_pca import joint_pca
from recipe.common import cli


def _load_spec(path: str) -> dict[str, dict]:
    """A spec JSON: an object of models, each an object (see the module docstring)."""
    spec = cli.read_json(path, what="spec JSON")
    if not isinstance(spec, dict) or not all(isinstance(entry, dict) for entry in spec.values()):
        raise cli.InputError("expected an object {model name: {...}}", file=path, hint="see --help for the spec layout")
    return spec


def _step(spec_path: str, name: str, key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise cli.InputError(f"model {name!r}: {key!r} is not an integer step / cap", file=spec_path) from None


def _load_signals(path: str) -> dict:
    result = cli.read_json(path, what="signals.json")
    if not isinstance(result, dict) or not {"model", "conditions"} <= set(result):
        raise cli.InputError("not a signals.json of scripts/analyze_signals.py (no 'model' / 'conditions')", file=path)
    return result


def _resolve(spec_path: str, target: str) -> Path:
    target_path = Path(target)
    return target_path if target_path.is_absolute() else Path(spec_path).parent / target_path


def cmd_dynamics(args) -> Path:
    runs = {}
    for item in args.run:
        name, sep, path = item.partition("=")
        if not sep:
            raise cli.InputError(f"--run takes NAME=LOG, got {item!r}")
        runs[name] = read_run_metrics(path)
    metrics = plots.DYNAMICS_METRICS
    if args.metric:
        metrics = tuple(tuple(m.split("=", 1)) if "=" in m else (m, m) for m in args.metric)
    return plots.plot_training_dynamics(
        runs, args.out, metrics=metrics, smooth=args.smooth, start_step=args.start_step, title=args.title,
        overwrite=args.overwrite,
    )


def cmd_accuracy(args) -> Path:
    spec = _load_spec(args.spec)
    runs, n = {}, 8
    for name, points in spec.items():
        rows = []
        for step, target in points.items():
            step = _step(args.spec, name, step)
            numbers = plots.read_eval_results(_resolve(args.spec, target), dataset=args.dataset)
            n = numbers["n"]
            rows.append({"step": step, "avg": numbers["avg"], "pass": numbers["pass"]})
        runs[name] = rows
    return plots.plot_accuracy_vs_step(runs, args.out, n=n, overwrite=args.overwrite)


def cmd_cap_sweep(args) -> Path:
    spec = _load_spec(args.spec)
    models, n = {}, 8
    for name, entry in spec.items():
        if not isinstance(entry.get("caps"), dict):
            raise cli.InputError(f"model {name!r} needs a 'caps' mapping cap -> results", file=args.spec)
        caps = sorted(entry["caps"], key=lambda cap: _step(args.spec, name, cap))
        opsd = {"avg": [], "pass": [], "length": []}
        for cap in caps:
            numbers = plots.read_eval_results(_resolve(args.spec, entry["caps"][cap]), dataset=args.dataset)
            n = numbers["n"]
            for key in opsd:
                opsd[key].append(numbers[key])
        base = plots.read_eval_results(_resolve(args.spec, entry["base"]), dataset=args.dataset) if "base" in entry else {}
        models[name] = {"caps": [int(c) for c in caps], "opsd": opsd, "base": base}
    return plots.plot_metric_vs_cap(models, args.out, n=n, overwrite=args.overwrite)


def cmd_pca(args) -> Path:
    results = [_load_signals(path) for path in args.analysis]
    with cli.reraise_as_input(ValueError, KeyError, hint="pass signals.json files of scripts/analyze_signals.py"):
        points, explained = joint_pca(results)
    title = args.title or ("Joint PCA, features standardised within each model" if len(results) > 1 else results[0]["model"])
    return plots.plot_pca_scatter(points, args.out, explained=explained, title=title, overwrite=args.overwrite)


def cmd_windows(args) -> Path:
    windows = {}
    for path in args.analysis:
        result = _load_signals(path)
        for cond, rep in result["conditions"].items():
            label = cond if len(args.analysis) == 1 else f"{result['model']} {cond}"
            if not isinstance(rep, dict) or "position_windows" not in rep:
                raise cli.InputError(f"condition {cond!r} has no position_windows", file=path)
            windows[label] = rep["position_windows"]
    return plots.plot_position_windows(windows, args.out, overwrite=args.overwrite)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--out", required=True, help="output .png")
        p.add_argument("--overwrite", action="store_true")
        p.set_defaults(func=func)
        return p

    p = add("dynamics", cmd_dynamics, "training curves from run logs")
    p.add_argument("--run", action="append", required=True, metavar="NAME=LOG", help="verl .jsonl file log or console log")
    p.add_argument("--metric", action="append", default=[], metavar="KEY[=LABEL]",
                   help="panels (default: student entropy, forward KL, clipped loss, grad norm)")
    p.add_argument("--smooth", type=int, default=5, help="moving-average window (paper: 5)")
    p.add_argument("--start-step", type=int, default=2, help="first step drawn (paper: 2, step 1 is a startup batch)")
    p.add_argument("--title", default=None)
    for name, func, text in (("accuracy", cmd_accuracy, "accuracy vs training step"),
                             ("cap-sweep", cmd_cap_sweep, "OPSD vs Base across rollout caps")):
        p = add(name, func, text)
        p.add_argument("--spec", required=True, help="spec JSON (see the module docstring)")
        p.add_argument("--dataset", default=None, help="one benchmark instead of the macro average")
    p = add("pca", cmd_pca, "rollout-level signal PCA")
    p.add_argument("--analysis", nargs="+", required=True, help="signals.json files")
    p.add_argument("--title", default=None)
    p = add("windows", cmd_windows, "forward KL by response-position window")
    p.add_argument("--analysis", nargs="+", required=True, help="signals.json files")

    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if Path(args.out).suffix.lower() != ".png":
        raise cli.InputError("--out must end in .png", file=args.out)
    cli.refuse_overwrite([args.out], overwrite=args.overwrite, other="another --out")
    print(f"wrote {args.func(args)}")
    return 0
