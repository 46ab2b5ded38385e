"""Read a verl run's step metrics from its console log or its JSONL file log (stdlib only).

verl 0.9.1 (``verl/utils/tracking.py``) has two local loggers, chosen by ``trainer.logger``: ``console``
prints ``step:N - key:value - ...`` per step (values by ``pprint.pformat``, e.g. ``np.float64(0.5)``; inside
Ray prefixed ``(TaskRunner pid=...)``; numbers only, lossy), ``file`` appends ``{"step": N, "data": {...}}``
to ``$VERL_FILE_LOGGER_PATH`` (default ``<$VERL_FILE_LOGGER_ROOT or .>/<project>/<experiment>.jsonl``; exact: the
recipes enable it). Both readers return rows ``{"step": N, metric: value, ...}`` sorted by step, a step
logged twice (validation apart, a resumed run) merged with later values winning. Callers: the monitor,
the figures, the compute comparison, the probe, the CPU demos, the GPU check, the launcher's progress line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from recipe.common.cli import InputError, require_file

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `step:12 - ` anywhere on the line (Ray prefixes worker output with "(Actor pid=...) "; verl's SFT
# trainer prints it right after its tqdm bar, "...4.07s/it]step:110 - "), not `global_step:` / `s/step:`.
_STEP_RE = re.compile(r"(?:^|[^\w/])step:(\d+)(?= - |\s*$)")
# pprint of numpy / torch scalars: np.float64(0.5), np.int64(3), np.True_
_WRAPPED_RE = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")
_NUMPY_BOOL = {"np.True_": 1.0, "np.False_": 0.0, "True": 1.0, "False": 0.0}


def parse_value(text: str) -> float | None:
    """A console value as float (``0.5``, ``-1e-3``, ``nan``, ``np.float64(0.5)``, ``True``), else None."""
    text = text.strip()
    if text in _NUMPY_BOOL:
        return _NUMPY_BOOL[text]
    match = _WRAPPED_RE.match(text)
    if match:
        text = match.group(1).strip()
    try:
        return float(text)
    except ValueError:
        return None


def parse_console_line(line: str) -> dict[str, float] | None:
    """``{"step": N, key: value, ...}`` from one verl console line, or None if it is not one."""
    line = _ANSI_RE.sub("", line).rstrip("\n")
    match = _STEP_RE.search(line)
    if match is None:
        return None
    row: dict[str, float] = {"step": int(match.group(1))}
    rest = line[match.end() :]
    for item in rest.split(" - "):
        key, sep, value = item.rpartition(":")
        if not sep or not key.strip():
            continue
        parsed = parse_value(value)
        if parsed is not None:
            row[key.strip()] = parsed
    return row


def read_console_log(path: str | Path) -> list[dict[str, float]]:
    """Step rows from a console log (stdout of ``main_ppo`` / ``main_opsd``)."""
    path = Path(path)
    rows = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            row = parse_console_line(line)
            if row is not None:
                rows.append(row)
    return merge_steps(rows)


def read_jsonl_metrics(path: str | Path) -> list[dict[str, float]]:
    """Step rows from verl's file logger (``{"step": N, "data": {...}}`` per line).

    Flat lines ``{"step": N, key: value}`` are accepted too. Non-numeric values are dropped.
    A last line without its newline that is not JSON is a write in progress (a running run)
    and is skipped; any other bad line is an ``InputError`` naming the file and line.
    """
    path = Path(path)
    rows = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):  # only the last line can lack its newline
                    break  # the logger is writing this line right now
                raise InputError(f"not a JSON line ({err.msg}, column {err.colno})", file=path, line=lineno,
                                 hint="fix or delete the line") from None
            if not isinstance(record, dict) or not isinstance(record.get("step"), (int, float)):
                raise InputError("expected an object with a numeric `step` field", file=path, line=lineno,
                                 hint="pass verl's file-logger .jsonl (trainer.logger=[console,file])")
            data = record.get("data", record)
            if not isinstance(data, dict):
                raise InputError("`data` must be an object", file=path, line=lineno)
            row: dict[str, float] = {"step": int(record["step"])}
            for key, value in data.items():
                if key == "step":
                    continue
                number = _number(value)
                if number is not None:
                    row[key] = number
            rows.append(row)
    return merge_steps(rows)


def read_run_metrics(path: str | Path) -> list[dict[str, float]]:
    """Step rows from a ``.jsonl`` file log or any other file read as a console log."""
    path = require_file(path, what="run log")
    if path.suffix == ".jsonl":
        return read_jsonl_metrics(path)
    rows = read_console_log(path)
    if not rows:
        raise InputError("no `step:N - key:value` lines found", file=path,
                         hint="pass a verl console log or its file-logger .jsonl")
    return rows


def merge_steps(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    """One row per step, sorted; later rows of the same step override earlier keys."""
    merged: dict[int, dict[str, float]] = {}
    for row in rows:
        step = int(row["step"])
        merged.setdefault(step, {"step": step}).update({k: v for k, v in row.items() if k != "step"})
    return [merged[step] for step in sorted(merged)]


def metric_series(rows: Iterable[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged ``key``."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if value is not None:
            steps.append(int(row["step"]))
            values.append(float(value))
    return steps, values


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


__all__ = [
    "merge_steps",
    "metric_series",
    "parse_console_line",
    "parse_value",
    "read_console_log",
    "read_jsonl_metrics",
    "read_run_metrics",
]
