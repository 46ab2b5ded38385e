"""The async benchmark's tables on hand-made run results (no launch): timings, ratios, CIs, the model."""

import pytest

from recipe.experiments import async_compare


def _result(step_s, gen_s, *, lag=0.0, greedy=None, samples=8):
    metrics = [{"step": s, "opsd/loss": 0.1, "opsd/fwd_kl": 0.5 / s, "timing_s/step": step_s + (5 if s == 1 else 0),
                "timing_s/gen": gen_s, "timing_s/update_actor": 1.0, "timing_s/update_weights": 0.1,
                "async/lag_mean": lag if s > 1 else 0.0} for s in (1, 2, 3)]
    out = {"metrics": metrics, "samples_per_step": samples, "wall_time_s": 60, "before": None, "after": None}
    if greedy is not None:
        problems = {f"p{i}": float(i < greedy * 10) for i in range(10)}
        out["after"] = {"greedy": greedy, "avg@4": greedy, "n_problems": 10,
                        "per_problem": {"greedy": problems, "avg@4": problems}}
        out["before"] = {**out["after"], "greedy": 0.1, "avg@4": 0.1}
    return out


def test_timing_skips_step_one_and_takes_the_phase_means():
    t = async_compare.timing(_result(4.0, 3.0))
    assert (t["step_s"], t["gen_s"], t["update_s"], t["push_s"], t["steps"]) == (4.0, 3.0, 1.0, 0.1, 3)
    assert async_compare.generation_share(_result(4.0, 3.0)) == pytest.approx(0.75)


def test_smollm2_table_ratios_and_kl_trajectory():
    text = async_compare.smollm2_table({"sync": _result(4.0, 3.0), "one_step_off": _result(3.0, 0.5, lag=1.0)})
    sync_row, async_row = text.splitlines()[2:4]
    assert "| sync | 4.00 | 0.500 |" in sync_row and "| 1.00 | 0.500 0.250 0.167 |" in sync_row
    assert "| one_step_off | 3.00 | 0.375 | 0.50 |" in async_row and "| 1.00 | 0.75 |" in async_row


def test_toy_table_has_the_paired_interval_against_sync():
    text = async_compare.toy_table({"sync": _result(4.0, 3.0, greedy=0.5), "fully_async": _result(2.0, 0.5, greedy=0.7)})
    row = text.splitlines()[3]
    assert row.startswith("| fully_async | 1 + 1 | 70.0 | 70.0 | +20.0 [")
    assert row.endswith("| 3 | 2.00 | 0.50 |")


def test_model_table_is_labelled_and_never_beats_sync_when_throughput_bound():
    text = async_compare.speedup_model_table(shares={"measured": 0.75})
    assert "a=1 throughput-bound" in text
    two_devices = text.splitlines()[2]
    # D=2, share 0.75: a=0 -> 1/max(0.75, 0.5) = 1.33x; a=1 -> 1/max(1.5, 0.5) = 0.67x
    assert two_devices == "| measured 0.75 | 2 | 1: 1.33x / 1: 0.94x / 1: 0.67x |"
