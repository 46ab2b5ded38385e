"""recipe.toy.compare without launching anything: launch commands, metrics reading, the table."""

import json
from pathlib import Path

import pytest

from recipe.evaluation.stats import paired_bootstrap
from recipe.toy.compare import (
    ToyRunConfig,
    _progress,
    change_interval,
    method_launch,
    problem_scores,
    read_step_metrics,
    table,
)


def test_both_methods_see_the_same_problems_in_the_same_order(tmp_path):
    config = ToyRunConfig(steps=7, batch_size=16)
    launches = {m: method_launch(m, root=tmp_path, run_dir=tmp_path / m, config=config) for m in ("opsd", "grpo")}
    for method, (command, env, metrics) in launches.items():
        assert env["MODEL_PATH"] == str(tmp_path / "student")
        assert env["TRAIN_FILES"] == str(tmp_path / "data" / "train.parquet")
        assert env["CKPT_DIR"] == str(tmp_path / method / "ckpt")
        assert metrics == tmp_path / method / "metrics.jsonl"
        for shared in ("data.train_batch_size=16", "data.seed=42", "trainer.total_training_steps=7",
                       "trainer.resume_mode=disable"):
            assert shared in command, (method, shared)
    opsd, grpo = launches["opsd"][0], launches["grpo"][0]
    assert opsd[1] == "recipe/opsd/run_opsd.sh" and grpo[1] == "recipe/grpo_baseline/run_grpo.sh"
    assert {"opsd.teacher_context=full_solution", "opsd.student_mode=no_think", "opsd.teacher_mode=no_think",
            "opsd.loss.clip_tau=null"} <= set(opsd)
    assert "+data.apply_chat_template_kwargs.enable_thinking=False" in grpo
    assert launches["opsd"][1]["OPSD_DEVICE"] == "cpu" and launches["grpo"][1]["DEVICE"] == "cpu"
    with pytest.raises(ValueError, match="method"):
        method_launch("ppo", root=tmp_path, run_dir=tmp_path, config=config)


def test_read_step_metrics_sorts_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {"timing_s/step": float(s)}}) + "\n" for s in (2, 1)))
    assert read_step_metrics(path) == [{"timing_s/step": 1.0}, {"timing_s/step": 2.0}]
    assert read_step_metrics(tmp_path / "missing.jsonl") == []


def test_progress_line_parses_numpy_scalars():
    line = "step:3 - opsd/loss:np.float64(0.25) - timing_s/step:2.5 - other:x"
    assert _progress(line, "opsd") == "[toy opsd] step 3: loss=0.25 s/step=2.5"
    assert _progress("no metrics here", "opsd") is None


def test_table_values_and_compute_ratio():
    config = ToyRunConfig(eval_n=4)
    before = {"greedy": 0.25, "avg@4": 0.2, "pass@4": 0.5, "mean_length": 20.0, "n_problems": 256}
    results = {
        "opsd": {"after": {"greedy": 0.3, "avg@4": 0.25, "pass@4": 0.55, "mean_length": 19.0},
                 "train": {"steps": 2, "wall_time_s": 100.0, "step_times_s": [2.0, 4.0]}},
        "grpo": {"after": {"greedy": 0.2, "avg@4": 0.2, "pass@4": 0.5, "mean_length": 21.0},
                 "train": {"steps": 2, "wall_time_s": 200.0, "step_times_s": [6.0, 6.0]}},
    }
    text = table(before, results, config)
    assert "| opsd | 25.0 -> 30.0 | 20.0 -> 25.0 | - | 50.0 -> 55.0 | 20.0 -> 19.0 | 2 | 100 | 3.00 | 4.00 |" in text
    assert "| grpo | 25.0 -> 20.0 |" in text
    assert "time per step 0.50 (0.67 after step 1), launch wall time 0.50" in text


def test_table_intervals_paired_by_problem(tmp_path):
    config = ToyRunConfig(eval_n=4)
    before = {"greedy": 0.5, "avg@4": 0.25, "pass@4": 0.5, "mean_length": 20.0, "n_problems": 2,
              "per_problem": {"greedy": {"p1": 0.0, "p2": 1.0}, "avg@4": {"p1": 0.0, "p2": 0.5}}}
    opsd = {**before, "greedy": 1.0, "avg@4": 0.625,
            "per_problem": {"greedy": {"p2": 1.0, "p1": 1.0}, "avg@4": {"p1": 0.5, "p2": 0.75}}}
    grpo = {**before, "per_problem": before["per_problem"]}
    train = {"steps": 1, "wall_time_s": 1.0, "step_times_s": [1.0, 1.0]}
    text = table(before, {"opsd": {"after": opsd, "train": train}, "grpo": {"after": grpo, "train": train}}, config)
    # OPSD Avg@4 changes per problem: +0.5, +0.25 -> resampled means {0.25, 0.375, 0.5}: 95% CI [25.0, 50.0]
    assert "| opsd | 50.0 -> 100.0 | 25.0 -> 62.5 | [+25.0, +50.0] |" in text
    assert "| grpo | 50.0 -> 50.0 | 25.0 -> 25.0 | [+0.0, +0.0] |" in text
    assert "OPSD - GRPO after training, greedy acc: +50.0 pts, 95% CI [+0.0, +100.0] (paired by problem)" in text


def test_change_interval_over_seeds_and_problem_scores(tmp_path):
    before = {"per_problem": {"greedy": {"a": 0.0, "b": 1.0, "c": 0.0}}}
    afters = [{"per_problem": {"greedy": {"a": 1.0, "b": 1.0, "c": 0.0}}},
              {"per_problem": {"greedy": {"c": 1.0, "a": 0.0, "b": 0.0}}}]
    interval = change_interval(before, afters, "greedy")
    assert interval == paired_bootstrap(base_SP=[0.0, 1.0, 0.0], ckpt_SP=[[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert interval.estimate == (0.5 - 0.5 + 0.5) / 3
    assert change_interval({"greedy": 0.1}, afters, "greedy") is None
    (tmp_path / "results.json").write_text(json.dumps({"per_problem": {"heldout": {"x": 0.25, "y": 1.0}}}))
    assert problem_scores(tmp_path) == {"x": 0.25, "y": 1.0}
