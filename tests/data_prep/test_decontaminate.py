"""Decontamination: normalised exact match, n-gram overlap (hand-counted), second pass."""

import json

import pytest

from data_prep.common import DEFAULT_DAPO_PATH, DEFAULT_EVAL_DIR
from data_prep.decontaminate import (
    EvalIndex,
    EvalItem,
    assert_no_overlap,
    decontaminate,
    exact_key,
    find_overlaps,
    load_eval_items,
    normalise_text,
)


@pytest.fixture
def texts(eval_texts):
    return eval_texts


@pytest.fixture
def index(texts):
    EVAL_A, EVAL_B = texts
    return EvalIndex([EvalItem("a-01", EVAL_A), EvalItem("b-01", EVAL_B)], n=13, threshold=0.5)


def test_normalisation():
    assert normalise_text("  Find $\\dfrac{1}{2}\\,x$\n\nNOW ") == "find \\frac{1}{2} x now"
    assert exact_key("x^{2} + \\left( y \\right)") == exact_key("X^2+(y)")
    assert exact_key("x + 1") != exact_key("x + 2")


def test_planted_eval_problem_with_changed_whitespace_case_and_latex_spacing(index, texts):
    EVAL_A, EVAL_B = texts
    planted = "  " + EVAL_A.upper().replace(" ", "  \n ").replace("; ", ";\\, ") + " "
    match = index.match(planted, row_id="r1", field="problem")
    assert match is not None and (match.eval_id, match.reason, match.overlap) == ("a-01", "exact", 1.0)


def test_ngram_near_copy_hand_counted(index, texts):
    EVAL_A, EVAL_B = texts
    words_a = EVAL_A.split()
    # the last word changed: 7 of the 8 13-grams of the 20-word item survive
    near = " ".join(words_a[:-1] + ["total."]) + " Give your answer modulo 1000."
    assert index.overlaps(near) == {"a-01": 7 / 8}
    match = index.match(near, row_id="r2", field="problem")
    assert (match.eval_id, match.reason, match.overlap) == ("a-01", "ngram", 7 / 8)
    # the 10th word changed: every 13-gram of a 20-word text contains word 10 -> no overlap
    middle = " ".join(words_a[:9] + ["fifty"] + words_a[10:])
    assert index.overlaps(middle) == {}
    assert index.match(middle, row_id="r3", field="problem") is None


def test_threshold_is_inclusive_and_below_is_kept(texts):
    EVAL_A, EVAL_B = texts
    words_b = EVAL_B.split()
    # first 16 words of B: 4 of its 8 13-grams = 0.5
    half = " ".join(words_b[:16])
    assert EvalIndex([EvalItem("b", EVAL_B)], threshold=0.5).match(half, row_id="x", field="p").overlap == 0.5
    assert EvalIndex([EvalItem("b", EVAL_B)], threshold=0.6).match(half, row_id="x", field="p") is None


def test_decontaminate_reports_and_second_pass(index, texts):
    EVAL_A, EVAL_B = texts
    records = [
        {"id": "keep", "problem": "What is 2+2?"},
        {"id": "exact", "problem": EVAL_B.lower()},
        {"id": "near", "problem": "Note: " + EVAL_A},
    ]
    kept, removed = decontaminate(records, index)
    assert [r["id"] for r in kept] == ["keep"]
    assert [(m.row_id, m.eval_id, m.reason) for m in removed] == [("exact", "b-01", "exact"), ("near", "a-01", "ngram")]
    rows = [{"extra_info": {"id": "keep", "problem": "What is 2+2?", "unrelated_problem": EVAL_B}}]
    assert [(m.field, m.eval_id) for m in find_overlaps(rows, index)] == [("unrelated_problem", "b-01")]
    with pytest.raises(RuntimeError, match="1 overlaps"):
        assert_no_overlap(rows, index, what="t")
    rows[0]["extra_info"]["unrelated_problem"] = "Unrelated."
    assert assert_no_overlap(rows, index, what="t") == 1


def test_short_eval_item_must_appear_whole():
    idx = EvalIndex([EvalItem("s", "Compute 9! mod 7.")], n=13)
    assert idx.overlaps("First, compute 9! mod 7. Then stop.") == {"s": 1.0}
    assert idx.overlaps("Compute 9! mod 8.") == {}


def test_real_eval_items_and_known_dapo_contamination():
    items = load_eval_items(DEFAULT_EVAL_DIR)
    assert len(items) == 120 and len({i.id for i in items}) == 120
    index = EvalIndex(items)
    dapo = {}
    with open(DEFAULT_DAPO_PATH) as fh:
        for line in fh:
            row = json.loads(line)
            dapo[row["id"]] = row["problem"]
    # dapo-00728 is AIME 2026 I-01 verbatim; dapo-09311 only shares boilerplate with I-14 (overlap 0.31)
    assert index.match(dapo["dapo-00728"], row_id="d", field="problem").eval_id == "aime2026-I-01"
    assert index.match(dapo["dapo-09311"], row_id="d", field="problem") is None
    assert 0.3 < index.overlaps(dapo["dapo-09311"])["aime2026-I-14"] < 0.5


def test_bad_index_options():
    with pytest.raises(ValueError, match="threshold"):
        EvalIndex([], threshold=0.0)
    with pytest.raises(ValueError, match="n-gram size"):
        EvalIndex([], n=0)
