"""OPSD under faults, end to end on the CPU (``bash recipe/opsd/run_opsd.sh``, tiny model, 1 rank).

One launch pair (the CI budget: each launch costs ~1 min of start-up), both faults in it, the same
command twice: 6 steps, a checkpoint every 2, ``opsd.diagnostics.dump_steps=true``, fingerprints logged,
``opsd.diagnostics.max_consecutive_nonfinite=2`` and NaN teacher hidden states at steps 4 and 5 (the test hook
``opsd_test_hooks.opsd_faults``).

- kill -9 during a checkpoint save and step dumps: every
  process of the first launch (launcher, trainer, Ray daemons and workers) is SIGKILLed at once
  inside the step-4 save, after the model shards and before data.pt and the tracker (the same hook's
  ``OPSD_TEST_PAUSE_IN_SAVE_STEP``). The same command again resumes from the step-2 save,
  replays step 3 on the same batch (marked: ``training/resumed_from_step`` = 2) and finishes step 4
  into the partial directory; the two metrics files together hold steps 1-5, each once. Dumped
  steps 1 (first launch) and 3 (second launch) re-scored on the CPU by ``recipe.analysis.replay``
  give the logged ``opsd/*`` diagnostics of those steps. The frozen teacher has the same
  fingerprint at every step of both launches.
- non-finite teacher, in the second launch: the updates of steps 4 and 5 are
  skipped and counted, the run stops at step 5 (not a save step) with exit code 3 and one line
  naming the step, and the checkpoints of steps 4 and 5 hold exactly the step-3 weights.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from pathlib import Path

from recipe.common.checkpoints import check_resumable
from recipe.launch.processes import kill_marked
from opsd_test_hooks.opsd_faults import NAN_TEACHER_ENV, PAUSE_IN_SAVE_ENV, PAUSE_MARKER
from recipe.opsd.core.nonfinite import CONSECUTIVE_METRIC, SKIPPED_METRIC
from tests.e2e.conftest import bound

pytestmark = pytest.mark.e2e

SCRIPT = "recipe/opsd/run_opsd.sh"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _read_metrics(path):
    """verl's file logger lines ``{"step": s, "data": {...}}`` -> ``{step: data}``: one training record per
    step (a repeated step fails); a launch's pre-flight record (``preflight/...`` only, logged with its
    first step) is merged into that step."""
    metrics = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        step, data = record["step"], record["data"]
        seen = metrics.setdefault(step, {})
        training_seen = any(not key.startswith("preflight/") for key in seen)
        preflight_only = all(key.startswith("preflight/") for key in data)
        assert not (set(data) & set(seen)) and (preflight_only or not training_seen), f"step {step} logged twice in {path}"
        seen.update(data)
    return metrics


def _finite(value):
    return value is not None and math.isfinite(value)


KILL_ARGS = ["trainer.save_freq=2", "opsd.diagnostics.dump_steps=true", "trainer.log_fingerprints=true",
             "opsd.diagnostics.max_consecutive_nonfinite=2"]
STEPS = 6  # never reached: the guard stops the second launch at step 5
NAN_TEACHER_STEPS = "4,5"


MARK = "OPSD_TEST_LAUNCH_ID"


def _kill_run(workdir) -> None:
    """SIGKILL every process of the run at once, as a job scheduler does: the launcher, the trainer
    (its own session) and Ray's daemons and workers (their own process groups), found by the mark in
    their environment (``recipe.launch.processes``)."""
    left = kill_marked(variable=MARK, value=str(workdir))
    assert not left, f"processes of the killed run still alive: {left}"


def _launch_and_kill_in_save(env, workdir, *, timeout=300):
    """``bash run_opsd.sh KILL_ARGS``, every process of it SIGKILLed as soon as it reports the test
    pause inside the step-4 save."""
    workdir.mkdir(parents=True)
    log_path = workdir / "run.log"
    full_env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(workdir / "metrics.jsonl"), "RAY_DEDUP_LOGS": "0",
                "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1", **env, PAUSE_IN_SAVE_ENV: "4",
                MARK: str(workdir)}
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(["bash", str(REPO_ROOT / SCRIPT), *KILL_ARGS], cwd=REPO_ROOT, env=full_env,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + bound(timeout)
        try:
            while PAUSE_MARKER not in log_path.read_text(errors="replace"):
                assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
                assert time.monotonic() < deadline, "the run never reached the step-4 save"
                time.sleep(0.2)
        finally:
            _kill_run(workdir)
            proc.wait()
    return _read_metrics(workdir / "metrics.jsonl"), log_path.read_text(errors="replace")


def _hf_model(model_dir, state=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        model.tie_weights()
    return model


@pytest.fixture(scope="module")
def killed_and_resumed(run_cpu_verl, tiny_run_env, tmp_path_factory):
    """``(ckpt, first, first_log, second)``: the launch SIGKILLed inside the step-4 save (its metrics
    and log) and the same command again (a ``VerlRun``)."""
    root = tmp_path_factory.mktemp("opsd_faults")
    ckpt = root / "ckpt"
    env = tiny_run_env(ckpt, hooks=("opsd_test_hooks.opsd_faults",), STEPS=str(STEPS), **{NAN_TEACHER_ENV: NAN_TEACHER_STEPS})
    first, first_log = _launch_and_kill_in_save(env, root / "launch1")
    # killed inside the step-4 save: its shards are there, data.pt and the tracker are not
    assert sorted(first) == [1, 2, 3], first_log[-4000:]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert list((ckpt / "global_step_4" / "actor").glob("model_world_size_1_rank_0.pt"))
    assert not (ckpt / "global_step_4" / "data.pt").exists()
    second = run_cpu_verl(SCRIPT, KILL_ARGS, workdir=root / "launch2", env=env, script=True, timeout=300)
    return ckpt, first, first_log, second


def test_kill_during_save_resumes_from_the_last_whole_save(killed_and_resumed, fsdp_state_dict, tiny_model_dir):
    from recipe.analysis.replay import rescore_step
    from recipe.opsd.core.step_dump import dump_path, read_step_dump

    ckpt, first, first_log, second = killed_and_resumed
    # exit 3: the non-finite guard's stop at step 5 (test_nonfinite_teacher_skips_updates_and_stops)
    assert second.returncode == 3, second.tail()
    verl_log = (ckpt / "train.log").read_text(errors="replace")  # the launcher's copy of verl's output
    assert f"Resuming from {ckpt / 'global_step_2'}" in verl_log, second.tail()
    assert sorted(second.metrics) == [3, 4, 5]
    # every step once, the replayed step 3 marked: the later launch resumed from step 2 < 3
    assert [first[s]["training/resumed_from_step"] for s in (1, 2, 3)] == [0, 0, 0]
    assert [second.metrics[s]["training/resumed_from_step"] for s in (3, 4, 5)] == [2, 2, 2]
    assert sorted(set(first) | set(second.metrics)) == [1, 2, 3, 4, 5]
    # the replayed step trains on the batch the killed launch saw (the dataloader state of step 2)
    assert first[3]["training/data_index_sum"] == second.metrics[3]["training/data_index_sum"]
    # step 4 finished into the directory the kill left partial
    check_resumable(ckpt / "global_step_4")
    # The frozen teacher (the default) scores every step with the same weights, also after the resume
    # (the reference copy is loaded from the model path again, not from the checkpoint). Asserted here
    # since the resume test of test_opsd_e2e.py runs an EMA teacher (one launch pair for both).
    fingerprints = [(m["opsd/teacher_param_checksum"], m["opsd/teacher_param_sqsum"])
                    for m in (first[1], first[2], first[3], *second.metrics.values())]
    assert len(set(fingerprints)) == 1, fingerprints

    # step dumps re-scored on the CPU give the logged diagnostics: step 1 (student = teacher = the
    # initial model), step 3 of the second launch (student = the step-2 checkpoint)
    teacher = _hf_model(tiny_model_dir)
    step2 = _hf_model(tiny_model_dir, fsdp_state_dict(ckpt / "global_step_2" / "actor"))
    for step, student, logged in ((1, teacher, first[1]), (3, step2, second.metrics[3])):
        dump = read_step_dump(dump_path(ckpt, step))
        assert dump["step"] == step and len(dump["rows"]["response_ids"]) == 4
        rescored = rescore_step(dump, student=student, teacher=teacher)
        for name in ("opsd/student_entropy", "opsd/teacher_entropy"):
            assert rescored[name] == pytest.approx(logged[name], rel=1e-5), (step, name)
        # the divergence of near-identical distributions (~5e-4 nats here) cancels to ~1e-6 in float32
        for name in ("opsd/fwd_kl", "opsd/clipped_teacher_mass"):
            assert rescored[name] == pytest.approx(logged[name], abs=1e-5), (step, name)
        # shares of tokens: on the random tiny model the teacher ~ the student, many advantages and
        # top-1 margins are ~0 and their sign falls either way under float32 rounding (packed vs
        # padded forward); measured 2026-11-23: up to 3 of 128 tokens
        for name in ("opsd/top1_agree", "opsd/clip_frac", "opsd/enc_frac", "opsd/disc_frac"):
            assert rescored[name] == pytest.approx(logged[name], abs=0.05), (step, name)
    assert json.loads(json.dumps(dump["loss_config"]))["clip_tau"] == 0.05


def test_nonfinite_teacher_skips_updates_and_stops(killed_and_resumed, fsdp_state_dict, tiny_initial_state):
    """The second launch: NaN teacher hidden states at steps 4 and 5, at most 2 in a row."""
    ckpt, _, _, run = killed_and_resumed
    assert run.returncode == 3, run.tail()
    assert sorted(run.metrics) == [3, 4, 5], "the guard must stop the run at step 5, before step 6"
    good, fourth, fifth = (run.metrics[s] for s in (3, 4, 5))
    assert (good[SKIPPED_METRIC], good[CONSECUTIVE_METRIC]) == (0.0, 0.0)
    assert math.isfinite(good["actor/loss"]) and math.isfinite(good["actor/grad_norm"])
    assert (fourth[SKIPPED_METRIC], fourth[CONSECUTIVE_METRIC]) == (1.0, 1.0)
    assert (fifth[SKIPPED_METRIC], fifth[CONSECUTIVE_METRIC]) == (1.0, 2.0)
    for metrics in (fourth, fifth):  # verl's file logger writes NaN as null
        assert not _finite(metrics["actor/loss"]) and not _finite(metrics["actor/grad_norm"])
    # one line naming the step, as the last thing the run prints
    assert "[opsd] stopped: step 5: 2 consecutive steps with a non-finite loss or gradient norm" in run.log, run.tail()
    assert "the checkpoint global_step_5 holds the weights of step 3" in run.log, run.tail()
    # the skipped updates changed nothing: the stop checkpoint (step 5 is no save_freq step) and the
    # step-4 one are the last good state, the step-3 update (the actor's fingerprints after steps 3-5)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "5"
    step2, step4, step5 = (fsdp_state_dict(ckpt / f"global_step_{s}" / "actor") for s in (2, 4, 5))
    assert step4.keys() == step5.keys() == step2.keys()
    assert all(torch.equal(step4[name], step5[name]) for name in step4)
    actor = [(m["opsd/actor_param_checksum"], m["opsd/actor_param_sqsum"]) for m in (good, fourth, fifth)]
    assert len(set(actor)) == 1, actor
    # ... and that state trained: it is neither the step-2 checkpoint nor the initial model
    assert any(not torch.equal(step2[name], step5[name]) for name in step5)
    initial = tiny_initial_state
    assert any(not torch.equal(step5[name], initial[name].reshape(step5[name].shape)) for name in step5 if name in initial)
