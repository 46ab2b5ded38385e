"""The stages every training-corpus builder shares after its own loading and field mapping:
decontamination, unrelated pairing, verl rows with the student prompt, the second
decontamination pass, and writing parquet + summary + decontamination report."""

from __future__ import annotations

from pathlib import Path

from data_prep.common import (
    DEFAULT_DAPO_PATH,
    Counts,
    check_writable,
    load_records,
    make_row,
    normalise_fields,
    print_summary,
    sidecar_path,
    write_json,
    write_parquet,
)
from data_prep.decontaminate import EvalIndex, assert_no_overlap, decontaminate, load_eval_items
from data_prep.unrelated import assign_unrelated, build_pool
from recipe.common import cli
from recipe.common.prompts import student_messages

UNRELATED_CHOICES = ("dapo", "self", "none")


def output_paths(out: Path) -> list[Path]:
    out = Path(out)
    return [out, sidecar_path(out, "summary"), sidecar_path(out, "decontamination")]


def make_index(eval_dir, *, n: int, threshold: float) -> EvalIndex:
    return EvalIndex(load_eval_items(eval_dir), n=n, threshold=threshold)


def _pool_records(spec: str, *, records: list[dict], dapo_path: Path) -> tuple[list[dict], str, str]:
    """(pool source records, solution field, description) for an ``--unrelated-pool`` value."""
    if spec == "self":
        return records, "solution", "self: other rows of this corpus (worked solutions)"
    if spec == "dapo":
        raw = load_records(str(dapo_path))
        pool_counts = Counts()
        pool = normalise_fields(
            raw.rows, columns={"problem": "problem", "answer": "answer"}, required=("problem", "answer"),
            id_prefix="dapo", id_column="id", counts=pool_counts, source=raw.name,
        )
        return pool, "answer", f"dapo: {dapo_path} (DAPO-Math-17k has no worked solutions; unrelated_solution = its final answer)"
    raw = load_records(spec)
    pool_counts = Counts()
    pool = normalise_fields(
        raw.rows, columns={"problem": "problem", "solution": "solution"}, required=("problem", "solution"),
        id_prefix="pool", id_column="id" if "id" in raw.columns else None, counts=pool_counts, source=raw.name,
    )
    return pool, "solution", f"file: {spec}"


def finish_build(
    records: list[dict],
    *,
    counts: Counts,
    data_source: str,
    split: str,
    index: EvalIndex,
    out: Path,
    overwrite: bool,
    unrelated: str = "none",
    seed: int = 42,
    dapo_path: Path = DEFAULT_DAPO_PATH,
) -> dict:
    """Decontaminate ``records`` (problem), pair, build rows, re-check, write; return the summary."""
    out = Path(out)
    check_writable(output_paths(out), overwrite=overwrite)
    counts.stages["before_decontamination"] = len(records)
    kept, removed = decontaminate(records, index)
    for match in removed:
        counts.drop(f"decontamination_{match.reason}", match.row_id)
    counts.stages["after_decontamination"] = len(kept)
    if unrelated != "none":
        pool_source, solution_field, description = _pool_records(unrelated, records=kept, dapo_path=dapo_path)
        pool, pool_counts = build_pool(pool_source, index=index, solution_field=solution_field)
        if not pool:
            raise cli.InputError(f"--unrelated-pool {unrelated}: no usable unrelated pairs ({pool_counts})",
                                 file={"dapo": dapo_path, "self": None}.get(unrelated, unrelated),
                                 hint="pass a file of problem/solution rows, or --unrelated-pool none")
        assign_unrelated(kept, pool, seed=seed)
        counts.notes["unrelated_pool"] = {"source": description, "seed": seed, **pool_counts}
    rows = [make_row(r, data_source=data_source, split=split, prompt=student_messages(r["problem"])) for r in kept]
    counts.stages["written"] = len(rows)
    counts.notes["second_pass_rows_checked"] = assert_no_overlap(rows, index, what=str(out))
    counts.notes["second_pass_overlaps"] = 0
    counts.notes["decontamination"] = {"eval_items": len(index.items), "ngram": index.n, "threshold": index.threshold}
    write_parquet(rows, out, overwrite=overwrite, counts=counts)
    summary = {"output": str(out), "data_source": data_source, **counts.as_dict()}
    write_json(summary, sidecar_path(out, "summary"), overwrite=overwrite)
    write_json([m.as_dict() for m in removed], sidecar_path(out, "decontamination"), overwrite=overwrite)
    print_summary(summary)
    return summary
