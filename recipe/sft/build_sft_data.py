"""Build the SFT parquet (verl ``MultiTurnSFTDataset`` format) from the project's RL parquet.

Each row of the project schema (docs/ARCHITECTURE.md: ``extra_info`` holds ``problem``,
``solution``, ``cot``) becomes one two-turn conversation, as in the paper's supervised
initialization (app:sft_configuration: "problem as the user turn and generated_solution as
the assistant target, rendered with the Qwen3 chat template in thinking mode"):

- user: ``problem`` (the bare problem, no instruction);
- assistant: ``solution`` as is when it already carries a ``</think>`` block; otherwise
  ``<think>\\n{cot}\\n</think>\\n\\n{solution}`` when a ``cot`` exists; otherwise ``solution``
  (the thinking template then renders an empty think block).

``enable_thinking`` is written per row (True). With ``--tokenizer`` and ``--max-length``
rows whose rendered conversation is longer are dropped (the paper keeps <= 12,288 tokens).

    python -m recipe.sft.build_sft_data --input train.parquet --output sft.parquet \
        [--tokenizer MODEL_DIR --max-length 12288]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def assistant_target(*, solution: str, cot: str) -> str:
    """Assistant turn for one record (see the module docstring)."""
    if "</think>" in solution:
        return solution
    if cot:
        return f"<think>\n{cot}\n</think>\n\n{solution}"
    return solution


def sft_rows(frame: pd.DataFrame, *, source: str) -> list[dict]:
    """Convert RL-schema rows to ``{"messages": [...], "enable_thinking": True}`` rows."""
    if "extra_info" not in frame.columns:
        raise ValueError(f"{source}: no 'extra_info' column (expected the project's verl parquet schema)")
    rows = []
    for position, extra in enumerate(frame["extra_info"]):
        extra = dict(extra) if extra is not None else {}
        problem, solution = extra.get("problem") or "", extra.get("solution") or ""
        if not problem or not solution:
            raise ValueError(f"{source}: row {position} has an empty extra_info.problem or extra_info.solution")
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": problem},
                    {"role": "assistant", "content": assistant_target(solution=solution, cot=extra.get("cot") or "")},
                ],
                "enable_thinking": True,
            }
        )
    return rows


def build_sft_parquet(
    input_path: str | Path,
    output_path: str | Path,
    *,
    tokenizer_path: str | Path | None = None,
    max_length: int | None = None,
) -> tuple[int, int]:
    """Write the SFT parquet; return ``(rows_written, rows_dropped_for_length)``."""
    input_path, output_path = Path(input_path), Path(output_path)
    if output_path.exists():
        raise FileExistsError(f"{output_path} exists; remove it or choose another --output")
    rows = sft_rows(pd.read_parquet(input_path), source=str(input_path))
    dropped = 0
    if max_length is not None:
        if tokenizer_path is None:
            raise ValueError("--max-length needs --tokenizer to measure rendered lengths")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        kept = []
        for row in rows:
            ids = tokenizer.apply_chat_template(row["messages"], tokenize=True, enable_thinking=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            if len(ids) <= max_length:
                kept.append(row)
        dropped, rows = len(rows) - len(kept), kept
    output_path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(output_path)
    return len(rows), dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="RL parquet in the project schema")
    parser.add_argument("--output", required=True, help="SFT parquet to write (must not exist)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir, for --max-length filtering")
    parser.add_argument("--max-length", type=int, default=None, help="drop rows longer than this many tokens")
    args = parser.parse_args()
    written, dropped = build_sft_parquet(
        args.input, args.output, tokenizer_path=args.tokenizer, max_length=args.max_length
    )
    print(f"wrote {written} rows to {args.output} ({dropped} dropped for length)")


if __name__ == "__main__":
    main()
