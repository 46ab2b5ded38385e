"""The compatibility probe's verdicts (recipe.probe.verdicts): indicators by hand on K-step traces,
one trace per regime, the recommendation (a full run's regime: tests/opsd/test_regimes.py)."""

from __future__ import annotations

import math

import pytest

from recipe.probe.verdicts import (
    THRESHOLDS,
    classify,
    proportion_z,
    recommend,
    reward_z,
    step_indicators,
    thresholds_table,
    windows,
)


def trace(k=12, *, reward=lambda s: 0.2, length=lambda s: 20.0, capped=lambda s: 0.0, boxed=lambda s: 0.9,
          entropy=lambda s: 0.5, grad=lambda s: 0.3, kl=lambda s: 0.1):
    return [{"step": s, "opsd/rollout_score": reward(s), "response_length/mean": length(s),
             "response_length/clip_ratio": capped(s), "opsd/rollout_boxed_rate": boxed(s),
             "opsd/student_entropy": entropy(s), "actor/grad_norm": grad(s), "opsd/fwd_kl": kl(s)} for s in range(1, k + 1)]


def test_windows_and_indicators_by_hand():
    assert windows(12) == (4, 4) and windows(4) == (2, 2) and windows(7) == (2, 2)
    with pytest.raises(ValueError, match="at least 4"):
        windows(3)
    ind = step_indicators(trace(length=lambda s: float(s), kl=lambda s: 0.1 * s), rollouts_per_step=64)
    assert ind["early_steps"] == [1, 4] and ind["late_steps"] == [9, 12]
    assert ind["length_early"] == pytest.approx(2.5) and ind["length_late"] == pytest.approx(10.5)
    assert ind["length_ratio"] == pytest.approx(10.5 / 2.5)
    assert ind["kl_ratio"] == pytest.approx(1.05 / 0.25)
    assert ind["reward_z"] == 0.0 and ind["warnings"] == ["length"]


def test_reward_z_is_two_binomial_proportions():
    p1, p2, z = reward_z([0.1, 0.1], [0.3, 0.3], rollouts_per_step=50)
    assert (p1, p2) == (pytest.approx(0.1), pytest.approx(0.3))
    assert z == pytest.approx(0.2 / math.sqrt(0.1 * 0.9 / 100 + 0.3 * 0.7 / 100))
    assert reward_z([0.0], [0.0], rollouts_per_step=8)[2] == 0.0
    assert reward_z([0.0], [1.0], rollouts_per_step=8)[2] == math.inf
    assert reward_z([], [0.5], rollouts_per_step=8)[2] is None


def _verdict(rows, frozen=None, n=64):
    return classify(step_indicators(rows, rollouts_per_step=n), frozen)


def test_one_trace_per_regime():
    assert _verdict(trace(reward=lambda s: 0.1 if s <= 6 else 0.3)).verdict == "gain"
    assert _verdict(trace(reward=lambda s: 0.1 if s <= 6 else 0.3)).basis == "observed"
    predicted = _verdict(trace(kl=lambda s: 0.2 if s <= 6 else 0.1))
    assert (predicted.verdict, predicted.basis) == ("gain", "predicted")
    assert _verdict(trace(reward=lambda s: 0.4 if s <= 6 else 0.2)).verdict == "stable degradation"
    assert _verdict(trace(kl=lambda s: 0.1 if s <= 6 else 0.2)).verdict == "stable degradation"
    assert _verdict(trace(kl=lambda s: 0.1 if s <= 6 else 0.12)).verdict == "no measurable effect"  # within noise
    growth = _verdict(trace(length=lambda s: 20.0 if s <= 6 else 40.0))
    assert growth.verdict == "ineffective length growth" and growth.reasons[0].indicator == "length ratio"
    assert _verdict(trace(capped=lambda s: 0.0 if s <= 6 else 0.5)).verdict == "ineffective length growth"
    assert _verdict(trace(length=lambda s: 20.0 if s <= 6 else 40.0, reward=lambda s: 0.4 if s <= 6 else 0.1)).verdict \
        == "stable degradation"
    joint = _verdict(trace(entropy=lambda s: 0.5 if s <= 6 else 1.0, grad=lambda s: 0.3 if s <= 6 else 0.6))
    assert joint.verdict == "collapse" and {r.indicator for r in joint.reasons} == {"entropy ratio", "grad-norm ratio"}
    assert _verdict(trace(boxed=lambda s: 0.9 if s <= 6 else 0.2, length=lambda s: 20.0 if s <= 6 else 60.0)).verdict \
        == "collapse"
    assert _verdict(trace(boxed=lambda s: 0.9 if s <= 6 else 0.2)).verdict == "stable degradation"
    assert _verdict(trace()).verdict == "no measurable effect"
    # entropy alone rising is not the collapse signature
    assert _verdict(trace(entropy=lambda s: 0.5 if s <= 6 else 1.0)).verdict != "collapse"
    # no signal at all: the frozen KL decides, whatever the steps did
    assert _verdict(trace(reward=lambda s: 0.1 if s <= 6 else 0.3), frozen={"fwd_kl": 0.0}).verdict == \
        "no measurable effect"


def test_two_frozen_mechanisms_predict_a_degradation_unless_the_reward_rises():
    kl_fall = trace(kl=lambda s: 0.2 if s <= 6 else 0.1)  # alone: a predicted gain
    worse = {"fwd_kl": 0.1, "teacher_lift_z": -2.5, "clip_reversal": 0.0}
    verdict = _verdict(kl_fall, frozen=worse)
    assert (verdict.verdict, verdict.basis) == ("stable degradation", "predicted")
    assert verdict.reasons[0].indicator == "frozen teacher - student accuracy z"
    reversed_ = _verdict(kl_fall, frozen={"fwd_kl": 0.1, "teacher_lift_z": 3.0, "clip_reversal": 80.0})
    assert reversed_.verdict == "stable degradation" and reversed_.reasons[0].indicator == "frozen clip reversal (%)"
    # below the thresholds, or a NaN reversal (no decisive position), the K steps decide
    assert _verdict(kl_fall, frozen={"fwd_kl": 0.1, "teacher_lift_z": -1.9, "clip_reversal": 49.0}).verdict == "gain"
    assert _verdict(kl_fall, frozen={"fwd_kl": 0.1, "clip_reversal": math.nan}).verdict == "gain"
    # an observed reward rise outweighs both predictions
    assert _verdict(trace(reward=lambda s: 0.1 if s <= 6 else 0.3), frozen=worse).verdict == "gain"


def test_proportion_z_by_hand():
    assert proportion_z(0.5, 100, 0.6, 100) == pytest.approx(0.1 / math.sqrt(0.25 / 100 + 0.24 / 100))
    assert proportion_z(0.0, 10, 0.0, 10) == 0.0 and proportion_z(1.0, 10, 0.0, 10) == -math.inf


def test_every_reason_names_its_threshold_and_source():
    verdict = _verdict(trace(length=lambda s: 20.0 if s <= 6 else 40.0))
    for reason in verdict.reasons:
        assert "value" in reason.threshold and reason.source
    table = thresholds_table()
    assert all(f"| {name} |" in table for name in THRESHOLDS)
    assert "tab:sft_grpo_opsd_train" in THRESHOLDS["entropy_ratio"].source


def test_recommendation_prefers_an_observed_gain_and_says_when_none_is_compatible():
    def cell(name, verdict, basis, z):
        return {"name": name, "verdict": {"verdict": verdict, "basis": basis}, "indicators": {"reward_z": z}}

    cells = [cell("a", "gain", "predicted", 5.0), cell("b", "gain", "observed", 2.5), cell("c", "collapse", "warning", -3)]
    assert recommend(cells)["cell"] == "b"
    none = recommend([cell("c", "collapse", "warning", -3.0), cell("d", "stable degradation", "observed", -2.5)])
    assert none["cell"] is None and "no cell is compatible" in none["why"] and "c: collapse" in none["why"]
