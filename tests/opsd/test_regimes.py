"""The paper's regime labels (recipe.opsd.core.regimes) on hand-written evaluations: each rule, its boundaries and
the order in which the rules apply."""

import pytest

from recipe.opsd.core.regimes import REGIMES, RULES, Behaviour, collapse_signs, label, length_growth

START = Behaviour(greedy_length=40.0, eot_rate=0.95, boxed_rate=0.80, repetitive_rate=0.02, sampled_length=50.0)


def _after(**changes):
    fields = dict(greedy_length=40.0, eot_rate=0.95, boxed_rate=0.80, repetitive_rate=0.02, sampled_length=50.0)
    return Behaviour(**{**fields, **changes})


def test_gain_is_an_interval_above_zero_whatever_else_happens():
    regime = label(change_low=0.01, change_high=0.09, before=START, after=_after(greedy_length=80.0, boxed_rate=0.1))
    assert regime.name == "gain" and "length x2.00" in regime.reasons


@pytest.mark.parametrize(("after", "sign"), [
    (_after(eot_rate=0.75), "end-of-turn rate 0.95 -> 0.75"),          # a drop of exactly 0.20
    (_after(boxed_rate=0.40), "boxed rate 0.80 -> 0.40"),              # exactly half the start
    (_after(repetitive_rate=0.12), "repetitive 0.02 -> 0.12"),         # a rise of exactly 0.10
])
def test_a_drop_with_a_failure_sign_is_collapse(after, sign):
    regime = label(change_low=-0.30, change_high=-0.10, before=START, after=after)
    assert regime.name == "collapse" and any(r.startswith(sign) for r in regime.reasons), regime


@pytest.mark.parametrize("after", [
    _after(eot_rate=0.76, greedy_length=70.0),   # a drop of 0.19: no sign; longer: the paper's picture
    _after(boxed_rate=0.41),                     # 0.51 x the start
    _after(repetitive_rate=0.11),                # a rise of 0.09
])
def test_a_drop_without_a_failure_sign_is_stable_degradation(after):
    assert label(change_low=-0.2, change_high=-0.01, before=START, after=after).name == "stable degradation"


def test_no_significant_change_with_length_growth_is_ineffective_length_growth():
    # the sampled length grows x1.25 (50 -> 62.5) while the greedy one does not: the larger ratio counts
    after = _after(sampled_length=62.5)
    assert length_growth(START, after) == pytest.approx(1.25)
    assert label(change_low=-0.05, change_high=0.02, before=START, after=after).name == "ineffective length growth"
    # x1.24 is not substantial; failure signs without a significant drop do not make a collapse
    after = _after(greedy_length=49.6, boxed_rate=0.1)
    assert label(change_low=-0.05, change_high=0.0, before=START, after=after).name == "no measurable effect"


def test_lengths_and_signs_by_hand():
    assert length_growth(START, _after(greedy_length=60.0, sampled_length=None)) == pytest.approx(1.5)
    no_sampling = Behaviour(greedy_length=40.0, eot_rate=1.0, boxed_rate=0.9, repetitive_rate=0.0)
    assert length_growth(no_sampling, _after(greedy_length=30.0)) == pytest.approx(0.75)
    # a boxed rate that starts under 5% cannot collapse
    low = Behaviour(greedy_length=40.0, eot_rate=0.9, boxed_rate=0.04, repetitive_rate=0.0)
    assert collapse_signs(low, Behaviour(greedy_length=40.0, eot_rate=0.9, boxed_rate=0.0, repetitive_rate=0.0)) == ()


def test_the_rules_are_listed_in_the_order_they_apply_and_a_reversed_interval_is_refused():
    assert [rule.split(":")[0] for rule in RULES] == list(REGIMES)
    with pytest.raises(ValueError, match="reversed"):
        label(change_low=0.1, change_high=-0.1, before=START, after=START)
