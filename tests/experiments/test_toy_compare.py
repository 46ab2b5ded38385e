"""recipe.experiments.toy_compare without launching anything: the shared problem order and the table."""

import json

import pytest
from omegaconf import OmegaConf

from recipe.evaluation.stats import paired_bootstrap
from recipe.experiments.toy_compare import run_method, table
from recipe.launch.config import get_recipe
from recipe.toy.demo import change_interval, problem_scores


def test_both_toy_presets_see_the_same_problems_in_the_same_order():
    """Same data.seed, batch and steps in the OPSD and GRPO toy presets (the parquet is the toy demo's)."""
    opsd, grpo = (OmegaConf.load(get_recipe(m).config_dir / "demo" / "toy.yaml") for m in ("opsd", "grpo"))
    opsd_seed = OmegaConf.load(get_recipe("opsd").config_dir / "opsd_trainer.yaml").data.seed
    assert grpo.data.seed == opsd_seed
    assert grpo.data.train_batch_size == opsd.data.train_batch_size
    assert grpo.trainer.total_training_steps == opsd.trainer.total_training_steps
    assert grpo.data.max_prompt_length == opsd.data.max_prompt_length


def test_unknown_method_is_refused(tmp_path):
    with pytest.raises(ValueError, match="method 'ppo'"):
        run_method("ppo", cache=tmp_path, run_dir=tmp_path / "run")


def test_table_values_and_compute_ratio():
    before = {"greedy": 0.25, "avg@4": 0.2, "pass@4": 0.5, "mean_length": 20.0, "n_problems": 256}
    results = {
        "opsd": {"after": {"greedy": 0.3, "avg@4": 0.25, "pass@4": 0.55, "mean_length": 19.0},
                 "train": {"steps": 2, "wall_time_s": 100.0, "step_times_s": [2.0, 4.0]}},
        "grpo": {"after": {"greedy": 0.2, "avg@4": 0.2, "pass@4": 0.5, "mean_length": 21.0},
                 "train": {"steps": 2, "wall_time_s": 200.0, "step_times_s": [6.0, 6.0]}},
    }
    text = table(before, results, eval_n=4)
    assert "| opsd | 25.0 -> 30.0 | 20.0 -> 25.0 | - | 50.0 -> 55.0 | 20.0 -> 19.0 | 2 | 100 | 3.00 | 4.00 |" in text
    assert "| grpo | 25.0 -> 20.0 |" in text
    assert "time per step 0.50 (0.67 after step 1), launch wall time 0.50" in text


def test_table_intervals_paired_by_problem():
    before = {"greedy": 0.5, "avg@4": 0.25, "pass@4": 0.5, "mean_length": 20.0, "n_problems": 2,
              "per_problem": {"greedy": {"p1": 0.0, "p2": 1.0}, "avg@4": {"p1": 0.0, "p2": 0.5}}}
    opsd = {**before, "greedy": 1.0, "avg@4": 0.625,
            "per_problem": {"greedy": {"p2": 1.0, "p1": 1.0}, "avg@4": {"p1": 0.5, "p2": 0.75}}}
    grpo = {**before, "per_problem": before["per_problem"]}
    train = {"steps": 1, "wall_time_s": 1.0, "step_times_s": [1.0, 1.0]}
    text = table(before, {"opsd": {"after": opsd, "train": train}, "grpo": {"after": grpo, "train": train}}, eval_n=4)
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
