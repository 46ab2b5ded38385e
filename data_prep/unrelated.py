"""Unrelated problem-solution pairs for the ``unrelated`` teacher context.

Paper: "Unrelated provides a deduplicated problem--solution pair from DAPO-Math-17k"; "an independently sampled
problem--solution pair precedes the target problem and never claims to solve it". DAPO-Math-17k has no worked
solutions, so the pool is a choice (``--unrelated-pool``: ``dapo``, ``self``, ``none`` or a file; docs/prompts.md).
``build_pool`` deduplicates on normalised text and decontaminates. ``assign_unrelated`` is deterministic given the
seed: one seeded permutation of the pool, record ``i`` takes entry ``perm[i mod len(pool)]``, skipping forward past
any entry whose normalised problem equals the record's own (the pair is never the target problem).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from data_prep.decontaminate import EvalIndex, decontaminate, exact_key


@dataclass(frozen=True)
class Pair:
    id: str
    problem: str
    solution: str


def build_pool(
    records: Iterable[Mapping], *, index: EvalIndex | None, solution_field: str = "solution"
) -> tuple[list[Pair], dict[str, int]]:
    """Deduplicated (first occurrence of each normalised problem), decontaminated pairs.

    Returns the pool and counts: ``input``, ``duplicate``, ``no_solution``, ``contaminated``, ``pool``.
    """
    counts = {"input": 0, "duplicate": 0, "no_solution": 0, "contaminated": 0}
    seen: set[str] = set()
    unique = []
    for record in records:
        counts["input"] += 1
        problem = (record.get("problem") or "").strip()
        solution = str(record.get(solution_field) or "").strip()
        if not problem or not solution:
            counts["no_solution"] += 1
            continue
        key = exact_key(problem)
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        unique.append({"id": str(record.get("id", len(unique))), "problem": problem, "solution": solution})
    if index is not None:
        unique, removed = decontaminate(unique, index)
        counts["contaminated"] = len(removed)
    pool = [Pair(r["id"], r["problem"], r["solution"]) for r in unique]
    counts["pool"] = len(pool)
    return pool, counts


def assign_unrelated(records: Sequence[dict], pool: Sequence[Pair], *, seed: int) -> None:
    """Fill ``unrelated_problem`` / ``unrelated_solution`` (and ``unrelated_id``) in place."""
    if not pool:
        raise ValueError("the unrelated pool is empty; nothing to pair with")
    keys = [exact_key(pair.problem) for pair in pool]
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    for i, record in enumerate(records):
        own = exact_key(record["problem"])
        for step in range(len(pool)):
            j = order[(i + step) % len(pool)]
            if keys[j] != own:
                break
        else:
            raise ValueError(f"row {record['id']!r}: every pool entry is its own problem; cannot pair")
        record["unrelated_problem"] = pool[j].problem
        record["unrelated_solution"] = pool[j].solution
        record["unrelated_id"] = pool[j].id
