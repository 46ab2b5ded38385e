"""DAPO-Math-17k -> verl parquet (GRPO training data; also the default unrelated-pair pool).

Source: ``data/dapo/dapo_math_17k.jsonl`` (17,917 unique prompts with integer answers, the instruction wrapper
removed; provenance in ``data/SOURCES.md``). Rows whose normalised problem text repeats are deduplicated: a repeated
group with one answer keeps its first row (``duplicate`` drops), a group with conflicting answers is dropped entirely
(``conflicting_duplicate``). The prompt is the paper's student message; the paper's GRPO control renders it in
thinking mode and keeps prompts of at most 1,024 tokens (``data_prep.length_filter`` with no teacher context).

Example::

    python -m data_prep.dapo --out data/parquet/dapo/train.parquet
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence

from data_prep.common import DEFAULT_DAPO_PATH, Counts, add_build_args, load_records, normalise_fields
from data_prep.decontaminate import exact_key
from data_prep.pipeline import finish_build, make_index
from recipe.common import cli

DATA_SOURCE = "dapo_math_17k"


def deduplicate(records: list[dict], counts: Counts) -> list[dict]:
    """First row of each normalised problem; groups with conflicting answers dropped whole."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[exact_key(record["problem"])].append(record)
    kept = []
    for record in records:
        group = groups[exact_key(record["problem"])]
        if len({r["answer"] for r in group}) > 1:
            counts.drop("conflicting_duplicate", record["id"])
        elif group[0] is not record:
            counts.drop("duplicate", record["id"])
        else:
            kept.append(record)
    return kept


def build(args: argparse.Namespace) -> dict:
    raw = load_records(str(args.input), limit=args.limit)
    counts = Counts(notes={"input": raw.name})
    counts.stages["source_rows"] = len(raw.rows)
    records = normalise_fields(
        raw.rows, columns={"problem": args.problem_key, "answer": args.answer_key}, required=("problem", "answer"),
        id_prefix="dapo", id_column=args.id_key, counts=counts, strict=args.strict, source=raw.name,
    )
    counts.stages["after_field_normalisation"] = len(records)
    records = deduplicate(records, counts)
    index = make_index(args.eval_dir, n=args.ngram, threshold=args.ngram_threshold)
    return finish_build(
        records, counts=counts, data_source=DATA_SOURCE, split="train", index=index, out=args.out,
        overwrite=args.overwrite, unrelated="none",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep.dapo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", default=DEFAULT_DAPO_PATH, help="DAPO jsonl/parquet (local file or datasets name)")
    p.add_argument("--problem-key", default="problem")
    p.add_argument("--answer-key", default="answer")
    p.add_argument("--id-key", default="id")
    add_build_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    build(parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
