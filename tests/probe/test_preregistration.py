"""The probe's pre-registration (recipe/probe/preregistration.json) is what the code applies: its thresholds are the
probe's and the regime labels', its test cells are disjoint from the calibration cells; the study's pieces by hand."""

import json
from pathlib import Path

import pytest

from recipe.opsd.core import regimes
from recipe.probe.verdicts import THRESHOLDS

FROZEN = json.loads((Path(__file__).resolve().parents[2] / "recipe" / "probe" / "preregistration.json").read_text())


def test_the_frozen_thresholds_are_the_codes():
    assert FROZEN["probe_thresholds"] == {name: threshold.value for name, threshold in THRESHOLDS.items()}
    labels = FROZEN["regime_labels"]
    assert (labels["length_growth"], labels["eot_drop"], labels["boxed_ratio"], labels["boxed_floor"],
            labels["repetition_rise"]) == (regimes.LENGTH_GROWTH, regimes.EOT_DROP, regimes.BOXED_RATIO,
                                           regimes.BOXED_FLOOR, regimes.REPETITION_RISE)


def test_each_world_tests_at_least_six_cells_none_of_them_a_calibration_cell():
    for world in FROZEN["worlds"].values():
        calibration = [c["cell"] for c in world["calibration"]]
        tests = [t["cell"] for t in world["test"]]
        assert len(tests) >= 6 and not [cell for cell in tests if cell in calibration]
        assert {label for baseline in world["baselines"].values() for key, label in baseline.items()
                if key in ("label", "at_or_below", "above")} <= set(regimes.REGIMES)


def test_the_test_cells_take_the_launchs_axes_where_the_file_sets_none():
    from recipe.probe.preregistered import frozen_spec, test_cells

    cells = test_cells(frozen_spec()["worlds"]["toy"], student_mode="no_think", teacher_mode="no_think", clip_tau=None,
                       temperature=1.0)
    by_name = {entry["name"]: cell for entry, cell in zip(FROZEN["worlds"]["toy"]["test"], cells)}
    assert by_name["t1 clip 0.01"].clip_tau == 0.01 and by_name["t1 clip 0.01"].temperature == 1.0
    assert by_name["t4 reverse KL"].beta == 1.0 and "opsd.loss.beta=1" in by_name["t4 reverse KL"].overrides()
    assert by_name["t7 teacher think"].teacher_mode == "think" and by_name["t7 teacher think"].student_mode == "no_think"
    assert "actor_rollout_ref.actor.optim.lr=0.0001" in by_name["t8 lr 1e-4"].overrides()
    assert len({cell.name for cell in cells}) == len(cells)


def test_wilson_interval_and_the_baselines_by_hand():
    from recipe.probe.preregistered import baseline_predictions, wilson

    low, high = wilson(4, 8)  # p 0.5, n 8: 0.5 -+ 1.96 sqrt(0.25/8 + 1.96^2/256) / (1 + 1.96^2/8)
    half = 1.96 * (0.25 / 8 + 1.96 ** 2 / 256) ** 0.5 / (1 + 1.96 ** 2 / 8)
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert wilson(0, 6)[0] == 0.0 and wilson(6, 6)[1] == pytest.approx(1.0)
    toy = FROZEN["worlds"]["toy"]["baselines"]
    assert baseline_predictions(toy, 0.45) == {"majority": "stable degradation", "fwd_kl_rule": "gain"}
    assert baseline_predictions(toy, 0.46)["fwd_kl_rule"] == "stable degradation"
    assert baseline_predictions(FROZEN["worlds"]["real"]["baselines"], 3.0)["fwd_kl_rule"] == "no measurable effect"


def test_the_second_seed_rule_and_the_scores():
    from recipe.probe.preregistered import needs_second_seed, scored

    rows = [{"name": "a", "seeds": [42], "change": {"estimate": 0.01, "low": -0.02, "high": 0.04}, "verdict": "gain",
             "outcome": "no measurable effect"},
            {"name": "b", "seeds": [42], "change": {"estimate": -0.1, "low": -0.15, "high": -0.05},
             "verdict": "stable degradation", "outcome": "stable degradation"}]
    assert needs_second_seed(rows, "a") and not needs_second_seed(rows, "b") and not needs_second_seed(rows, "c")
    probe = {"cells": [{"name": "a", "frozen": {"fwd_kl": 0.1}}, {"name": "b", "frozen": {"fwd_kl": 2.0}}]}
    result = scored({"rows": rows}, probe, FROZEN["worlds"]["toy"])
    assert [r["predictions"]["fwd_kl_rule"] for r in result["rows"]] == ["gain", "stable degradation"]
    assert {k: v["agree"] for k, v in result["summary"].items()} == {"probe": 1, "majority": 1, "fwd_kl_rule": 1}
