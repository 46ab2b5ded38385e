"""Decontamination of training text against the 120 evaluation items (AIME 2024-2026, HMMT Feb 2025).

Paper (appendix "Supervised-Initialization Data"): "we decontaminate both corpora against all 120 evaluation items
... Matched records are removed, and a second check finds zero overlaps in every final preprocessed training set."
Two tests per (training text, eval item), on text normalised by ``normalise_text``: ``exact`` (equal once all
whitespace and braces are also removed) and ``ngram`` (the training text holds at least ``threshold``, default 0.5,
of the eval item's distinct word n-grams, default n = 13; an item shorter than n words must appear as a whole).
The overlaps measured on the repo's DAPO copy behind the default: docs/prompts.md.

CLI (the second pass on any built parquet): ``python -m data_prep.decontaminate --check out.parquet``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from data_prep.common import DEFAULT_EVAL_DIR, read_parquet_rows
from recipe.common import cli

_SPACING = re.compile(
    r"\\(?:quad|qquad|thinspace|medspace|thickspace|enspace|negthinspace|displaystyle|textstyle|left|right|limits)(?![a-z])"
    r"|\\[,;:! ]|~|\$"
)
_WORD = re.compile(r"\w+")


def normalise_text(text: str) -> str:
    """NFKC, lower-cased text with ``\\dfrac`` / ``\\tfrac`` -> ``\\frac``, LaTeX spacing commands, ``\\left``,
    ``\\right`` and ``$`` removed, and whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _SPACING.sub(" ", text)
    return " ".join(text.split())


def exact_key(text: str) -> str:
    return re.sub(r"[\s{}]", "", normalise_text(text))


def words(text: str) -> list[str]:
    return _WORD.findall(normalise_text(text))


@dataclass(frozen=True)
class EvalItem:
    id: str
    problem: str


@dataclass(frozen=True)
class Match:
    row_id: str
    field: str
    eval_id: str
    reason: str  # "exact" | "ngram"
    overlap: float  # fraction of the eval item's n-grams found (1.0 for exact)

    def as_dict(self) -> dict:
        return {"id": self.row_id, "field": self.field, "eval_id": self.eval_id, "reason": self.reason, "overlap": round(self.overlap, 4)}


def load_eval_items(eval_dir: str | Path = DEFAULT_EVAL_DIR) -> list[EvalItem]:
    """Every ``{id, problem}`` of the ``*.jsonl`` files in ``eval_dir``."""
    eval_dir = Path(eval_dir)
    files = sorted(eval_dir.glob("*.jsonl"))
    if not files:
        raise cli.MissingInputError("no evaluation *.jsonl files", file=eval_dir,
                                    hint="pass --eval-dir with the evaluation sets (default: data/eval)")
    items = []
    for path in files:
        for line_no, row in cli.iter_jsonl(path, what="evaluation file"):
            if not row.get("id") or not row.get("problem"):
                raise cli.InputError("evaluation row needs 'id' and 'problem'", file=path, line=line_no)
            items.append(EvalItem(id=str(row["id"]), problem=str(row["problem"])))
    return items


class EvalIndex:
    """Exact keys and n-gram postings of the evaluation items."""

    def __init__(self, items: Sequence[EvalItem], *, n: int = 13, threshold: float = 0.5):
        if n < 1:
            raise ValueError(f"n-gram size n={n} must be >= 1")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"ngram threshold={threshold} must be in (0, 1]")
        self.items = list(items)
        self.n = n
        self.threshold = threshold
        self._exact: dict[str, list[str]] = defaultdict(list)
        self._postings: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self._sizes: dict[str, int] = {}
        self._short: dict[str, str] = {}  # items with fewer than n words: " w1 w2 ... "
        for item in self.items:
            self._exact[exact_key(item.problem)].append(item.id)
            item_words = words(item.problem)
            if len(item_words) < n:
                self._short[item.id] = " " + " ".join(item_words) + " "
                continue
            grams = {tuple(item_words[i : i + n]) for i in range(len(item_words) - n + 1)}
            self._sizes[item.id] = len(grams)
            for gram in grams:
                self._postings[gram].add(item.id)

    def overlaps(self, text: str) -> dict[str, float]:
        """Eval id -> fraction of that item's n-grams present in ``text`` (ids with any hit)."""
        text_words = words(text)
        hits: dict[str, int] = defaultdict(int)
        seen = set()
        for i in range(len(text_words) - self.n + 1):
            gram = tuple(text_words[i : i + self.n])
            if gram in seen:
                continue
            seen.add(gram)
            for eval_id in self._postings.get(gram, ()):
                hits[eval_id] += 1
        result = {eval_id: count / self._sizes[eval_id] for eval_id, count in hits.items()}
        if self._short:
            joined = " " + " ".join(text_words) + " "
            for eval_id, phrase in self._short.items():
                if phrase.strip() and phrase in joined:
                    result[eval_id] = 1.0
        return result

    def match(self, text: str, *, row_id: str, field: str) -> Match | None:
        """The strongest match of ``text`` against the eval items, or None."""
        exact = self._exact.get(exact_key(text))
        if exact:
            return Match(row_id, field, exact[0], "exact", 1.0)
        overlaps = self.overlaps(text)
        if not overlaps:
            return None
        eval_id, overlap = max(overlaps.items(), key=lambda kv: (kv[1], kv[0]))
        if overlap >= self.threshold:
            return Match(row_id, field, eval_id, "ngram", overlap)
        return None


def decontaminate(
    records: Iterable[Mapping], index: EvalIndex, *, fields: Sequence[str] = ("problem",)
) -> tuple[list[Mapping], list[Match]]:
    """(kept records, one Match per removed record) checking ``fields`` of each record."""
    kept, removed = [], []
    for record in records:
        found = None
        for name in fields:
            text = record.get(name) or ""
            if text:
                found = index.match(text, row_id=str(record["id"]), field=name)
                if found:
                    break
        if found:
            removed.append(found)
        else:
            kept.append(record)
    return kept, removed


ROW_FIELDS = ("problem", "unrelated_problem")


def find_overlaps(rows: Iterable[Mapping], index: EvalIndex) -> list[Match]:
    """Second pass over built verl rows: matches in ``extra_info`` problem / unrelated_problem."""
    matches = []
    for row in rows:
        extra = row["extra_info"]
        for name in ROW_FIELDS:
            text = extra.get(name) or ""
            if text:
                found = index.match(text, row_id=str(extra.get("id")), field=name)
                if found:
                    matches.append(found)
    return matches


def assert_no_overlap(rows: Sequence[Mapping], index: EvalIndex, *, what: str) -> int:
    """Raise if the second pass finds any overlap; return the number of rows checked."""
    matches = find_overlaps(rows, index)
    if matches:
        shown = [m.as_dict() for m in matches[:5]]
        raise RuntimeError(f"{what}: second decontamination pass found {len(matches)} overlaps, e.g. {shown}")
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_prep.decontaminate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", nargs="+", type=Path, required=True, help="verl parquet file(s) to check")
    parser.add_argument("--eval-dir", type=Path, default=DEFAULT_EVAL_DIR)
    parser.add_argument("--ngram", type=int, default=13)
    parser.add_argument("--ngram-threshold", type=float, default=0.5)
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    index = EvalIndex(load_eval_items(args.eval_dir), n=args.ngram, threshold=args.ngram_threshold)
    total = 0
    for path in args.check:
        matches = find_overlaps(read_parquet_rows(path), index)
        total += len(matches)
        print(json.dumps({"file": str(path), "overlaps": len(matches), "matches": [m.as_dict() for m in matches]}, indent=2))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
