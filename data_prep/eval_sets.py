"""The four evaluation sets (AIME 2024, AIME 2025, AIME 2026, HMMT Feb 2025) -> verl parquet.

Source: ``data/eval/*.jsonl`` (30 rows each, ``id/problem/answer``; provenance in
``data/SOURCES.md``). The prompt is the paper's evaluation message ("{problem}\\n\\n" + the
boxed instruction, no "Problem:" label); ``data_source`` is the file stem; the answer is the
ground truth. One parquet per set in ``--out-dir`` plus ``eval.summary.json``.

Example::

    python -m data_prep.eval_sets --out-dir data/parquet/eval
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from data_prep.common import DEFAULT_EVAL_DIR, Counts, check_writable, make_row, normalise_fields, print_summary, write_json, write_parquet
from recipe.common import cli
from recipe.common.prompts import eval_messages


def build(eval_dir: Path, out_dir: Path, *, overwrite: bool) -> dict:
    files = sorted(Path(eval_dir).glob("*.jsonl"))
    if not files:
        raise cli.MissingInputError("no *.jsonl evaluation files", file=eval_dir, hint="pass --eval-dir (default: data/eval)")
    outs = [Path(out_dir) / f"{f.stem}.parquet" for f in files]
    summary_path = Path(out_dir) / "eval.summary.json"
    check_writable([*outs, summary_path], overwrite=overwrite)
    summary: dict = {"sets": {}}
    for path, out in zip(files, outs):
        counts = Counts(notes={"input": str(path)})
        # evaluation rows are never dropped silently: a bad row is an error
        records = normalise_fields(
            [row for _, row in cli.iter_jsonl(path, what="evaluation file")], columns={"problem": "problem", "answer": "answer"},
            required=("problem", "answer"), id_prefix=path.stem, id_column="id", counts=counts, strict=True, source=str(path),
        )
        rows = [make_row(r, data_source=path.stem, split="test", prompt=eval_messages(r["problem"])) for r in records]
        write_parquet(rows, out, overwrite=overwrite, counts=counts)
        summary["sets"][path.stem] = {"source": str(path), "output": str(out), "rows": len(rows)}
    summary["total_rows"] = sum(s["rows"] for s in summary["sets"].values())
    write_json(summary, summary_path, overwrite=overwrite)
    print_summary(summary)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_prep.eval_sets", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--eval-dir", type=Path, default=DEFAULT_EVAL_DIR, help="folder of the evaluation *.jsonl files")
    p.add_argument("--out-dir", type=Path, required=True, help="folder for <set>.parquet files")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    cli.add_debug_argument(p)
    args = p.parse_args(argv)
    build(args.eval_dir, args.out_dir, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
