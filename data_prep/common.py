"""Shared pieces of the data builders: loading, field normalisation, verl rows, safe writing.

Every builder runs the same stages (``docs/prompts.md``, "Data pipeline"):
load (``datasets``) -> field normalisation (counted drops, or ``--strict`` errors naming the
row id) -> decontamination against the 120 evaluation items -> (unrelated pairing) -> verl
rows -> second decontamination pass (must find zero) -> parquet + ``<out>.summary.json``.
Model-specific prompt-length filtering is a separate step (``data_prep.length_filter``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EVAL_DIR = REPO_ROOT / "data" / "eval"
DEFAULT_DAPO_PATH = REPO_ROOT / "data" / "dapo" / "dapo_math_17k.jsonl"

# The parquet extra_info keys (ARCHITECTURE.md); every one is a string except ``index``.
EXTRA_INFO_TEXT_KEYS = ("id", "split", "problem", "solution", "answer", "cot", "unrelated_problem", "unrelated_solution")

_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_records(source: str, *, split: str = "train", config_name: str | None = None):
    """A ``datasets.Dataset`` from a local json/jsonl/parquet/csv file or a dataset name.

    Local paths are read with ``load_dataset(<format>, data_files=path)``; anything else is
    passed to ``load_dataset(source, config_name, split=split)`` (hub names need network).
    """
    import datasets

    path = Path(source)
    if path.exists():
        if path.is_dir():
            raise ValueError(f"{source}: is a directory; pass a .jsonl/.json/.parquet/.csv file")
        fmt = _LOCAL_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"{source}: unknown file type {path.suffix!r}; expected one of {sorted(_LOCAL_FORMATS)}")
        return datasets.load_dataset(fmt, data_files=str(path), split="train")
    if source.endswith(tuple(_LOCAL_FORMATS)):
        raise FileNotFoundError(f"{source}: no such file")
    try:
        return datasets.load_dataset(source, config_name, split=split)
    except Exception as err:  # hub errors are long and varied; name the source and the way out
        raise RuntimeError(
            f"could not load dataset {source!r} (split {split!r}): {type(err).__name__}: {err}. "
            "Without network access, download it elsewhere and pass the local json/jsonl/parquet file."
        ) from err


@dataclass
class Counts:
    """Row counts of one build, per stage and per drop reason; saved as the summary JSON."""

    stages: dict[str, int] = field(default_factory=dict)
    drops: Counter = field(default_factory=Counter)
    dropped_ids: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)

    def drop(self, reason: str, row_id: str) -> None:
        self.drops[reason] += 1
        self.dropped_ids.setdefault(reason, []).append(row_id)

    def as_dict(self) -> dict:
        return {
            "stages": dict(self.stages),
            "drops": dict(sorted(self.drops.items())),
            "dropped_ids": {k: v for k, v in sorted(self.dropped_ids.items())},
            **self.notes,
        }


def normalise_fields(
    raw_rows: Iterable[Mapping],
    *,
    columns: Mapping[str, str],
    required: Sequence[str],
    id_prefix: str,
    id_column: str | None = None,
    counts: Counts,
    strict: bool = False,
) -> list[dict]:
    """Map source columns to ``problem/solution/answer/cot``, strip text, drop bad rows.

    Args:
        raw_rows: source rows (dicts).
        columns: target field -> source column, e.g. ``{"problem": "question"}``.
        required: target fields that must be non-empty strings; others become ``""`` when
            missing. Integer/float answers are converted to their string form.
        id_prefix: row id = ``f"{id_prefix}-{index:06d}"`` unless ``id_column`` is given.
        counts: receives ``missing_<field>`` / ``empty_<field>`` / ``non_string_<field>`` drops.
        strict: raise ``ValueError`` naming the row id and field instead of dropping.

    Returns records with ``id``, ``index`` (position in the source) and the four text fields.
    """
    unknown = set(required) - set(columns)
    if unknown:
        raise ValueError(f"required fields {sorted(unknown)} have no source column in {dict(columns)}")
    records = []
    for index, raw in enumerate(raw_rows):
        row_id = str(raw.get(id_column)) if id_column and raw.get(id_column) not in (None, "") else f"{id_prefix}-{index:06d}"
        record: dict = {"id": row_id, "index": index}
        problem_reason = None
        for target in ("problem", "solution", "answer", "cot"):
            source_col = columns.get(target)
            value = raw.get(source_col) if source_col else None
            reason = None
            if value is None:
                reason = "missing"
            elif isinstance(value, bool):
                reason = "non_string"
            elif isinstance(value, (int, float)):
                value = str(value)
            elif not isinstance(value, str):
                reason = "non_string"
            if reason is None and not value.strip():
                reason = "empty"
            if reason is not None:
                if target in required:
                    if strict:
                        raise ValueError(
                            f"row {row_id!r}: field {target!r} (source column {source_col!r}) is {reason}"
                        )
                    problem_reason = problem_reason or f"{reason}_{target}"
                value = ""
            record[target] = value.strip()
        if problem_reason is not None:
            counts.drop(problem_reason, row_id)
            continue
        records.append(record)
    return records


def make_row(record: Mapping, *, data_source: str, split: str, prompt: list[dict]) -> dict:
    """One verl parquet row (ARCHITECTURE.md "Data schema")."""
    extra = {key: str(record.get(key, "") or "") for key in EXTRA_INFO_TEXT_KEYS}
    extra["split"] = split
    extra["index"] = int(record["index"])
    return {
        "data_source": data_source,
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(record["answer"])},
        "extra_info": extra,
    }


def sidecar_path(out: Path, suffix: str) -> Path:
    """``train.parquet`` -> ``train.<suffix>.json``."""
    return out.with_name(f"{out.stem}.{suffix}.json")


def check_writable(paths: Iterable[Path], *, overwrite: bool) -> None:
    """Fail before any work if an output exists and ``overwrite`` is off."""
    existing = [str(p) for p in paths if Path(p).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"refusing to overwrite {existing}; pass --overwrite to replace them")


def write_parquet(rows: Sequence[Mapping], out: Path, *, overwrite: bool) -> None:
    import pandas as pd

    out = Path(out)
    check_writable([out], overwrite=overwrite)
    if not rows:
        raise ValueError(f"no rows left to write to {out}; see the drop counts")
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(list(rows)).to_parquet(out, index=False)


def write_json(payload: object, out: Path, *, overwrite: bool) -> None:
    out = Path(out)
    check_writable([out], overwrite=overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def read_parquet_rows(path: str | Path) -> list[dict]:
    """Rows of a verl parquet as plain python dicts (numpy arrays -> lists)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such parquet file")
    frame = pd.read_parquet(path)
    missing = {"data_source", "prompt", "reward_model", "extra_info"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: not a verl parquet of this project, missing columns {sorted(missing)}")
    rows = frame.to_dict("records")
    for row in rows:
        row["prompt"] = [dict(message) for message in row["prompt"]]
        row["extra_info"] = dict(row["extra_info"])
        row["reward_model"] = dict(row["reward_model"])
    return rows


def print_summary(summary: Mapping) -> None:
    """The counts, without the (long) id lists."""
    shown = {k: v for k, v in summary.items() if k not in ("dropped_ids", "removed")}
    print(json.dumps(shown, indent=2, ensure_ascii=False))


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="output parquet path")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")


def add_build_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by the training-corpus builders."""
    add_output_args(parser)
    parser.add_argument("--strict", action="store_true", help="a row with a missing/empty field is an error (default: counted drop)")
    parser.add_argument("--eval-dir", type=Path, default=DEFAULT_EVAL_DIR, help="folder of the evaluation *.jsonl files to decontaminate against")
    parser.add_argument("--ngram", type=int, default=13, help="n-gram size of the overlap check (words)")
    parser.add_argument("--ngram-threshold", type=float, default=0.5, help="drop a row sharing at least this fraction of an eval item's n-grams")
    parser.add_argument("--seed", type=int, default=42, help="seed of the unrelated-pair assignment")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N source rows (smoke runs)")
