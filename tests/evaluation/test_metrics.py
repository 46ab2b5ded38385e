"""pass@k estimator, degeneration diagnostics and dataset / macro aggregation against hand-computed values."""

import math

import pytest

from recipe.evaluation.metrics import (
    dataset_metrics,
    generation_diagnostics,
    longest_repeated_line_run,
    macro_average,
    pass_at_k,
    repeated_ngram_fraction,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (8, 2, 1, 0.25),
        (8, 2, 8, 1.0),
        (8, 0, 1, 0.0),
        (8, 0, 8, 0.0),
        (4, 1, 2, 0.5),
        (8, 8, 1, 1.0),
        (8, 1, 8, 1.0),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (8, 3, 4, 1 - 5 / 70),  # 1 - C(5,4)/C(8,4)
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n=n, c=c, k=k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_matches_brute_force_over_subsets():
    from itertools import combinations

    n, c = 6, 2
    samples = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(combinations(samples, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n=n, c=c, k=k) == pytest.approx(brute, abs=1e-15)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n=n, c=c, k=k)


def test_repeated_ngram_fraction():
    assert repeated_ngram_fraction("a b c d", n=2) == 0.0
    # "a b a b a b": bigrams ab ba ab ba ab -> 2 distinct of 5
    assert repeated_ngram_fraction("a b a b a b", n=2) == pytest.approx(1 - 2 / 5)
    assert repeated_ngram_fraction("too short", n=10) == 0.0
    loop = "Wait, let me recompute the area of the triangle again. " * 50
    assert repeated_ngram_fraction(loop) > 0.9


def test_longest_repeated_line_run():
    assert longest_repeated_line_run("") == 0
    assert longest_repeated_line_run("a\nb\nc") == 1
    assert longest_repeated_line_run("a\nx\nx\n\n x \ny\nx") == 3  # blank lines skipped, lines stripped
    assert longest_repeated_line_run("so\n" + "Hmm.\n" * 7 + "done") == 7


def test_generation_diagnostics():
    assert generation_diagnostics("fine \\boxed{1}", finish_reason="stop") == {
        "truncated": 0.0, "rep_ngram": 0.0, "repetitive": 0.0, "line_run": 1.0
    }
    loop = "Let me check.\n" * 40
    diag = generation_diagnostics(loop, finish_reason="length")
    assert diag["truncated"] == 1.0 and diag["repetitive"] == 1.0 and diag["line_run"] == 40.0


def _record(pid, sample, acc, *, boxed=True, tokens=100, finish="stop", text="ok \\boxed{1}"):
    return {"problem_id": pid, "sample": sample, "acc": acc, "has_boxed": boxed, "num_tokens": tokens,
            "finish_reason": finish, "text": text}


def test_dataset_metrics_hand_computed():
    loop = "Let me check.\n" * 40
    records = [
        # p1: 2 of 4 correct
        _record("p1", 0, True, tokens=100), _record("p1", 1, True, tokens=200),
        _record("p1", 2, False, tokens=300), _record("p1", 3, False, boxed=False, tokens=400, finish="length",
                                                      text=loop),
        # p2: 0 of 4 correct, two truncated repetitive outputs without a box
        _record("p2", 0, False, tokens=1000), _record("p2", 1, False, tokens=1000),
        _record("p2", 2, False, boxed=False, tokens=2000, finish="length", text=loop),
        _record("p2", 3, False, boxed=False, tokens=2000, finish="length", text=loop),
    ]
    m = dataset_metrics(records)
    assert m["n"] == 4 and m["n_problems"] == 2
    assert m["avg@4"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["pass@1"] == pytest.approx(0.25)
    # p1: 1 - C(2,4)/C(4,4) = 1; p2: 0
    assert m["pass@4"] == pytest.approx(0.5)
    assert m["mean_length"] == pytest.approx((250 + 1500) / 2)
    assert m["boxed_rate"] == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert m["truncated_rate"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert m["repetitive_rate"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert m["max_line_run"] == 40
    assert m["mean_line_run"] == pytest.approx(((1 + 1 + 1 + 40) / 4 + (1 + 1 + 40 + 40) / 4) / 2)


def test_dataset_metrics_custom_ks_and_unequal_counts():
    records = [_record("p", s, s == 0) for s in range(4)]
    m = dataset_metrics(records, ks=[2])
    assert m["pass@2"] == pytest.approx(0.5) and "pass@1" not in m
    with pytest.raises(ValueError, match="different sample counts"):
        dataset_metrics(records + [_record("q", 0, True)])
    with pytest.raises(ValueError, match="no generation records"):
        dataset_metrics([])


def test_macro_average_is_unweighted():
    a = {"n_problems": 30, "n": 8, "avg@8": 0.5, "max_line_run": 3.0}
    b = {"n_problems": 10, "n": 8, "avg@8": 0.1, "max_line_run": 9.0}
    macro = macro_average({"a": a, "b": b})
    assert macro["avg@8"] == pytest.approx(0.3)
    assert macro["max_line_run"] == 9.0
    assert macro["n_problems"] == 40
    assert not math.isnan(macro["n"])
