"""OpenThoughts Math 30k -> verl parquet (the main OPSD training set).

Paper (appendix "OPSD Data"): 29,434 rows; "Field normalization leaves 29,418 records before model-specific
prompt-length filtering. Each record provides a mathematics problem, reference solution, final answer, and separate
CoT trace." ``--input``: a local json/jsonl/parquet file or a Hub name (default: the official code's copy,
``siyanzhao/Openthoughts_math_30k_opsd``; needs network); column names are options (defaults: problem, solution,
answer, cot). The per-model length filter comes next (``data_prep.length_filter``, docs/prompts.md). Example::

    python -m data_prep.openthoughts --input openthoughts_math_30k.parquet \\
        --out data/parquet/openthoughts/train.parquet
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from data_prep.common import Counts, add_build_args, load_records, normalise_fields
from data_prep.pipeline import UNRELATED_CHOICES, finish_build, make_index
from recipe.common import cli

DATA_SOURCE = "openthoughts_math_30k"
DEFAULT_SOURCE = "siyanzhao/Openthoughts_math_30k_opsd"


def build(args: argparse.Namespace) -> dict:
    raw = load_records(args.input, split=args.split, limit=args.limit)
    counts = Counts(notes={"input": raw.name})
    counts.stages["source_rows"] = len(raw.rows)
    columns = {"problem": args.problem_key, "solution": args.solution_key, "answer": args.answer_key, "cot": args.cot_key}
    required = tuple(f.strip() for f in args.required.split(",") if f.strip())
    for target in required:
        if columns.get(target) not in raw.columns:
            raise cli.InputError(
                f"no column {columns.get(target)!r} for required field {target!r}; columns are {raw.columns}",
                file=raw.name, hint=f"set --{target}-key, or leave {target} out of --required",
            )
    records = normalise_fields(
        raw.rows, columns=columns, required=required, id_prefix="openthoughts", id_column=args.id_key,
        counts=counts, strict=args.strict, source=raw.name,
    )
    index = make_index(args.eval_dir, n=args.ngram, threshold=args.ngram_threshold)
    return finish_build(
        records, counts=counts, data_source=DATA_SOURCE, split="train", index=index, out=args.out,
        overwrite=args.overwrite, unrelated=args.unrelated_pool, seed=args.seed, dapo_path=args.dapo,
    )


def parser() -> argparse.ArgumentParser:
    from data_prep.common import DEFAULT_DAPO_PATH

    p = argparse.ArgumentParser(prog="python -m data_prep.openthoughts", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", default=DEFAULT_SOURCE, help="local json/jsonl/parquet file or a datasets name")
    p.add_argument("--split", default="train", help="split when --input is a datasets name")
    p.add_argument("--problem-key", default="problem")
    p.add_argument("--solution-key", default="solution")
    p.add_argument("--answer-key", default="answer")
    p.add_argument("--cot-key", default="cot")
    p.add_argument("--id-key", default=None, help="source column holding a row id (default: openthoughts-NNNNNN)")
    p.add_argument("--required", default="problem,solution,answer,cot", help="fields a row must have (comma list)")
    p.add_argument("--unrelated-pool", default="dapo", help=f"one of {list(UNRELATED_CHOICES)} or a problem/solution file")
    p.add_argument("--dapo", default=DEFAULT_DAPO_PATH, help="DAPO-Math-17k jsonl for --unrelated-pool dapo")
    add_build_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    build(parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
