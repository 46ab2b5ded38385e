"""CPU demo ``real`` (recipe.toy.real_demo): SmolLM2 + three-operand one-digit sums, its presets and evaluation rows.

The plan tests locate the SmolLM2 directory without building it (the wheel's GGUF is hashed), so
they need the wheel (skipped without it; CI installs it). The learning itself is measured, not
tested: docs/real_model.md §4.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from recipe.common.prompts import student_messages
from recipe.launch.demos import get_demo
from recipe.launch.recipes import get_recipe
from recipe.launch.run import plan
from recipe.launch.settings import Settings
from recipe.toy.real_demo import REAL_TASK, display_real, greedy_preset, task_dir, write_real_data
from recipe.toy.task import TaskConfig
from tests.conftest import requires_smollm2


def real_plan(recipe, tmp_path, argv=(), **settings):
    settings = Settings(device="cpu", cache_dir=str(tmp_path), cpu_demo="real", **settings)
    build = get_demo("real").load()(recipe, settings, build=False)
    return plan(get_recipe(recipe), settings, list(argv), demo=build.inputs, environ={}), build


@requires_smollm2
@pytest.mark.parametrize("recipe", ["opsd", "grpo"])
def test_real_demo_plans_smollm2_with_native_modes_and_the_same_problems(recipe, tmp_path):
    from recipe.models.smollm2 import expected_dir

    launch, build = real_plan(recipe, tmp_path)
    cfg = launch.config
    assert cfg.actor_rollout_ref.model.path == str(expected_dir(cache_dir=tmp_path))
    assert cfg.data.train_files == str(task_dir(tmp_path) / "train.parquet")
    assert (cfg.trainer.total_training_steps, cfg.data.train_batch_size, cfg.data.max_response_length) == (16, 8, 128)
    assert cfg.data.seed == 42 and cfg.actor_rollout_ref.actor.optim.lr == 1.0e-5
    assert cfg.actor_rollout_ref.rollout.name == "hf" and cfg.trainer.resume_mode == "disable"
    assert str(launch.ckpt_dir).startswith(str(tmp_path / "real_runs"))
    if recipe == "opsd":
        assert (cfg.opsd.student_mode, cfg.opsd.teacher_mode) == (None, None)
        assert cfg.opsd.loss.clip_tau == 0.05 and cfg.opsd.teacher_context == "full_solution"
    else:
        assert cfg.actor_rollout_ref.rollout.n == 4 and not cfg.data.apply_chat_template_kwargs
    assert build.evaluate is not None and build.before_dir.parent == task_dir(tmp_path) / "eval_before"
    assert not any(tmp_path.iterdir())  # build=False: nothing made


def test_a_given_model_is_used_and_not_located(tmp_path):
    launch, build = real_plan("opsd", tmp_path, model_path="/my/model")
    assert launch.config.actor_rollout_ref.model.path == "/my/model" and build.before_dir is None


def test_sft_has_no_real_demo(tmp_path):
    with pytest.raises(ValueError, match="CPU_DEMO=real is an OPSD / GRPO demo"):
        get_demo("real").load()("sft", Settings(device="cpu", cache_dir=str(tmp_path), cpu_demo="real"), build=False)


def test_data_are_the_task_s_rows_written_once(tmp_path):
    task = TaskConfig(num_operands=3, digits=1, n_train=8, n_heldout=4, seed=0)
    paths = write_real_data(tmp_path, task)
    train, val = pd.read_parquet(paths["train"]), pd.read_parquet(paths["val"])
    heldout = [json.loads(line) for line in paths["heldout"].read_text().splitlines()]
    assert (len(train), len(val), len(heldout)) == (8, 4, 4)
    first = train.iloc[0]
    assert list(first["prompt"]) == student_messages(first["extra_info"]["problem"])
    assert first["extra_info"]["problem"].count("+") == 2 and "\\boxed{" in first["extra_info"]["solution"]
    assert [row["problem"] for row in heldout] == list(val["extra_info"].map(lambda e: e["problem"]))
    stamp = paths["train"].stat().st_mtime_ns
    assert write_real_data(tmp_path, task) == paths and paths["train"].stat().st_mtime_ns == stamp
    assert task_dir(tmp_path, REAL_TASK) != task_dir(tmp_path, task)


def test_evaluation_is_greedy_native_at_the_training_cap_and_displayed_in_percent():
    preset = greedy_preset()
    assert (preset.mode, preset.top_k, preset.max_new_tokens, preset.engine) == (None, 1, 128, "hf")
    rows = display_real({"greedy": 0.25, "boxed_rate": 0.5, "mean_length": 40.25, "n_problems": 64, "eval_s": 3.0})
    assert rows == {"greedy accuracy (%), 64 problems": "25.0", "boxed rate (%)": "50.0",
                    "mean length (tokens)": "40.2"}
