"""Stylistic and length feature rates of generated texts (pure stdlib): the paper's Table 1(b)
(``tab:mode_discourse``) and ``tab:sft_output_degen``, pooled over all generations given.

``feature_rates`` counts the % of generations with "wait", a self-correction marker or ``<think>``
(``STYLE_PATTERNS``; the matching rules: docs/analysis.md) and at or above each length threshold;
the signal analysis calls it on its rollouts. CLI, one row per ``generations.jsonl`` of
``scripts/evaluate.py run`` (NAME=PATH, or a PATH named by its directory)::

    python -m recipe.analysis.generation_features "no-think base=evals/base/generations.jsonl" \\
        "no_think/think OPSD=evals/no_think-think/generations.jsonl"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

STYLE_PATTERNS = {
    "wait": re.compile(r"\bwait\b", re.IGNORECASE),
    "self_correction": re.compile(r"\b(?:Hm+|Actually|No|But)\b"),
    "think_tag": re.compile(re.escape("<think>")),
}
# ">= 32k" and ">= 38k" tokens in binary k, as the paper's 6k = 6,144-token window; 38,912 is the Qwen3 thinking
# cap, so ">= 38k" counts generations cut at the cap.
LENGTH_THRESHOLDS = (32_768, 38_912)


def style_flags(text: str) -> dict[str, bool]:
    """Whether ``text`` contains each stylistic feature of ``STYLE_PATTERNS``."""
    return {name: pattern.search(text) is not None for name, pattern in STYLE_PATTERNS.items()}


def _pct(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return 100.0 * sum(flags) / len(flags) if flags else float("nan")


def feature_rates(records: Sequence[Mapping], *, thresholds: Sequence[int] = LENGTH_THRESHOLDS) -> dict[str, float]:
    """Pooled rates (%) over generation records (``text``, ``num_tokens``; optional ``has_boxed``, ``acc``).

    Keys: ``n``, ``mean_tokens``, ``ge_<t>`` per threshold t, ``wait``, ``self_correction``,
    ``think_tag``, and ``boxed`` / ``accuracy`` when every record has ``has_boxed`` / ``acc``.
    """
    if not records:
        raise ValueError("feature_rates: no generation records")
    missing = [i for i, r in enumerate(records) if "text" not in r or "num_tokens" not in r]
    if missing:
        raise ValueError(f"feature_rates: records {missing[:5]} lack 'text' or 'num_tokens'")
    flags = [style_flags(r["text"]) for r in records]
    out = {"n": float(len(records)), "mean_tokens": sum(r["num_tokens"] for r in records) / len(records)}
    for t in thresholds:
        out[f"ge_{t}"] = _pct(r["num_tokens"] >= t for r in records)
    for name in STYLE_PATTERNS:
        out[name] = _pct(f[name] for f in flags)
    if all("has_boxed" in r for r in records):
        out["boxed"] = _pct(bool(r["has_boxed"]) for r in records)
    if all("acc" in r for r in records):
        out["accuracy"] = _pct(bool(r["acc"]) for r in records)
    return out


def _k(t: int) -> str:
    return f"{t // 1024}k" if t % 1024 == 0 else str(t)


def rates_table(named: Mapping[str, Mapping[str, float]], *, thresholds: Sequence[int] = LENGTH_THRESHOLDS) -> str:
    """Markdown table of ``feature_rates`` results, one row per name (the paper's two tables side by side)."""
    cols = [("N", "n", 0), ("Tokens", "mean_tokens", 0)]
    cols += [(f">={_k(t)} (%)", f"ge_{t}", 1) for t in thresholds]
    cols += [("Boxed (%)", "boxed", 1), ("Acc (%)", "accuracy", 1), ('"wait" (%)', "wait", 1),
             ("Self-correction (%)", "self_correction", 1), ("<think> (%)", "think_tag", 1)]
    lines = ["| Run | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for name, rates in named.items():
        cells = [f"{rates[key]:.{digits}f}" if key in rates else "-" for _, key, digits in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _read(spec: str) -> tuple[str, list[dict]]:
    """``NAME=PATH`` (or ``PATH``: named by its directory) -> (name, records of its generations.jsonl)."""
    import json
    from pathlib import Path

    name, sep, path = spec.partition("=")
    path = Path(path if sep else spec)
    if path.is_dir():
        path = path / "generations.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no generations.jsonl (write one with scripts/evaluate.py run)")
    records = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not JSON ({err.msg})") from None
    return (name if sep else path.parent.name), records


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Stylistic and length feature rates of evaluation generations "
                                            "(paper Table 1(b), tab:sft_output_degen).")
    p.add_argument("runs", nargs="+", metavar="NAME=PATH")
    p.add_argument("--thresholds", nargs="+", type=int, default=list(LENGTH_THRESHOLDS),
                   help="length thresholds in tokens (default: 32,768 and 38,912)")
    args = p.parse_args(argv)
    named = {}
    for spec in args.runs:
        name, records = _read(spec)
        named[name] = feature_rates(records, thresholds=args.thresholds)
    print(rates_table(named, thresholds=args.thresholds), end="")
    return 0


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main())
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
