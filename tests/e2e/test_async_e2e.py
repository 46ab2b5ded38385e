"""Rollouts that overlap training, end to end on the CPU (tiny model, 2 steps, 1 training rank + 1 rollout).

Launches (each ~1-1.5 min; all of them two at a time, ``async_runs``):

- ``sync``: the synchronous OPSD trainer, greedy rollouts (top-k 1: samples independent of how the
  rollout server batches requests), the reference of the step-1 loss;
- ``fully_s0``: OPSD on verl's fully-async trainer at ``staleness_threshold=0``, greedy: the step-1
  loss equals the synchronous one within float tolerance and every sample has lag 0;
- ``one_step_off``: OPSD on verl's one-step-off trainer, greedy: the same step-1 loss; the step-2
  samples have lag exactly 1; the rollout served exactly the pushed weights (versions 0, 0, 1);
- ``fully_s1`` (OPSD, staleness 1, 4 steps): SIGKILLed right after its step-2 checkpoint, then the
  same command resumes from step 2 and finishes; every lag is 0 or 1 and some is 1;
- ``one_step_off_pg``: the sampled-token objective on the one-step-off trainer, sampling from the full
  vocabulary (top-k / top-p off) at a large learning rate: pS_old is the rollout's log-probs, so at step 1
  (lag 0) the ratios are 1 up to the two engines' numerics and at step 2 (lag 1) they are off 1 and the
  PPO clip acts;
- ``grpo_one_step_off`` / ``grpo_fully_s1``: the GRPO baseline on both async trainers, 2 steps: lag 1
  at step 2 and the gap to the behaviour policy (verl's ``rollout_corr/*``) logged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipe.launch.processes import kill_marked
from tests.e2e.conftest import bound

pytestmark = pytest.mark.e2e

OPSD, GRPO = "recipe/opsd/run_opsd.sh", "recipe/grpo_baseline/run_grpo.sh"
REPO_ROOT = Path(__file__).resolve().parents[2]
GREEDY = ["actor_rollout_ref.rollout.top_k=1"]
ONE_STEP_OFF, FULLY = "+experiment=async_one_step_off", "+experiment=async_fully"
LAG_KEYS = ("async/lag_mean", "async/lag_min", "async/lag_max", "async/policy_version")
MARK = "OPSD_TEST_LAUNCH_ID"
STALE_PG = ["opsd.loss.objective=sampled_token", "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.rollout.top_p=1.0",
            "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0"]


def _launch(name, script, args, *, root, tiny_run_env, steps=2):
    return {"target": script, "args": args, "workdir": root / name, "script": True, "timeout": 400,
            "env": tiny_run_env(root / name / "ckpt", root / name / "weights.jsonl", STEPS=str(steps))}


@pytest.fixture(scope="module")
def async_runs(run_cpu_verl, run_cpu_verl_side_by_side, tiny_run_env, tmp_path_factory):
    """Every launch of this file, two at a time: the killed-and-resumed pair (two launches one after the
    other) in one slot first, the single launches in the order given in the other."""
    root = tmp_path_factory.mktemp("async")
    grpo = root / "grpo"
    return root, run_cpu_verl_side_by_side({
        "killed_and_resumed": lambda: _kill_and_resume(run_cpu_verl, tiny_run_env, root / "resume"),
        "sync": _launch("sync", OPSD, GREEDY, root=root, tiny_run_env=tiny_run_env),
        "fully_s0": _launch("fully_s0", OPSD, [FULLY, "async_training.staleness_threshold=0", *GREEDY], root=root,
                            tiny_run_env=tiny_run_env),
        "one_step_off": _launch("one_step_off", OPSD, [ONE_STEP_OFF, "trainer.save_freq=1", *GREEDY], root=root,
                                tiny_run_env=tiny_run_env),
        "one_step_off_pg": _launch("one_step_off_pg", OPSD, [ONE_STEP_OFF, *STALE_PG], root=root,
                                   tiny_run_env=tiny_run_env),
        "grpo_one_step_off": _launch("one_step_off", GRPO, [ONE_STEP_OFF], root=grpo, tiny_run_env=tiny_run_env),
        "grpo_fully_s1": _launch("fully_s1", GRPO, [FULLY, "async_training.staleness_threshold=1"], root=grpo,
                                 tiny_run_env=tiny_run_env),
    })


@pytest.fixture(scope="module")
def opsd_runs(async_runs):
    root, runs = async_runs
    return root, {name: runs[name] for name in ("sync", "fully_s0", "one_step_off")}


@pytest.mark.parametrize("name", ["fully_s0", "one_step_off"])
def test_staleness_zero_step_one_loss_equals_the_synchronous_one(opsd_runs, name):
    _, runs = opsd_runs
    for run_name in ("sync", name):
        assert runs[run_name].returncode == 0, runs[run_name].tail()
        assert sorted(step for step, m in runs[run_name].metrics.items() if "opsd/loss" in m) == [1, 2]
    sync, other = runs["sync"].metrics[1], runs[name].metrics[1]
    # the same greedy samples of the same 4 prompts, scored by the same initial weights and teacher
    assert other["opsd/loss_tokens"] == sync["opsd/loss_tokens"]
    assert other["opsd/loss"] == pytest.approx(sync["opsd/loss"], rel=1e-5, abs=1e-9)
    assert other["opsd/fwd_kl"] == pytest.approx(sync["opsd/fwd_kl"], rel=1e-5, abs=1e-9)
    assert other["async/lag_max"] == 0 and other["async/policy_version"] == 0


def test_staleness_zero_stays_on_policy_and_one_step_off_lags_exactly_one(opsd_runs, check_rollout_weights,
                                                                         tiny_initial_state):
    root, runs = opsd_runs
    fully, one_step_off = runs["fully_s0"].metrics[2], runs["one_step_off"].metrics[2]
    assert fully["async/lag_max"] == fully["async/lag_min"] == 0 and fully["async/policy_version"] == 1
    assert one_step_off["async/lag_min"] == one_step_off["async/lag_max"] == 1
    assert one_step_off["async/policy_version"] == 1 and one_step_off["async/stale_frac"] == 1
    # one-step-off pushes before each step: version 0 at start and step 1, version 1 at step 2; the
    # rollout served exactly the trainer's weights of each version (step 1's against its checkpoint)
    check_rollout_weights(root / "one_step_off" / "weights.jsonl", root / "one_step_off" / "ckpt",
                          expected_steps=[0, 0, 1], initial=tiny_initial_state)
    # fully-async pushes after each step: 0 (start), 1, 2
    check_rollout_weights(root / "fully_s0" / "weights.jsonl", root / "fully_s0" / "ckpt", expected_steps=[0, 1, 2],
                          initial=tiny_initial_state)


def test_stale_samples_take_the_rollouts_log_probs_and_the_clip_acts(async_runs):
    _, runs = async_runs
    run = runs["one_step_off_pg"]
    assert run.returncode == 0, run.tail()
    fresh, stale = run.metrics[1], run.metrics[2]
    assert fresh["async/lag_max"] == 0 and stale["async/lag_min"] == 1
    # the weights that sampled step 1 are the trainer's: the rollout's log-probs are the update's own up to numerics
    assert abs(fresh["opsd/pg_ratio"] - 1) < 1e-5 and fresh["opsd/pg_clip_frac"] == 0, fresh
    # step 2 trains on samples of the weights before step 1's update: over 5% of its ratios lie outside the clip
    # range 1 -/+ eps (their mean is no test: they scatter both ways and average close to 1)
    assert stale["opsd/pg_clip_frac"] > 0.05, stale


def _launch_and_kill_after_save(job, *, save_step, timeout=400):
    """``bash <script> <args>``, every process of it SIGKILLed once ``latest_checkpointed_iteration.txt``
    names ``save_step`` (the whole save is on disk)."""
    workdir, env = Path(job["workdir"]), dict(job["env"])
    workdir.mkdir(parents=True)
    tracker = Path(env["CKPT_DIR"]) / "latest_checkpointed_iteration.txt"
    full_env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(workdir / "metrics.jsonl"), "RAY_DEDUP_LOGS": "0",
                "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1", **env, MARK: str(workdir)}
    log_path = workdir / "run.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(["bash", str(REPO_ROOT / job["target"]), *job["args"]], cwd=REPO_ROOT, env=full_env,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + bound(timeout)
        try:
            while not (tracker.exists() and tracker.read_text().strip() == str(save_step)):
                assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
                assert time.monotonic() < deadline, f"the run never saved step {save_step}"
                time.sleep(0.2)
        finally:
            left = kill_marked(variable=MARK, value=str(workdir))
            proc.wait()
    assert not left, f"processes of the killed run still alive: {left}"
    return _metrics(workdir / "metrics.jsonl")


def _metrics(path: Path) -> dict[int, dict]:
    """verl's file logger lines -> ``{step: merged metrics}``."""
    merged: dict[int, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        merged.setdefault(int(record["step"]), {}).update(record["data"])
    return merged


def _kill_and_resume(run_cpu_verl, tiny_run_env, root: Path):
    args = [FULLY, "async_training.staleness_threshold=1", "trainer.save_freq=2"]
    first = _launch_and_kill_after_save(
        {**_launch("launch1", OPSD, args, root=root, tiny_run_env=tiny_run_env, steps=4),
         "env": tiny_run_env(root / "ckpt", root / "weights.jsonl", STEPS="4")}, save_step=2)
    second = run_cpu_verl(OPSD, args, workdir=root / "launch2", script=True, timeout=400,
                          env=tiny_run_env(root / "ckpt", root / "weights.jsonl", STEPS="4"))
    return root, first, second


@pytest.fixture(scope="module")
def killed_and_resumed(async_runs):
    return async_runs[1]["killed_and_resumed"]


def test_a_killed_fully_async_run_resumes_from_its_last_save(killed_and_resumed):
    root, first, second = killed_and_resumed
    assert second.returncode == 0, second.tail()
    assert {1, 2} <= {step for step, m in first.items() if "opsd/loss" in m}
    resumed = sorted(step for step, m in second.metrics.items() if "opsd/loss" in m)
    assert resumed == [3, 4], second.tail()
    assert all(second.metrics[step]["training/resumed_from_step"] == 2 for step in resumed)
    assert (root / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    # staleness 1: every sample at most one version old, and the rollout ran ahead at least once
    lags = [m["async/lag_max"] for m in [*first.values(), *second.metrics.values()] if "async/lag_max" in m]
    assert len(lags) >= 4 and max(lags) == 1 and min(lags) >= 0
    assert all(second.metrics[step]["async/policy_version"] == step - 1 for step in resumed)


@pytest.fixture(scope="module")
def grpo_runs(async_runs):
    return {name: async_runs[1][f"grpo_{name}"] for name in ("one_step_off", "fully_s1")}


@pytest.mark.parametrize("name", ["one_step_off", "fully_s1"])
def test_grpo_on_the_async_trainers(grpo_runs, name):
    run = grpo_runs[name]
    assert run.returncode == 0, run.tail()
    steps = sorted(step for step, m in run.metrics.items() if "actor/pg_loss" in m)
    assert steps == [1, 2], run.tail()
    first, second = run.metrics[1], run.metrics[2]
    assert first["async/lag_max"] == 0
    assert second["async/lag_max"] <= 1 and (name == "fully_s1" or second["async/lag_min"] == 1)
    # decoupled PPO: old log-probs recomputed by the trainer (on-policy step 1: ratio 1); the gap between the
    # behaviour policy and the trainer's weights logged by verl's rollout-correction metrics
    assert all(key in second for key in ("actor/ppo_kl", "actor/pg_clipfrac", "rollout_corr/kl", *LAG_KEYS)), sorted(second)
    assert abs(first["actor/ppo_kl"]) < 1e-3
