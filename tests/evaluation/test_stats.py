"""recipe.evaluation.stats: the paired bootstrap, by hand and against an enumeration of every resample."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from recipe.evaluation.stats import (
    Interval,
    bootstrap_replicates,
    paired_bootstrap,
    paired_difference,
    percentile_interval,
)


# --------------------------------------------------------------------------- by hand
def test_two_problems_by_hand():
    # per-problem differences d = (0, 1); the 4 equally likely resamples give means 0, .5, .5, 1
    ci = paired_bootstrap(base_SP=[1.0, 0.0], ckpt_SP=[1.0, 1.0], n_resamples=100_000)
    assert ci.estimate == 0.5
    assert (ci.low, ci.high) == (0.0, 1.0)  # 2.5% and 97.5% quantiles of {0: 1/4, .5: 1/2, 1: 1/4}
    assert math.isclose(ci.se, math.sqrt(0.25 / 2), abs_tol=0.003)  # population var of d / n
    narrow = paired_bootstrap(base_SP=[1.0, 0.0], ckpt_SP=[1.0, 1.0], n_resamples=100_000, confidence=0.4)
    assert (narrow.low, narrow.high) == (0.5, 0.5)  # 30% and 70% quantiles
    assert ci.points() == "[+0.0, +100.0]" and ci.method == "percentile" and ci.resamples == 100_000


def test_pairing_by_problem():
    # identical scores on every problem: each replicate resamples the same problems on both sides, so it is 0
    scores = [0.0, 0.125, 1.0, 0.5, 0.875]
    ci = paired_bootstrap(base_SP=scores, ckpt_SP=scores)
    assert (ci.estimate, ci.low, ci.high, ci.se) == (0.0, 0.0, 0.0, 0.0)


def test_macro_statistic_by_hand():
    # stratum a: d = (0.5, 0.0) -> 0.25; stratum b: d = (-1.0,) -> -1.0; macro = (0.25 - 1) / 2
    value = paired_difference(base_SP=[0.0, 0.5, 1.0], ckpt_SP=[0.5, 0.5, 0.0], strata_P=["a", "a", "b"])
    assert value == -0.375
    # seeds: checkpoint rows averaged per problem first: (1 + 0) / 2 - 0.25 = 0.25 and (1 + 1) / 2 - 1 = 0
    assert paired_difference(base_SP=[0.25, 1.0], ckpt_SP=[[1.0, 1.0], [0.0, 1.0]]) == 0.125


def test_percentile_interval_is_inverted_cdf():
    values = np.arange(1, 101, dtype=float)  # 1..100
    assert percentile_interval(values, confidence=0.9) == (5.0, 95.0)  # 5th and 95th order statistics
    assert percentile_interval(values, confidence=0.95) == (3.0, 98.0)  # ceil(2.5) = 3rd, ceil(97.5) = 98th


# --------------------------------------------------------------------------- against brute-force enumeration
def _exact_distribution(base_SP, ckpt_SP, strata_P, pair_seeds):
    """{statistic: probability} over every equally likely resample (seed rows and problems with replacement)."""
    base, ckpt = np.atleast_2d(np.asarray(base_SP, float)), np.atleast_2d(np.asarray(ckpt_SP, float))
    groups = {}
    for index, name in enumerate(strata_P):
        groups.setdefault(name, []).append(index)
    problem_draws = list(itertools.product(*[itertools.product(g, repeat=len(g)) for g in groups.values()]))
    ckpt_rows = list(itertools.product(range(len(ckpt)), repeat=len(ckpt)))
    base_rows = [None] if pair_seeds else list(itertools.product(range(len(base)), repeat=len(base)))
    dist, total = {}, 0
    for rows_c in ckpt_rows:
        for rows_b in base_rows:
            rows_b = rows_c if pair_seeds else rows_b
            diff = ckpt[list(rows_c)].mean(0) - base[list(rows_b)].mean(0)
            for draw in problem_draws:
                value = np.mean([diff[list(group)].mean() for group in draw])
                key = round(float(value), 12)
                dist[key] = dist.get(key, 0) + 1
                total += 1
    return {value: Fraction(count, total) for value, count in sorted(dist.items())}


def _exact_quantile(dist, level):
    cumulative = Fraction(0)
    for value, prob in dist.items():
        cumulative += prob
        if cumulative >= level:
            return value
    return max(dist)


CASES = {
    "two strata": dict(base_SP=[0.0, 0.25, 1.0, 0.5, 0.125], ckpt_SP=[0.5, 0.25, 0.375, 1.0, 0.75],
                       strata_P=["a", "a", "b", "b", "b"], pair_seeds=False),
    "checkpoint seeds": dict(base_SP=[0.0, 0.5, 0.25], ckpt_SP=[[1.0, 0.5, 0.0], [0.25, 0.75, 0.875]],
                             strata_P=["a", "a", "a"], pair_seeds=False),
    "paired seeds": dict(base_SP=[[0.0, 0.5, 0.25], [0.5, 0.5, 0.0]], ckpt_SP=[[1.0, 0.5, 0.0], [0.25, 0.75, 0.5]],
                         strata_P=["a", "a", "a"], pair_seeds=True),
    "independent seeds": dict(base_SP=[[0.0, 0.5], [0.5, 1.0]], ckpt_SP=[[1.0, 0.5], [0.25, 0.75]],
                              strata_P=["a", "b"], pair_seeds=False),
}


@pytest.mark.parametrize("name", CASES)
def test_replicates_match_the_enumerated_bootstrap_distribution(name):
    case = CASES[name]
    dist = _exact_distribution(**case)
    replicates = bootstrap_replicates(**case, n_resamples=200_000, rng_seed=1)
    rounded = np.round(replicates, 12)
    assert set(np.unique(rounded)) <= set(dist)  # no value the enumeration cannot produce
    cdf_mc = np.array([(rounded <= value).mean() for value in dist])
    cdf_exact = np.cumsum([float(p) for p in dist.values()])
    assert np.abs(cdf_mc - cdf_exact).max() < 0.005  # 200k draws: sd of each CDF value <= 0.0012
    mean_exact = sum(value * float(p) for value, p in dist.items())
    assert math.isclose(replicates.mean(), mean_exact, abs_tol=0.002)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95])
def test_interval_matches_the_exact_percentile_interval(name, confidence):
    case = CASES[name]
    dist = _exact_distribution(**case)
    tail = (1 - Fraction(confidence).limit_denominator(1000)) / 2
    ci = paired_bootstrap(**case, n_resamples=200_000, confidence=confidence, rng_seed=2)
    # where a CDF step lies within 0.005 (> 4 Monte Carlo sd) of the level, either neighbouring atom is right
    margin = Fraction(1, 200)
    for got, level in ((ci.low, tail), (ci.high, 1 - tail)):
        allowed = {_exact_quantile(dist, level - margin), _exact_quantile(dist, level + margin)}
        assert round(got, 12) in allowed, (got, allowed)
    assert ci.estimate == pytest.approx(paired_difference(**{k: v for k, v in case.items() if k != "pair_seeds"}))


# --------------------------------------------------------------------------- reproducibility and errors
def test_seeded_and_reproducible():
    rng = np.random.default_rng(5)
    base, ckpt = rng.integers(0, 9, size=(3, 40)) / 8, rng.integers(0, 9, size=(3, 40)) / 8
    strata = ["x"] * 25 + ["y"] * 15
    first = paired_bootstrap(base_SP=base, ckpt_SP=ckpt, strata_P=strata, pair_seeds=True, rng_seed=7)
    assert first == paired_bootstrap(base_SP=base, ckpt_SP=ckpt, strata_P=strata, pair_seeds=True, rng_seed=7)
    assert first != paired_bootstrap(base_SP=base, ckpt_SP=ckpt, strata_P=strata, pair_seeds=True, rng_seed=8)
    assert isinstance(first, Interval) and first.low <= first.estimate <= first.high


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(base_SP=[0.0, 1.0], ckpt_SP=[0.0]), "same problems"),
        (dict(base_SP=[0.0, float("nan")], ckpt_SP=[0.0, 1.0]), "non-finite"),
        (dict(base_SP=[], ckpt_SP=[]), "at least one"),
        (dict(base_SP=[0.0], ckpt_SP=[1.0], confidence=1.0), "confidence"),
        (dict(base_SP=[0.0], ckpt_SP=[1.0], n_resamples=0), "n_resamples"),
        (dict(base_SP=[[0.0], [1.0]], ckpt_SP=[1.0], pair_seeds=True), "pair_seeds"),
        (dict(base_SP=[0.0, 1.0], ckpt_SP=[1.0, 1.0], strata_P=["a"]), "strata_P"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(**kwargs)
