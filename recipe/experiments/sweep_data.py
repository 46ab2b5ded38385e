"""Data steps of the experiment presets (``sweep.data_prep``), run by the sweep runner before training.

- ``gold_trace_deciles`` (``context_short_prefix`` / ``context_long_prefix``, paper tab:teacher_cotlen): the rows
  whose gold-trace token length decile is in [lo, hi] (``decile_keep_mask``), in their original order;
- ``grpo_order`` (``opsd_vs_grpo_matched``, paper tab:opsd_grpo_compute): the first ``num_rows`` rows of verl's
  shuffled training sampler for a seed (``sampler_order``), in that order.

``prepare`` writes the output with a ``<output>.prep.json`` sidecar (step spec + source sha256) and reuses an
existing output only when its sidecar matches (else an error). Rules and conditions: docs/presets.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch

KINDS = ("gold_trace_deciles", "grpo_order")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def decile_keep_mask(lengths: Sequence[int], *, lo: int, hi: int) -> list[bool]:
    """True for rows whose length decile (0 = shortest tenth) is in [lo, hi]; ties keep row order."""
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= 9):
        raise ValueError(f"deciles must be integers with 0 <= lo <= hi <= 9; got [{lo!r}, {hi!r}]")
    n = len(lengths)
    if n == 0:
        raise ValueError("decile filter: no rows")
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    decile = [0] * n
    for rank, i in enumerate(order):
        decile[i] = 10 * rank // n
    return [lo <= d <= hi for d in decile]


def sampler_order(dataset_size: int, *, seed: int, num_rows: int) -> list[int]:
    """The first ``num_rows`` dataset indices verl's shuffled training sampler yields for ``seed``."""
    from torchdata.stateful_dataloader.sampler import RandomSampler

    if dataset_size < 1 or num_rows < 1:
        raise ValueError(f"dataset_size and num_rows must be >= 1; got {dataset_size}, {num_rows}")
    generator = torch.Generator()
    generator.manual_seed(seed)
    sampler = RandomSampler(data_source=range(dataset_size), generator=generator)
    order: list[int] = []
    while len(order) < num_rows:  # next epoch: a new permutation from the same generator
        for index in sampler:
            order.append(int(index))
            if len(order) == num_rows:
                break
    return order


def _gold_trace(row_extra: Mapping, field: str, *, row: int, source: Path) -> str:
    if not isinstance(row_extra, Mapping) or not isinstance(row_extra.get(field), str):
        raise ValueError(f"{source}: row {row} has no string extra_info.{field} (needed for the length deciles)")
    return row_extra[field]


def filter_gold_trace_deciles(
    frame: pd.DataFrame, *, deciles: Sequence[int], length_fn: Callable[[str], int], field: str = "solution",
    source: Path = Path("<frame>"),
) -> pd.DataFrame:
    """Rows of ``frame`` whose ``extra_info[field]`` length decile is in ``deciles`` = [lo, hi], in order."""
    if len(deciles) != 2:
        raise ValueError(f"deciles must be [lo, hi]; got {list(deciles)!r}")
    if "extra_info" not in frame.columns:
        raise ValueError(f"{source}: no extra_info column (verl parquet schema, docs/ARCHITECTURE.md)")
    lengths = [length_fn(_gold_trace(extra, field, row=i, source=source)) for i, extra in enumerate(frame["extra_info"])]
    keep = decile_keep_mask(lengths, lo=deciles[0], hi=deciles[1])
    return frame[keep].reset_index(drop=True)


def materialize_sampler_order(frame: pd.DataFrame, *, seed: int, num_rows: int) -> pd.DataFrame:
    """The rows verl's shuffled sampler visits first, as a sequential dataset."""
    return frame.iloc[sampler_order(len(frame), seed=seed, num_rows=num_rows)].reset_index(drop=True)


def prepare(spec: Mapping, *, source: str | Path, output: str | Path, tokenizer=None) -> Path:
    """Run the data step ``spec`` (a ``sweep.data_prep`` block) on ``source``; write ``output``."""
    source, output = Path(source), Path(output)
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ValueError(f"sweep.data_prep.kind must be one of {list(KINDS)}; got {kind!r}")
    if not source.is_file():
        raise ValueError(f"sweep.data_prep: training file {source} does not exist")
    record = {"spec": dict(spec), "source": str(source), "source_sha256": _sha256(source)}
    sidecar = output.with_name(output.name + ".prep.json")
    if output.exists():
        if sidecar.exists() and json.loads(sidecar.read_text()) == record:
            return output
        raise ValueError(f"{output} exists and was not made by this data step ({sidecar}); remove it or use another run dir")
    frame = pd.read_parquet(source)
    if kind == "gold_trace_deciles":
        if tokenizer is None:
            raise ValueError("sweep.data_prep gold_trace_deciles needs the model's tokenizer")
        field = spec.get("field", "solution")
        prepared = filter_gold_trace_deciles(
            frame, deciles=list(spec["deciles"]), field=field, source=source,
            length_fn=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]),
        )
    else:
        prepared = materialize_sampler_order(frame, seed=int(spec["seed"]), num_rows=int(spec["num_rows"]))
    output.parent.mkdir(parents=True, exist_ok=True)
    prepared.to_parquet(output)
    sidecar.write_text(json.dumps(record, indent=2) + "\n")
    return output
