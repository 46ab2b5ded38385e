"""Evaluation metrics (pure stdlib): pass@k, Avg@n, and output-degeneration diagnostics.

``dataset_metrics`` gives one benchmark's Avg@n, Pass@k, mean length, boxed rate and the degeneration
rates (truncated, repeated n-grams, repeated lines: the paper's "repetition, ... missing of <eos> token,
... or loss of boxed-answer formatting" made countable); ``macro_average`` the unweighted mean over
benchmarks; ``problem_scores`` the per-problem Avg@n of the paired bootstrap. Called by
``recipe.evaluation.harness``; definitions: docs/evaluation.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

# Word n-gram order of the repeated-n-gram diagnostic.
REPEAT_NGRAM = 10
# rep-n at or above which a generation counts as repetitive.
REPETITIVE_THRESHOLD = 0.5


def pass_at_k(*, n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021), exact.

    Args:
        n: samples drawn for the problem (>= 1).
        c: correct samples among them (0 <= c <= n).
        k: budget (1 <= k <= n).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def repeated_ngram_fraction(text: str, *, n: int = REPEAT_NGRAM) -> float:
    """rep-n (Welleck et al., 2019) on whitespace words: ``1 - distinct / total`` n-grams (0.0 if fewer
    than n words; close to 1 for a loop)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    words = text.split()
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    distinct = len({tuple(words[i : i + n]) for i in range(total)})
    return 1.0 - distinct / total


def longest_repeated_line_run(text: str) -> int:
    """Longest run of consecutive identical non-empty lines (stripped); 0 for empty text."""
    best, run, previous = 0, 0, None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        run = run + 1 if line == previous else 1
        previous = line
        best = max(best, run)
    return best


def generation_diagnostics(text: str, *, finish_reason: str, ngram: int = REPEAT_NGRAM) -> dict[str, float]:
    """Per-generation degeneration diagnostics: truncated, rep_ngram, repetitive, line_run."""
    rep = repeated_ngram_fraction(text, n=ngram)
    return {
        "truncated": float(finish_reason == "length"),
        "rep_ngram": rep,
        "repetitive": float(rep >= REPETITIVE_THRESHOLD),
        "line_run": float(longest_repeated_line_run(text)),
    }


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def dataset_metrics(records: Sequence[Mapping], *, ks: Sequence[int] | None = None) -> dict[str, float]:
    """Metrics of one dataset from its generation records.

    Each record needs ``problem_id``, ``acc`` (bool), ``has_boxed`` (bool), ``num_tokens``
    (int), ``finish_reason`` (str) and ``text`` (str). Every problem must have the same
    number of samples n. Returns (fractions in [0, 1], lengths in tokens):
    ``n_problems, n, avg@n, pass@k`` for k in ``ks`` (default {1, n}), ``mean_length,
    boxed_rate, truncated_rate, rep_ngram, repetitive_rate, mean_line_run, max_line_run``.
    """
    if not records:
        raise ValueError("dataset_metrics: no generation records")
    by_problem: dict[str, list[Mapping]] = {}
    for record in records:
        by_problem.setdefault(str(record["problem_id"]), []).append(record)
    counts = {len(samples) for samples in by_problem.values()}
    if len(counts) != 1:
        sizes = {pid: len(samples) for pid, samples in by_problem.items()}
        raise ValueError(f"dataset_metrics: problems have different sample counts {sizes}; finish the run first")
    n = counts.pop()
    ks = sorted({1, n} if ks is None else set(ks))
    per_problem = []
    for samples in by_problem.values():
        correct = sum(bool(sample["acc"]) for sample in samples)
        diags = [generation_diagnostics(sample["text"], finish_reason=sample["finish_reason"]) for sample in samples]
        row = {
            f"avg@{n}": correct / n,
            "mean_length": _mean(sample["num_tokens"] for sample in samples),
            "boxed_rate": _mean(float(bool(sample["has_boxed"])) for sample in samples),
            "truncated_rate": _mean(diag["truncated"] for diag in diags),
            "rep_ngram": _mean(diag["rep_ngram"] for diag in diags),
            "repetitive_rate": _mean(diag["repetitive"] for diag in diags),
            "mean_line_run": _mean(diag["line_run"] for diag in diags),
            "max_line_run": max(diag["line_run"] for diag in diags),
        }
        for k in ks:
            row[f"pass@{k}"] = pass_at_k(n=n, c=correct, k=k)
        per_problem.append(row)
    metrics: dict[str, float] = {"n_problems": len(by_problem), "n": n}
    for key in per_problem[0]:
        values = [row[key] for row in per_problem]
        metrics[key] = max(values) if key == "max_line_run" else _mean(values)
    return metrics


def problem_scores(records: Sequence[Mapping]) -> dict[str, float]:
    """Avg@n of each problem, ``{problem_id: correct samples / samples}`` (the unit of the paired bootstrap)."""
    counts: dict[str, list[int]] = {}
    for record in records:
        tally = counts.setdefault(str(record["problem_id"]), [0, 0])
        tally[0] += bool(record["acc"])
        tally[1] += 1
    return {pid: correct / total for pid, (correct, total) in counts.items()}


def macro_average(per_dataset: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Unweighted mean over datasets of every metric they share (max for ``max_line_run``)."""
    if not per_dataset:
        raise ValueError("macro_average: no datasets")
    tables = list(per_dataset.values())
    keys = [key for key in tables[0] if all(key in table for table in tables[1:])]
    macro = {}
    for key in keys:
        values = [table[key] for table in tables]
        macro[key] = max(values) if key == "max_line_run" else _mean(values)
    macro["n_problems"] = sum(table["n_problems"] for table in tables)
    return macro
