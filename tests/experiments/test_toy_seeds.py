"""recipe.experiments.toy_seeds without launching anything: signal windows, gains over seeds, the table."""

import math

from recipe.evaluation.stats import paired_bootstrap
from recipe.experiments.toy_seeds import ARMS, gain_stats, signal_windows, study_table


def _metrics(kls):
    return [{"opsd/fwd_kl": kl, "opsd/loss": kl, "opsd/top1_agree": 1 - kl} for kl in kls]


def test_signal_windows_first_and_last_steps():
    out = signal_windows(_metrics([0.0] + [0.4] * 9 + [0.1] * 10 + [0.2] * 10), window=10)
    assert math.isclose(out["fwd_kl_first"], 0.36) and math.isclose(out["fwd_kl_last"], 0.2)
    assert out["step1_loss"] == 0.0 and math.isclose(out["top1_agree_last"], 0.8)
    assert math.isnan(signal_windows([])["step1_loss"])


def test_gain_stats_mean_and_sample_sd_in_points():
    before = {"greedy": 0.10}
    runs = {2: {"after": {"greedy": 0.18}}, 1: {"after": {"greedy": 0.14}}, 3: {"after": {"greedy": 0.16}}}
    mean, sd, gains = gain_stats(runs, before, "greedy")
    assert [round(g, 6) for g in gains] == [4.0, 8.0, 6.0]  # seed order
    assert math.isclose(mean, 6.0) and math.isclose(sd, 2.0)
    assert math.isnan(gain_stats({1: runs[1]}, before, "greedy")[1])


def test_study_table_rows():
    before = {"greedy": 0.1, "avg@4": 0.05, "n_problems": 256}
    signal = {"fwd_kl_first": 0.2, "fwd_kl_last": 0.1, "top1_agree_first": 0.9, "top1_agree_last": 0.95,
              "step1_loss": 0.2, "loss_first": 0.2, "loss_last": 0.1}
    results = {"full_solution": {1: {"after": {"greedy": 0.2, "avg@4": 0.1}, "signal": signal}}}
    text = study_table(results, before, eval_n=4)
    row = text.splitlines()[2]
    assert row.startswith("| full_solution | +10.0 (1 seed) | +10.0 | - | +5.0 (1 seed) | - | 0.2000 -> 0.1000 (-50%)")
    assert "greedy 10.0%" in text and "256 held-out" in text
    results["full_solution"][2] = {"after": {"greedy": 0.3, "avg@4": 0.1}, "signal": signal}
    row = study_table(results, before, eval_n=4).splitlines()[2]
    assert row.startswith("| full_solution | +15.0 +- 7.1 | +10.0, +20.0 | - | +5.0 +- 0.0 | - |")


def test_arms_are_overrides_of_the_toy_preset():
    assert ARMS["full_solution"] == () and ARMS["control"] == ("opsd.teacher_context=none", "opsd.teacher.allow_zero_loss=true")
    assert ARMS["paper_clip"] == ("opsd.loss.clip_tau=0.05",)


def test_study_table_interval_resamples_problems_and_seeds():
    before = {"greedy": 0.5, "avg@4": 0.25, "n_problems": 2,
              "per_problem": {"greedy": {"p1": 0.0, "p2": 1.0}, "avg@4": {"p1": 0.0, "p2": 0.5}}}
    signal = {"fwd_kl_first": 0.2, "fwd_kl_last": 0.1, "top1_agree_first": 0.9, "top1_agree_last": 0.95,
              "step1_loss": 0.2}
    after = {2: {"greedy": 1.0, "avg@4": 0.5, "per_problem": {"greedy": {"p1": 1.0, "p2": 1.0},
                                                               "avg@4": {"p1": 0.25, "p2": 0.75}}},
             1: {"greedy": 0.5, "avg@4": 0.25, "per_problem": {"greedy": {"p1": 1.0, "p2": 0.0},
                                                                "avg@4": {"p1": 0.0, "p2": 0.5}}}}
    results = {"full_solution": {seed: {"after": a, "signal": signal} for seed, a in after.items()}}
    row = study_table(results, before, eval_n=4).splitlines()[2]
    greedy = paired_bootstrap(base_SP=[0.0, 1.0], ckpt_SP=[[1.0, 0.0], [1.0, 1.0]])  # rows in seed order 1, 2
    avg = paired_bootstrap(base_SP=[0.0, 0.5], ckpt_SP=[[0.0, 0.5], [0.25, 0.75]])
    assert row.startswith(f"| full_solution | +25.0 +- 35.4 | +0.0, +50.0 | {greedy.points()} | +12.5 +- 17.7 "
                          f"| {avg.points()} |")
    assert greedy.estimate == 0.25
