"""GRPO end to end on the CPU: ``bash recipe/grpo_baseline/run_grpo.sh`` on the tiny model.

One 2-step run on 2 ranks (``CPU_NUM_RANKS=2``, as in run_grpo.sh's header) of ``python -m
verl.trainer.main_ppo`` (Ray, FSDP2 over gloo, a batched HF rollout server per rank, the shared
grader as the custom reward, the paper's GRPO yaml with CPU-size overrides) checks: the run finishes
and checkpoints; the per-step metrics and timings the compute tables read are in the file logger's
jsonl and the wall time in run_times.jsonl; and after every step the rollout server serves exactly
the trainer's weights (sha256 of each float32 tensor, logged by the server, against the FSDP
checkpoint of step 2).
"""

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = "recipe/grpo_baseline/run_grpo.sh"

# What the OPSD-vs-GRPO compute table and the GRPO curves read from the metrics jsonl.
LOGGED = (
    "timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/update_weights", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
    "actor/pg_clipfrac", "critic/score/mean", "critic/advantages/mean", "response_length/mean",
    "training/global_step",
)


def test_two_step_grpo_run_through_run_grpo_sh(run_cpu_verl, check_rollout_weights, tiny_run_env, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    weights_log = tmp_path / "rollout_weights.jsonl"
    run = run_cpu_verl(
        SCRIPT,
        [],
        workdir=tmp_path,
        env=tiny_run_env(ckpt_dir, weights_log, STEPS="2", CPU_NUM_RANKS="2"),
        script=True,
        timeout=300,
    )
    assert run.returncode == 0, run.tail()

    # Metrics and timings per step in the file logger's jsonl (the path run_grpo.sh exports).
    assert sorted(run.metrics) == [1, 2], run.tail()
    for step in (1, 2):
        metrics = run.metrics[step]
        missing = [key for key in LOGGED if key not in metrics]
        assert not missing, f"step {step} misses {missing}"
        assert metrics["timing_s/step"] > metrics["timing_s/gen"] > 0
        assert all(math.isfinite(metrics[key]) for key in LOGGED)
        # The shared grader scores in [0, 1]; the random tiny model writes no boxed answer.
        assert 0.0 <= metrics["critic/score/mean"] <= 1.0
        assert 1 <= metrics["response_length/mean"] <= 32
    wall = [json.loads(line) for line in (ckpt_dir / "run_times.jsonl").read_text().splitlines()]
    assert wall[-1]["recipe"] == "grpo" and wall[-1]["exit_code"] == 0 and wall[-1]["n_devices"] == 2
    assert wall[-1]["wall_time_s"] >= run.metrics[2]["timing_s/step"]
    assert Path(wall[-1]["metrics"]) == run.metrics_path
    # the rows it trained on, in order (recipe.launch.data_order): 2 steps x the demo's batch of 4
    order = json.loads(Path(wall[-1]["data_order"]).read_text())
    assert order["rows"] == 8 and len(order["order_sha256"]) == 64 and order["filter_overlong_prompts"] is False
    assert Path(wall[-1]["config"]).is_file()

    # Weight sync: each replica loaded the trainer's weights at start-up (step 0) and after each step.
    replicas = check_rollout_weights(weights_log, ckpt_dir, expected_steps=[0, 1, 2])
    assert sorted(replicas) == [0, 1]
    served = replicas[0]
    # ...and the trainer really moved them (else the comparison could not fail).
    initial, served = served[0], served[2]
    assert sum(initial[name] != served[name] for name in served) >= len(served) // 2
