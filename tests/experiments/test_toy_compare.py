"""recipe.experiments.toy_compare without launching anything: the shared problem order and the table."""

import pytest
from omegaconf import OmegaConf

from recipe.experiments.toy_compare import run_method, table
from recipe.launch.recipes import get_recipe


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
    assert "| opsd | 25.0 -> 30.0 | 20.0 -> 25.0 | 50.0 -> 55.0 | 20.0 -> 19.0 | 2 | 100 | 3.00 | 4.00 |" in text
    assert "| grpo | 25.0 -> 20.0 |" in text
    assert "time per step 0.50 (0.67 after step 1), launch wall time 0.50" in text
