"""The paper's regime of a finished run, from its held-out evaluations before and after (pure stdlib).

The paper (section "Empirical Methodology"): "Ineffective deliberation denotes little decline of accuracy
accompanied by substantial evaluation length growth. Stable degradation denotes that [...] accuracy declines
gradually while evaluation rollout length grows. Behavioral collapse denotes a large performance degradation
accompanied by failures such as repetition, hallucination, missing of <eos> token, corrupted text, or loss of
boxed-answer formatting." ``label`` applies the first rule that matches (``RULES``); a change is significant
when its 95% paired bootstrap interval excludes 0. The thresholds are chosen once, before any run they label
(docs/core_math.md "Regimes"), and every run is labelled by this one function.
"""

from __future__ import annotations

from dataclasses import dataclass

REGIMES = ("gain", "collapse", "stable degradation", "ineffective length growth", "no measurable effect")
# after / before mean response length, greedy or sampled, at or above which the length grew "substantially"
LENGTH_GROWTH = 1.25
# collapse signs: the end-of-turn rate falls by at least this much (absolute) ...
EOT_DROP = 0.20
# ... the boxed rate falls to at most this fraction of its start (a start of at least BOXED_FLOOR) ...
BOXED_RATIO, BOXED_FLOOR = 0.5, 0.05
# ... or the share of repetitive responses rises by at least this much (absolute)
REPETITION_RISE = 0.10
# a value at a threshold counts as reaching it (rates are sums of 1 / n: decimal thresholds are not exact in floats)
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Behaviour:
    """What one evaluation of a checkpoint shows besides accuracy (fractions in [0, 1], lengths in tokens).

    greedy_length / sampled_length: mean response length of the greedy / sampled evaluation (None: not run).
    eot_rate: share of greedy responses that end with the end-of-turn token (not cut at the cap).
    boxed_rate: share of greedy responses with a boxed answer.
    repetitive_rate: share of greedy responses that loop (``recipe.evaluation.metrics.generation_diagnostics``).
    """

    greedy_length: float
    eot_rate: float
    boxed_rate: float
    repetitive_rate: float
    sampled_length: float | None = None


@dataclass(frozen=True)
class Regime:
    """A run's regime and the evidence that decided it (one line per sign, in the order of the rules)."""

    name: str
    reasons: tuple[str, ...]


def length_growth(before: Behaviour, after: Behaviour) -> float | None:
    """The larger of the greedy and sampled after / before mean-length ratios (None without lengths)."""
    ratios = [a / b for b, a in ((before.greedy_length, after.greedy_length),
                                 (before.sampled_length, after.sampled_length)) if b and a is not None]
    return max(ratios) if ratios else None


def collapse_signs(before: Behaviour, after: Behaviour) -> tuple[str, ...]:
    """The paper's failure signs that ``after`` shows against ``before``."""
    signs = []
    if before.eot_rate - after.eot_rate >= EOT_DROP - _TOLERANCE:
        signs.append(f"end-of-turn rate {before.eot_rate:.2f} -> {after.eot_rate:.2f} (drop >= {EOT_DROP})")
    if before.boxed_rate >= BOXED_FLOOR and after.boxed_rate <= BOXED_RATIO * before.boxed_rate + _TOLERANCE:
        signs.append(f"boxed rate {before.boxed_rate:.2f} -> {after.boxed_rate:.2f} (<= {BOXED_RATIO} x start)")
    if after.repetitive_rate - before.repetitive_rate >= REPETITION_RISE - _TOLERANCE:
        signs.append(f"repetitive {before.repetitive_rate:.2f} -> {after.repetitive_rate:.2f} (rise >= {REPETITION_RISE})")
    return tuple(signs)


def label(*, change_low: float, change_high: float, before: Behaviour, after: Behaviour) -> Regime:
    """The regime of a run whose accuracy change has the 95% interval [change_low, change_high] (RULES)."""
    if change_low > change_high:
        raise ValueError(f"the interval is reversed: [{change_low}, {change_high}]")
    growth = length_growth(before, after)
    grew = growth is not None and growth >= LENGTH_GROWTH - _TOLERANCE
    length = f"length x{growth:.2f}" if growth is not None else "no length"
    if change_low > 0:
        return Regime("gain", (f"accuracy change [{change_low:+.3f}, {change_high:+.3f}] above 0", length))
    if change_high < 0:
        signs = collapse_signs(before, after)
        interval = f"accuracy change [{change_low:+.3f}, {change_high:+.3f}] below 0"
        if signs:
            return Regime("collapse", (interval, *signs))
        return Regime("stable degradation", (interval, length))
    if grew:
        return Regime("ineffective length growth",
                      (f"accuracy change [{change_low:+.3f}, {change_high:+.3f}] includes 0", f"{length} >= {LENGTH_GROWTH}"))
    return Regime("no measurable effect", (f"accuracy change [{change_low:+.3f}, {change_high:+.3f}] includes 0", length))


RULES = (
    "gain: the interval lies above 0",
    "collapse: the interval lies below 0 and a failure sign shows (end-of-turn rate, boxed rate, repetition)",
    "stable degradation: the interval lies below 0 without a failure sign",
    f"ineffective length growth: the interval includes 0 and the greedy or sampled length grows >= x{LENGTH_GROWTH}",
    "no measurable effect: otherwise",
)
