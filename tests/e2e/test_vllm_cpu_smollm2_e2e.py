"""SmolLM2-135M-Instruct, OPSD and GRPO 2 steps each, through verl's vLLM rollout server (vllm-cpu).

The GPU user's rollout path (verl's vLLM async server, its bucketed weight push, the agent loop) on a
real pretrained model: Llama architecture, tied embeddings, vocabulary 49,152, head_dim 64. Launched
as a user does (docs/vllm_cpu.md)::

    CPU_ROLLOUT=vllm CPU_DEMO=tiny STEPS=2 MODEL_PATH=<smollm2> bash recipe/opsd/run_opsd.sh \\
        actor_rollout_ref.rollout.dtype=float32 opsd.student_mode=native opsd.teacher_mode=native

After every weight push (start-up, then each step) the rollout's log-probs of its own samples equal a
float32 forward of the trainer's pushed weights (the weight-sync probe of ``scripts/gpu_check.py``:
``recipe.rollout.sync_check``), and each update moves them by
far more than that tolerance (so a stale rollout would fail). GRPO's reward is the digit reward of
test_vllm_cpu_e2e.py (the grader gives the demo's toy problems 0 everywhere: no advantage, no update).
Skipped like test_vllm_cpu_e2e.py without the vLLM-CPU venv, and without the SmolLM2 wheel.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_cpu]

REPO_ROOT = Path(__file__).resolve().parents[2]
# vLLM-CPU float32 vs a float32 HF forward on SmolLM2: measured <= 3.1e-5 (oneDNN's GEMMs; docs/vllm_cpu.md).
SYNC_TOLERANCE = 1e-4
MIN_UPDATE_EFFECT = 10 * SYNC_TOLERANCE
SCRIPTS = {"opsd": "recipe/opsd/run_opsd.sh", "grpo": "recipe/grpo_baseline/run_grpo.sh"}
# per recipe: OPSD's modes for a template without a thinking switch; GRPO's reward with a nonzero advantage
ARGS = {"opsd": ["opsd.student_mode=native", "opsd.teacher_mode=native"],
        "grpo": [f"reward.custom_reward_function.path={Path(__file__).with_name('digit_reward.py')}"]}


@pytest.fixture(scope="module")
def vllm_venv():
    # as test_vllm_cpu_e2e.py: OPSD_VLLM_VENV, else the launcher's default
    cache = os.environ.get("OPSD_CACHE") or str(Path.home() / ".cache" / "opsd-verl")
    venv = Path(os.environ.get("OPSD_VLLM_VENV", Path(cache) / "venv_vllm_cpu"))
    if not (venv / ".opsd_vllm_cpu_ok").is_file():
        pytest.skip(f"no vLLM-CPU venv at {venv}: build it with `bash recipe/cpu/vllm_cpu_venv.sh {venv}`")
    return venv


@pytest.mark.parametrize("recipe", ["opsd", "grpo"])
def test_smollm2_two_steps_rollout_serves_the_trainers_weights(vllm_venv, smollm2_dir, run_cpu_verl, tmp_path, recipe):
    from recipe.launch.gpu_check import probe_environment

    probe_log = tmp_path / "probe.jsonl"
    # the first-hour GPU check's probe (the product module recipe.rollout.sync_check), as gpu_check turns it on
    env = {"DEVICE": "cpu", "CPU_ROLLOUT": "vllm", "VLLM_VENV": str(vllm_venv), "CPU_DEMO": "tiny",
           "MODEL_PATH": str(smollm2_dir), "STEPS": "2", "OPSD_CACHE": str(tmp_path / "cache"),
           "CKPT_DIR": str(tmp_path / "ckpt"), **probe_environment(probe_log)}
    args = ["actor_rollout_ref.rollout.dtype=float32", "trainer.save_freq=-1", *ARGS[recipe]]
    start = time.monotonic()
    run = run_cpu_verl(SCRIPTS[recipe], args, workdir=tmp_path, env=env, script=True, timeout=600)
    wall_s = time.monotonic() - start
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    probe = [json.loads(line) for line in probe_log.read_text().splitlines() if line.strip()] if probe_log.exists() else []
    assert [record["global_steps"] for record in probe] == [0, 1, 2], run.tail()
    for record in probe:
        assert record["max_abs_logprob_diff"] < SYNC_TOLERANCE, record
    for record in probe[1:]:
        assert record["update_max_abs_logprob_diff"] > MIN_UPDATE_EFFECT, record
    steps = {step: round(run.metrics[step]["timing_s/step"], 1) for step in (1, 2)}
    diffs = [f"{record['max_abs_logprob_diff']:.1e}" for record in probe]
    print(f"[vllm_cpu] smollm2 {recipe}: wall {wall_s:.0f} s, timing_s/step {steps}, probe {diffs}")
