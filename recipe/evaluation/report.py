"""Result tables of the evaluation (pure stdlib): per-dataset Markdown table and Base-vs-checkpoint comparison.

Table conventions follow the paper: accuracies in percent with one decimal, lengths in
tokens; in comparisons "Δ is the absolute OPSD--Base change in percentage points" for
Avg@n / Pass@n (and the boxed rate) and "For Length, it is the relative change". The Avg@n
change also gets a 95% paired bootstrap interval (``recipe.evaluation.stats``: problems
resampled with replacement, the same draw for both runs, within each benchmark for the macro
row; percentile method, 10,000 replicates, seed 0), from each results.json's ``per_problem``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from recipe.evaluation import stats

MACRO = "Macro avg"
# Run-config fields a comparison expects to be equal (the paper: "All evaluation settings remain fixed").
_FIXED_FIELDS = ("decoding", "n", "seed", "backend", "grading")


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def _tokens(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.0f}"


def results_table(results: Mapping) -> str:
    """Markdown table of one results JSON: one row per dataset plus the macro average."""
    n = results["n"]
    header = (
        f"| Dataset | Problems | Avg@{n} | Pass@1 | Pass@{n} | Length | Boxed | Truncated | "
        f"Rep-{results['rep_ngram_order']} | Repetitive | Line run (mean / max) |"
    )
    lines = [header, "|" + "|".join(["---"] * 11) + "|"]
    rows = dict(results["per_dataset"])
    rows[MACRO] = results["macro"]
    for name, m in rows.items():
        lines.append(
            f"| {name} | {m['n_problems']} | {_pct(m[f'avg@{n}'])} | {_pct(m['pass@1'])} | {_pct(m[f'pass@{n}'])} | "
            f"{_tokens(m['mean_length'])} | {_pct(m['boxed_rate'])} | {_pct(m['truncated_rate'])} | "
            f"{_pct(m['rep_ngram'])} | {_pct(m['repetitive_rate'])} | "
            f"{m['mean_line_run']:.1f} / {m['max_line_run']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _flatten(config: Mapping, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(base: Mapping, ckpt: Mapping) -> list[str]:
    """Evaluation settings that differ between two results JSONs (should be none)."""
    diffs = []
    for field in _FIXED_FIELDS:
        a = _flatten({field: base["config"].get(field)})
        b = _flatten({field: ckpt["config"].get(field)})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append(f"{key}: base={a.get(key)!r} checkpoint={b.get(key)!r}")
    return diffs


def _delta_points(base: float, ckpt: float) -> str:
    return f"{100 * (ckpt - base):+.1f}"


def _delta_relative(base: float, ckpt: float) -> str:
    if base == 0 or math.isnan(base) or math.isnan(ckpt):
        return "-"
    return f"{100 * (ckpt - base) / base:+.1f}%"


def avg_interval(base: Mapping, ckpt: Mapping, datasets: Sequence[str]) -> tuple[stats.Interval | None, bool]:
    """(paired bootstrap interval of the Avg@n change over ``datasets``, whether the problem sets differed).

    None when a results JSON has no ``per_problem`` scores or no problem is shared. Problems
    are paired by id within each dataset; only problems both runs scored are used.
    """
    if "per_problem" not in base or "per_problem" not in ckpt:
        return None, False
    base_P, ckpt_P, strata_P, differed = [], [], [], False
    for name in datasets:
        b, c = base["per_problem"].get(name, {}), ckpt["per_problem"].get(name, {})
        shared = [pid for pid in b if pid in c]
        differed |= len(shared) != len(b) or len(shared) != len(c)
        base_P += [b[pid] for pid in shared]
        ckpt_P += [c[pid] for pid in shared]
        strata_P += [name] * len(shared)
    if not base_P:
        return None, differed
    return stats.paired_bootstrap(base_SP=base_P, ckpt_SP=ckpt_P, strata_P=strata_P), differed


def compare_table(base: Mapping, ckpt: Mapping) -> str:
    """Markdown Base vs checkpoint table with deltas (points for accuracies, relative % for length).

    Datasets are the ones both results share; the macro row is each run's own macro average
    when both cover the same datasets, else recomputed over the shared ones.
    """
    n = base["n"]
    if ckpt["n"] != n:
        raise ValueError(f"n differs: base n={n}, checkpoint n={ckpt['n']}; Avg@n/Pass@n are not comparable")
    shared = [name for name in base["per_dataset"] if name in ckpt["per_dataset"]]
    if not shared:
        raise ValueError(
            f"no dataset in common: base has {sorted(base['per_dataset'])}, checkpoint {sorted(ckpt['per_dataset'])}"
        )
    columns = [(f"avg@{n}", f"Avg@{n}", "points"), (f"pass@{n}", f"Pass@{n}", "points"),
               ("mean_length", "Length", "relative"), ("boxed_rate", "Boxed", "points")]
    header = "| Dataset | " + " | ".join(f"{title} Base | {title} Ckpt | Δ" for _, title, _ in columns) + " |"
    header = header.replace(f"Avg@{n} Ckpt | Δ |", f"Avg@{n} Ckpt | Δ | Δ 95% CI |", 1)
    lines = [header, "|" + "|".join(["---"] * (2 + 3 * len(columns))) + "|"]

    def macro(results: Mapping) -> Mapping:
        if sorted(results["per_dataset"]) == sorted(shared):
            return results["macro"]
        return {key: sum(results["per_dataset"][d][key] for d in shared) / len(shared) for key, *_ in columns}

    rows = [(name, base["per_dataset"][name], ckpt["per_dataset"][name], [name]) for name in shared]
    rows.append((MACRO, macro(base), macro(ckpt), shared))
    notes = set()
    for name, b, c, datasets in rows:
        interval, differed = avg_interval(base, ckpt, datasets)
        cells = []
        for key, _, kind in columns:
            if kind == "points":
                cells += [_pct(b[key]), _pct(c[key]), _delta_points(b[key], c[key])]
            else:
                cells += [_tokens(b[key]), _tokens(c[key]), _delta_relative(b[key], c[key])]
            if key == f"avg@{n}":
                cells.append("-" if interval is None else interval.points())
        if differed:
            notes.add("the runs scored different problems; the intervals use the problems both scored")
        if interval is None:
            notes.add("no interval where a results.json has no per-problem scores (written before `per_problem`)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(f"\nΔ 95% CI: paired percentile bootstrap of the Avg@{n} change over problems "
                 f"({stats.DEFAULT_RESAMPLES:,} resamples, seed {stats.DEFAULT_RNG_SEED}; the macro row resamples "
                 "within each benchmark); recipe.evaluation.stats.")
    lines += [f"Note: {note}." for note in sorted(notes)]
    text = "\n".join(lines) + "\n"
    diffs = config_differences(base, ckpt)
    if diffs:
        text = "WARNING: evaluation settings differ between the runs:\n  " + "\n  ".join(diffs) + "\n\n" + text
    return text
