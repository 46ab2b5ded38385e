"""OPSD under faults, end to end on the CPU (``bash recipe/opsd/run_opsd.sh``, tiny model, 1 rank).

- non-finite teacher (issue 21 item 2): NaN teacher hidden states at steps 2 and 3 (the test-only
  ``OPSD_TEST_NAN_TEACHER_STEPS``) with ``opsd.max_consecutive_nonfinite=2``: both updates are
  skipped and counted, the run stops at step 3 with exit code 3 and one line naming the step, and
  the checkpoint it saves there holds exactly the step-1 weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from recipe.cpu.rollout import WEIGHTS_LOG_ENV
from recipe.opsd.nonfinite import CONSECUTIVE_METRIC, SKIPPED_METRIC, TEST_NAN_TEACHER_ENV

pytestmark = pytest.mark.e2e

SCRIPT = "recipe/opsd/run_opsd.sh"


def _env(tiny_model_dir, tiny_data, ckpt_dir, **extra):
    return {
        "DEVICE": "cpu",
        "MODEL_PATH": str(tiny_model_dir),
        "TRAIN_FILES": str(tiny_data["train"]),
        "VAL_FILES": str(tiny_data["val"]),
        "CKPT_DIR": str(ckpt_dir),
        WEIGHTS_LOG_ENV: str(ckpt_dir.parent / "rollout_weights.jsonl"),
        **extra,
    }


def test_nonfinite_teacher_skips_updates_and_stops(run_cpu_verl, fsdp_state_dict, tiny_model_dir, tiny_data, tmp_path):
    ckpt = tmp_path / "ckpt"
    run = run_cpu_verl(
        SCRIPT,
        ["trainer.save_freq=1", "opsd.max_consecutive_nonfinite=2"],
        workdir=tmp_path / "launch",
        env=_env(tiny_model_dir, tiny_data, ckpt, STEPS="4", **{TEST_NAN_TEACHER_ENV: "2,3"}),
        script=True,
        timeout=300,
    )
    assert run.returncode == 3, run.tail()
    assert sorted(run.metrics) == [1, 2, 3], "the guard must stop the run at step 3, before step 4"
    first, second, third = (run.metrics[s] for s in (1, 2, 3))
    assert (first[SKIPPED_METRIC], first[CONSECUTIVE_METRIC]) == (0.0, 0.0)
    assert math.isfinite(first["actor/loss"]) and math.isfinite(first["actor/grad_norm"])
    assert (second[SKIPPED_METRIC], second[CONSECUTIVE_METRIC]) == (1.0, 1.0)
    assert (third[SKIPPED_METRIC], third[CONSECUTIVE_METRIC]) == (1.0, 2.0)
    for metrics in (second, third):
        assert not math.isfinite(metrics["actor/loss"]) and not math.isfinite(metrics["actor/grad_norm"])
    # one line naming the step, as the last thing the run prints
    assert "[opsd] stopped: step 3: 2 consecutive steps with a non-finite loss or gradient norm" in run.log, run.tail()
    assert "the checkpoint global_step_3 holds the weights of step 1" in run.log, run.tail()
    # the skipped updates changed nothing: the stop checkpoint is the last good state
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    step1, step3 = (fsdp_state_dict(ckpt / f"global_step_{s}" / "actor") for s in (1, 3))
    initial = _initial_state_dict(tiny_model_dir)
    assert step1.keys() == step3.keys()
    assert all(torch.equal(step1[name], step3[name]) for name in step1)
    assert any(not torch.equal(step1[name], initial[name].reshape(step1[name].shape)) for name in step1 if name in initial)


def _initial_state_dict(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
