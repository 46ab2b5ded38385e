"""The probe's pre-registration (recipe/experiments/probe_preregistration.json) is what the code applies: its
thresholds are the probe's and the regime labels', and its test cells are disjoint from the calibration cells."""

import json
from pathlib import Path

from recipe.analysis.compatibility import THRESHOLDS
from recipe.opsd.core import regimes

FROZEN = json.loads((Path(__file__).resolve().parents[2] / "recipe" / "experiments" / "probe_preregistration.json").read_text())


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
