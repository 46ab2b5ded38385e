"""OpenMathReasoning ``cot`` split -> verl parquet (cross-dataset replication, GRPO subsets).

Each ``generated_solution`` is split at its ``</think>`` into the internal CoT (``<think>`` removed) and the
post-thinking solution; ``expected_answer`` is the answer. Rows without exactly one ``</think>``, or with an empty
part, are counted drops. Paper subsets (appendix "OPSD Data"): post-thinking solutions of at most 1,024 tokens
(``--solution-tokens 0:1024``) or 2,048-4,096 tokens (``--solution-tokens 2048:4096``), counted with the model's
tokenizer (bounds inclusive); the released-model GRPO runs use the integer-answer subset with source solutions
capped at 12,288 tokens (``--integer-answers-only --max-source-tokens 12288``). Example::

    python -m data_prep.openmathreasoning --input omr_cot.parquet --tokenizer Qwen/Qwen3-1.7B \\
        --solution-tokens 0:1024 --out data/parquet/omr/le1k.parquet
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from data_prep.common import Counts, add_build_args, load_records, normalise_fields
from data_prep.pipeline import UNRELATED_CHOICES, finish_build, make_index
from recipe.common import cli

DATA_SOURCE = "openmathreasoning_cot"
DEFAULT_SOURCE = "nvidia/OpenMathReasoning"
_INTEGER = re.compile(r"[+-]?\d+")


def split_generated_solution(text: str) -> tuple[str, str] | str:
    """(cot, post-thinking solution), or the drop reason."""
    if text.count("</think>") != 1:
        return "no_think_close" if "</think>" not in text else "multiple_think_close"
    cot, solution = text.split("</think>")
    cot = cot.strip()
    if cot.startswith("<think>"):
        cot = cot[len("<think>") :].strip()
    if not cot:
        return "empty_cot"
    if not solution.strip():
        return "empty_post_thinking_solution"
    return cot, solution.strip()


def parse_range(spec: str) -> tuple[int, int]:
    lo, sep, hi = spec.partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit() or int(lo) > int(hi):
        raise cli.InputError(f"--solution-tokens {spec!r}: expected LO:HI with integers 0 <= LO <= HI")
    return int(lo), int(hi)


def build(args: argparse.Namespace) -> dict:
    lo_hi = parse_range(args.solution_tokens) if args.solution_tokens else None
    if (args.solution_tokens or args.max_source_tokens) and not args.tokenizer:
        raise cli.InputError("--solution-tokens / --max-source-tokens count tokens", hint="pass --tokenizer")
    raw = load_records(args.input, split=args.split, limit=args.limit)
    counts = Counts(notes={"input": raw.name})
    counts.stages["source_rows"] = len(raw.rows)
    records = normalise_fields(
        raw.rows, columns={"problem": args.problem_key, "solution": args.generated_solution_key, "answer": args.answer_key},
        required=("problem", "solution", "answer"), id_prefix="omr", id_column=args.id_key, counts=counts,
        strict=args.strict, source=raw.name,
    )
    split_records = []
    for record in records:
        parts = split_generated_solution(record["solution"])
        if isinstance(parts, str):
            if args.strict:
                raise cli.InputError(f"{args.generated_solution_key}: {parts}", file=raw.name, row=record["id"],
                                     hint="fix the row, or leave out --strict to count and skip such rows")
            counts.drop(parts, record["id"])
            continue
        if args.integer_answers_only and not _INTEGER.fullmatch(record["answer"]):
            counts.drop("non_integer_answer", record["id"])
            continue
        record["cot"], record["source_solution"], record["solution"] = parts[0], record["solution"], parts[1]
        split_records.append(record)
    counts.stages["after_think_split"] = len(split_records)
    if args.solution_tokens or args.max_source_tokens:
        from data_prep.length_filter import load_tokenizer, token_counts

        tokenizer = load_tokenizer(args.tokenizer, None)
        kept = []
        sol_lengths = token_counts(tokenizer, [r["solution"] for r in split_records])
        src_lengths = token_counts(tokenizer, [r["source_solution"] for r in split_records]) if args.max_source_tokens else None
        lo, hi = lo_hi or (0, None)
        for i, record in enumerate(split_records):
            if hi is not None and not lo <= sol_lengths[i] <= hi:
                counts.drop(f"solution_tokens_outside_{lo}:{hi}", record["id"])
            elif src_lengths is not None and src_lengths[i] > args.max_source_tokens:
                counts.drop(f"source_solution_over_{args.max_source_tokens}", record["id"])
            else:
                kept.append(record)
        split_records = kept
        counts.notes["length_buckets"] = {"tokenizer": args.tokenizer, "solution_tokens": args.solution_tokens,
                                          "max_source_tokens": args.max_source_tokens}
        counts.stages["after_length_buckets"] = len(split_records)
    index = make_index(args.eval_dir, n=args.ngram, threshold=args.ngram_threshold)
    return finish_build(
        split_records, counts=counts, data_source=DATA_SOURCE, split="train", index=index, out=args.out,
        overwrite=args.overwrite, unrelated=args.unrelated_pool, seed=args.seed, dapo_path=args.dapo,
    )


def parser() -> argparse.ArgumentParser:
    from data_prep.common import DEFAULT_DAPO_PATH

    p = argparse.ArgumentParser(prog="python -m data_prep.openmathreasoning", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", default=DEFAULT_SOURCE, help="local json/jsonl/parquet file or a datasets name")
    p.add_argument("--split", default="cot", help="split when --input is a datasets name")
    p.add_argument("--problem-key", default="problem")
    p.add_argument("--generated-solution-key", default="generated_solution")
    p.add_argument("--answer-key", default="expected_answer")
    p.add_argument("--id-key", default=None, help="source column holding a row id (default: omr-NNNNNN)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the solution-length buckets")
    p.add_argument("--solution-tokens", default=None, metavar="LO:HI", help="keep post-thinking solutions of LO..HI tokens")
    p.add_argument("--max-source-tokens", type=int, default=None, help="drop rows whose full generated_solution is longer")
    p.add_argument("--integer-answers-only", action="store_true", help="keep rows whose expected_answer is an integer")
    p.add_argument("--unrelated-pool", default="dapo", help=f"one of {list(UNRELATED_CHOICES)} or a problem/solution file")
    p.add_argument("--dapo", default=DEFAULT_DAPO_PATH, help="DAPO-Math-17k jsonl for --unrelated-pool dapo")
    add_build_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    build(parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
