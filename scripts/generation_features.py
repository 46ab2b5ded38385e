"""Stylistic and length feature rates of evaluation generations (paper Table 1(b), tab:sft_output_degen).

    python scripts/generation_features.py "no-think base=evals/base/generations.jsonl" \\
        "nth/th OPSD=evals/nth_th/generations.jsonl"

Each argument is NAME=PATH (or a PATH, named by its directory) to a ``generations.jsonl`` written by
``scripts/evaluate.py``; prints one row per run: N, mean tokens, >= 32k / >= 38k tokens, boxed,
accuracy, "wait", self-correction, ``<think>`` (% of generations, pooled over the benchmarks).
Definitions: recipe/analysis/generation_features.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recipe.analysis import generation_features as gf


def _read(spec: str) -> tuple[str, list[dict]]:
    name, sep, path = spec.partition("=")
    path = Path(path if sep else spec)
    if path.is_dir():
        path = path / "generations.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no generations.jsonl (write one with scripts/evaluate.py run)")
    records = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not JSON ({err.msg})") from None
    return (name if sep else path.parent.name), records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="NAME=PATH")
    p.add_argument("--thresholds", nargs="+", type=int, default=list(gf.LENGTH_THRESHOLDS),
                   help="length thresholds in tokens (default: 32,768 and 38,912)")
    args = p.parse_args(argv)
    named = {}
    for spec in args.runs:
        name, records = _read(spec)
        named[name] = gf.feature_rates(records, thresholds=args.thresholds)
    print(gf.rates_table(named, thresholds=args.thresholds), end="")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
