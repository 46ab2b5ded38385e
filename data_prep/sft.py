"""Supervised-initialization data: a built parquet (with cot + solution) -> verl SFT parquet.

Paper (appendix "Supervised-Initialization Data"): "We use ``problem`` as the user turn and ``generated_solution``
as the assistant target, render both with the Qwen3 chat template in Th mode, and keep sequences of at most 12,288
tokens." Each row becomes ``messages`` = the user ``problem`` and the assistant ``solution`` with ``reasoning_content``
``cot`` (how ``qwen3.jinja`` and verl's ``MultiTurnSFTDataset`` render it: docs/prompts.md); rows longer than
``--max-length`` (rendered, think mode) are dropped and counted, never truncated. Example::

    python -m data_prep.sft --input data/parquet/omr/all.parquet --tokenizer Qwen/Qwen3-1.7B \\
        --out data/parquet/omr/sft.parquet
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from data_prep.common import Counts, add_output_args, check_writable, print_summary, read_parquet_rows, sidecar_path, write_json, write_parquet
from recipe.common import cli
from recipe.common.prompts import student_messages


def sft_messages(extra: dict, *, user_prompt: str = "raw") -> list[dict]:
    """The (user, assistant) turns of one row; ``user_prompt`` raw = the problem text alone."""
    if user_prompt == "raw":
        user = [{"role": "user", "content": extra["problem"]}]
    elif user_prompt == "student":
        user = student_messages(extra["problem"])
    else:
        raise ValueError(f"user_prompt {user_prompt!r} is not one of ['raw', 'student']")
    return user + [{"role": "assistant", "content": extra["solution"], "reasoning_content": extra["cot"]}]


def build(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    check_writable([out, sidecar_path(out, "summary")], overwrite=args.overwrite)
    rows = read_parquet_rows(args.input)
    counts = Counts(notes={"input": str(args.input)})
    counts.stages["input_rows"] = len(rows)
    candidates = []
    for row in rows:
        extra = row["extra_info"]
        missing = [name for name in ("problem", "solution", "cot") if not (extra.get(name) or "").strip()]
        if missing:
            counts.drop(f"empty_{missing[0]}", str(extra.get("id")))
            continue
        candidates.append({"messages": sft_messages(extra, user_prompt=args.user_prompt), "extra_info": extra})
    kept = candidates
    if args.tokenizer:
        from data_prep.length_filter import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer, args.chat_template)
        kept = []
        for row in candidates:
            ids = tokenizer.apply_chat_template(row["messages"], tokenize=True, enable_thinking=True)
            n_tokens = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
            if n_tokens > args.max_length:
                counts.drop(f"sequence_over_{args.max_length}", str(row["extra_info"].get("id")))
            else:
                kept.append(row)
    counts.stages["written"] = len(kept)
    write_parquet(kept, out, overwrite=args.overwrite, counts=counts)
    summary = {"input": str(args.input), "output": str(out), "tokenizer": args.tokenizer,
               "max_length": args.max_length if args.tokenizer else None, "user_prompt": args.user_prompt, **counts.as_dict()}
    write_json(summary, sidecar_path(out, "summary"), overwrite=args.overwrite)
    print_summary(summary)
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep.sft", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", required=True, type=Path, help="a parquet written by a data_prep builder (needs cot + solution)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the --max-length filter (omit: no length filter)")
    p.add_argument("--chat-template", type=Path, default=None, help="jinja file replacing the tokenizer's chat template")
    p.add_argument("--max-length", type=int, default=12288, help="rendered sequence cap in tokens (think mode)")
    p.add_argument("--user-prompt", default="raw", choices=["raw", "student"], help="user turn: the problem alone (paper) or the student message")
    add_output_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    build(parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
