"""recipe.toy.compare without launching anything: launch commands, metrics reading, the table."""

import json
from pathlib import Path

import pytest

from recipe.toy.compare import ToyRunConfig, _progress, method_launch, read_step_metrics, table


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
    assert "| opsd | 25.0 -> 30.0 | 20.0 -> 25.0 | 50.0 -> 55.0 | 20.0 -> 19.0 | 2 | 100 | 3.00 | 4.00 |" in text
    assert "| grpo | 25.0 -> 20.0 |" in text
    assert "time per step 0.50 (0.67 after step 1), launch wall time 0.50" in text
