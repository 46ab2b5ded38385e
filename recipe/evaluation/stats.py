"""Paired bootstrap confidence intervals for accuracy differences (pure numpy).

The paper compares a checkpoint with its Base on the same 120 problems (evaluation seeds 42 / 1024 / 65536)
but gives no interval; ``paired_bootstrap`` gives one for the change in Avg@n (or any per-problem score),
stratified by benchmark, percentile method, bit-reproducible from ``rng_seed``. Used by ``scripts/evaluate.py
compare`` and the toy studies; the design and its limits: docs/evaluation.md#paired-bootstrap-intervals::

    from recipe.evaluation.stats import paired_bootstrap
    ci = paired_bootstrap(base_SP=[[0.25, 0.5, 1.0]], ckpt_SP=[[0.5, 0.5, 0.875]])
    print(f"{100 * ci.estimate:+.1f} [{100 * ci.low:+.1f}, {100 * ci.high:+.1f}]")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RNG_SEED = 0
METHOD = "percentile"


@dataclass(frozen=True)
class Interval:
    """A bootstrap confidence interval of ``paired_difference``.

    Attributes:
        estimate: the statistic on the observed data.
        low, high: the percentile interval.
        se: the standard deviation of the replicates (bootstrap standard error).
        confidence: the nominal coverage, e.g. 0.95.
        resamples: number of bootstrap replicates.
        method: always ``"percentile"``.
    """

    estimate: float
    low: float
    high: float
    se: float
    confidence: float
    resamples: int
    method: str = METHOD

    def points(self, *, digits: int = 1) -> str:
        """``[low, high]`` in percentage points, e.g. ``[-3.3, +5.8]``."""
        return f"[{100 * self.low:+.{digits}f}, {100 * self.high:+.{digits}f}]"


def _as_SP(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{name} must be [problems] or [seeds, problems] with at least one of each; got shape "
                         f"{np.shape(values)}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds a non-finite value (NaN or inf): every (seed, problem) needs a score")
    return array


def _strata_index(strata_P, n_problems: int) -> list[np.ndarray]:
    if strata_P is None:
        return [np.arange(n_problems)]
    if len(strata_P) != n_problems:
        raise ValueError(f"strata_P has {len(strata_P)} entries for {n_problems} problems")
    groups: dict = {}
    for index, name in enumerate(strata_P):
        groups.setdefault(name, []).append(index)
    return [np.asarray(indices) for indices in groups.values()]


def _check_inputs(base_SP, ckpt_SP, strata_P, pair_seeds):
    base, ckpt = _as_SP("base_SP", base_SP), _as_SP("ckpt_SP", ckpt_SP)
    if base.shape[1] != ckpt.shape[1]:
        raise ValueError(f"base_SP and ckpt_SP must score the same problems (paired); got {base.shape[1]} and "
                         f"{ckpt.shape[1]} problems")
    if pair_seeds and base.shape[0] != ckpt.shape[0]:
        raise ValueError(f"pair_seeds=True needs the same seed rows on both sides; got {base.shape[0]} and "
                         f"{ckpt.shape[0]}")
    return base, ckpt, _strata_index(strata_P, base.shape[1])


def paired_difference(*, base_SP, ckpt_SP, strata_P: Sequence | None = None) -> float:
    """Macro (over strata) mean over problems of (seed-mean checkpoint score - seed-mean Base score)."""
    base, ckpt, strata = _check_inputs(base_SP, ckpt_SP, strata_P, False)
    diff_P = ckpt.mean(0) - base.mean(0)
    return float(np.mean([diff_P[indices].mean() for indices in strata]))


def _row_means(values_SP: np.ndarray, counts_BS: np.ndarray | None) -> np.ndarray:
    """[B, P] seed-mean of each problem under each replicate's seed draw (``None``: no seed draw)."""
    if counts_BS is None:
        return values_SP.mean(0)[None, :]
    return counts_BS @ values_SP / values_SP.shape[0]


def bootstrap_replicates(*, base_SP, ckpt_SP, strata_P: Sequence | None = None, pair_seeds: bool = False,
                         n_resamples: int = DEFAULT_RESAMPLES, rng_seed: int = DEFAULT_RNG_SEED) -> np.ndarray:
    """The ``n_resamples`` bootstrap replicates of ``paired_difference``.

    One replicate: within each stratum, draw its problems with replacement (same count), the same draw for
    Base and checkpoint (paired by problem); with more than one seed row, draw the checkpoint's seed rows
    with replacement too, and the Base's independently (``pair_seeds=False``) or with the same draw
    (``pair_seeds=True``: row s of both is the same evaluation seed). Problems and seeds are crossed, so rows
    and columns are drawn independently: Owen's (2007) "pigeonhole" bootstrap, which errs on the wide side.
    """
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be an int >= 1; got {n_resamples!r}")
    base, ckpt, strata = _check_inputs(base_SP, ckpt_SP, strata_P, pair_seeds)
    rng = np.random.default_rng(rng_seed)

    def seed_draw(n_rows: int) -> np.ndarray | None:
        return None if n_rows == 1 else rng.multinomial(n_rows, np.full(n_rows, 1 / n_rows), size=n_resamples)

    ckpt_counts = seed_draw(ckpt.shape[0])
    base_counts = ckpt_counts if pair_seeds else seed_draw(base.shape[0])
    diff_BP = _row_means(ckpt, ckpt_counts) - _row_means(base, base_counts)  # [B or 1, P]
    replicates = np.zeros(n_resamples)
    for indices in strata:
        n = len(indices)
        counts_BN = rng.multinomial(n, np.full(n, 1 / n), size=n_resamples)  # problems drawn with replacement
        replicates += (counts_BN * diff_BP[:, indices]).sum(1) / n
    return replicates / len(strata)


def percentile_interval(replicates, *, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """(low, high): the (1 - c)/2 and (1 + c)/2 quantiles, each the smallest value whose empirical CDF reaches it.

    The percentile method (Efron & Tibshirani 1993, ch. 13), chosen over BCa: the statistic is a bounded mean
    of bounded scores, the interval is transformation-respecting and can be checked exactly against an
    enumeration of every resample on a tiny set (tests); BCa's corrections matter mostly for skewed
    statistics and small B.
    """
    _check_confidence(confidence)
    values = np.asarray(replicates, dtype=np.float64)
    tail = (1 - confidence) / 2
    low, high = np.quantile(values, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def _check_confidence(confidence) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")


def paired_bootstrap(*, base_SP, ckpt_SP, strata_P: Sequence | None = None, pair_seeds: bool = False,
                     n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                     rng_seed: int = DEFAULT_RNG_SEED) -> Interval:
    """Percentile bootstrap interval of the paired checkpoint - Base difference (``bootstrap_replicates``).

    Args:
        base_SP, ckpt_SP: scores [seeds, problems] (or [problems]); column p is the same problem.
        strata_P: the benchmark of each problem (resampled within, macro-averaged); None = one.
        pair_seeds: row s of both sides is the same seed (resampled together).
        n_resamples: bootstrap replicates B.
        confidence: nominal coverage.
        rng_seed: seed of ``numpy.random.default_rng``.
    """
    _check_confidence(confidence)
    replicates = bootstrap_replicates(base_SP=base_SP, ckpt_SP=ckpt_SP, strata_P=strata_P, pair_seeds=pair_seeds,
                                      n_resamples=n_resamples, rng_seed=rng_seed)
    low, high = percentile_interval(replicates, confidence=confidence)
    estimate = paired_difference(base_SP=base_SP, ckpt_SP=ckpt_SP, strata_P=strata_P)
    se = float(replicates.std()) if n_resamples > 1 else math.nan
    return Interval(estimate=estimate, low=low, high=high, se=se, confidence=float(confidence),
                    resamples=n_resamples)


def align_problems(base: dict[str, float], ckpt: dict[str, float]) -> tuple[list[str], list[float], list[float]]:
    """(shared ids in ``base`` order, base scores, checkpoint scores) of two ``{problem_id: score}`` maps."""
    shared = [pid for pid in base if pid in ckpt]
    return shared, [base[pid] for pid in shared], [ckpt[pid] for pid in shared]
