"""Shared pieces of the data builders: loading, field normalisation, verl rows, safe writing.

Every builder runs the same stages (``docs/prompts.md``, "Data pipeline"):
load (``datasets``) -> field normalisation (counted drops, or ``--strict`` errors naming the
row id) -> decontamination against the 120 evaluation items -> (unrelated pairing) -> verl
rows -> second decontamination pass (must find zero) -> parquet + ``<out>.summary.json``.
Model-specific prompt-length filtering is a separate step (``data_prep.length_filter``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recipe.common import cli

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EVAL_DIR = REPO_ROOT / "data" / "eval"
DEFAULT_DAPO_PATH = REPO_ROOT / "data" / "dapo" / "dapo_math_17k.jsonl"

# The parquet extra_info keys (ARCHITECTURE.md); every one is a string except ``index``.
EXTRA_INFO_TEXT_KEYS = ("id", "split", "problem", "solution", "answer", "cot", "unrelated_problem", "unrelated_solution")

_LOCAL_FORMATS = (".jsonl", ".json", ".parquet", ".csv")
_NO_NETWORK_HINT = "without network access, download it elsewhere and pass the local json/jsonl/parquet file"


@dataclass(frozen=True)
class Source:
    """The rows of one input: ``name`` (path or dataset name, for messages), ``rows``, ``columns``.

    ``rows`` is a list of dicts for local files and a ``datasets.Dataset`` for a hub name;
    both give ``len()`` and iterate as dicts.
    """

    name: str
    rows: Sequence[Mapping]
    columns: list[str]


class _ParquetRows(Sequence):
    """The rows of a local parquet file as dicts, read batch by batch when iterated (no full copy)."""

    def __init__(self, path: Path, limit: int | None):
        import pyarrow.parquet as pq

        self.path = path
        self.file = pq.ParquetFile(path)
        total = self.file.metadata.num_rows
        self.length = total if limit is None else min(limit, total)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):  # Sequence protocol; the builders only iterate
        return list(self)[index]

    def __iter__(self):
        left = self.length
        for batch in self.file.iter_batches(batch_size=1024):
            for row in batch.to_pylist()[:left]:
                yield row
            left -= min(left, batch.num_rows)
            if not left:
                return


def _read_json_rows(path: Path) -> list[dict]:
    """A ``.jsonl`` file, or a ``.json`` file holding either one array of objects or JSON lines."""
    if path.suffix.lower() == ".json":
        with open(path, encoding="utf-8") as handle:
            head = handle.read(4096).lstrip()
        if head.startswith("["):
            rows = cli.read_json(path, what="JSON file")
            for i, row in enumerate(rows):
                if not isinstance(row, dict):
                    raise cli.InputError(f"array element {i} is a {type(row).__name__}, expected an object", file=path,
                                         hint="a .json input is an array of objects or one object per line")
            return rows
    return [row for _, row in cli.iter_jsonl(path, what="input file")]


def load_records(source: str, *, split: str = "train", config_name: str | None = None, limit: int | None = None) -> Source:
    """The rows of a local json/jsonl/parquet/csv file or of a ``datasets`` hub name (first ``limit`` only).

    Local files are read here (a malformed JSON line is an :class:`~recipe.common.cli.InputError`
    naming the file and line); anything else goes to ``datasets.load_dataset(source, config_name,
    split=split)`` (hub names need network).
    """
    path = Path(source)
    if path.exists() or source.endswith(_LOCAL_FORMATS):
        cli.require_file(path, what="input file", hint="pass a .jsonl/.json/.parquet/.csv file or a dataset name")
        suffix = path.suffix.lower()
        if suffix not in _LOCAL_FORMATS:
            raise cli.InputError(f"unknown file type {path.suffix!r}", file=path, hint=f"expected one of {list(_LOCAL_FORMATS)}")
        if suffix == ".parquet":
            try:
                rows = _ParquetRows(path, limit)
            except Exception as err:  # pyarrow raises ArrowInvalid / OSError subclasses for a non-parquet file
                raise cli.InputError(f"not a readable parquet file ({type(err).__name__}: {err})", file=path) from err
            return Source(str(path), rows, list(rows.file.schema_arrow.names))
        if suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                rows = list(itertools.islice(reader, limit))
                columns = list(reader.fieldnames or [])
        else:
            rows = _read_json_rows(path)[:limit]
            columns = list(dict.fromkeys(key for row in rows for key in row))
        return Source(str(path), rows, columns)
    import datasets

    try:
        dataset = datasets.load_dataset(source, config_name, split=split)
    except Exception as err:  # hub errors are long and varied; name the source and the way out
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise cli.InputError(f"could not load dataset (split {split!r}): {type(err).__name__}: {first}", file=source,
                             hint=_NO_NETWORK_HINT) from err
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return Source(source, dataset, list(dataset.column_names))


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
    source: str | None = None,
) -> list[dict]:
    """Map source columns to ``problem/solution/answer/cot``, strip text, drop bad rows.

    Args:
        raw_rows: source rows (dicts).
        columns: target field -> source column, e.g. ``{"problem": "question"}``.
        required: target fields that must be non-empty strings; others become ``""`` when
            missing. Integer/float answers are converted to their string form.
        id_prefix: row id = ``f"{id_prefix}-{index:06d}"`` unless ``id_column`` is given.
        counts: receives ``missing_<field>`` / ``empty_<field>`` / ``non_string_<field>`` drops.
        strict: raise an ``InputError`` naming ``source``, the row id and the field instead of dropping.
        source: the input's path or name, for that error.

    Returns records with ``id``, ``index`` (position in the source) and the four text fields.
    """
    unknown = set(required) - set(columns)
    if unknown:
        raise ValueError(f"required fields {sorted(unknown)} have no source column in {dict(columns)}")  # a caller bug
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
                        raise cli.InputError(
                            f"field {target!r} (source column {source_col!r}) is {reason}", file=source, row=row_id,
                            hint="fix the row, or leave out --strict to count and skip such rows",
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
    """Fail before any work if an output exists and ``overwrite`` is off (``OutputExistsError``)."""
    cli.refuse_overwrite(paths, overwrite=overwrite, other="another --out")


def write_parquet(rows: Sequence[Mapping], out: Path, *, overwrite: bool, counts: Counts | None = None) -> None:
    """Write ``rows``; an empty result is an input error naming the input (``counts.notes["input"]``)
    and the drop reasons in ``counts``."""
    import pandas as pd

    out = Path(out)
    check_writable([out], overwrite=overwrite)
    if not rows:
        reasons = ", ".join(f"{reason} {n}" for reason, n in (counts.drops.most_common(3) if counts else []))
        raise cli.InputError(
            f"no rows left to write to {out}" + (f"; rows dropped: {reasons}" if reasons else ""),
            file=counts.notes.get("input") if counts else None, hint="check the input file and the column / filter options",
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    pd.DataFrame(list(rows)).to_parquet(partial, index=False)
    os.replace(partial, out)  # a killed run leaves no half-written output under the real name


def write_json(payload: object, out: Path, *, overwrite: bool) -> None:
    out = Path(out)
    check_writable([out], overwrite=overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    partial.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    os.replace(partial, out)


def read_parquet_rows(path: str | Path) -> list[dict]:
    """Rows of a verl parquet as plain python dicts (numpy arrays -> lists)."""
    import pandas as pd

    path = cli.require_file(path, what="parquet file")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError subclasses for a non-parquet file
        raise cli.InputError(f"not a readable parquet file ({type(err).__name__}: {err})", file=path) from err
    missing = {"data_source", "prompt", "reward_model", "extra_info"} - set(frame.columns)
    if missing:
        raise cli.InputError(f"not a verl parquet of this project, missing columns {sorted(missing)}", file=path,
                             hint="pass a file written by a data_prep builder")
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
    cli.add_debug_argument(parser)


def add_build_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by the training-corpus builders."""
    add_output_args(parser)
    parser.add_argument("--strict", action="store_true", help="a row with a missing/empty field is an error (default: counted drop)")
    parser.add_argument("--eval-dir", type=Path, default=DEFAULT_EVAL_DIR, help="folder of the evaluation *.jsonl files to decontaminate against")
    parser.add_argument("--ngram", type=int, default=13, help="n-gram size of the overlap check (words)")
    parser.add_argument("--ngram-threshold", type=float, default=0.5, help="drop a row sharing at least this fraction of an eval item's n-grams")
    parser.add_argument("--seed", type=int, default=42, help="seed of the unrelated-pair assignment")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N source rows (smoke runs)")
