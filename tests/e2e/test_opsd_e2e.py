"""OPSD end to end on the CPU through ``bash recipe/opsd/run_opsd.sh`` (the product path), tiny model.

Ray, FSDP2 over gloo, the batched HF rollout server, the frozen teacher in verl's reference slot
(run next to the actor's update, on the workers), the fused loss in the actor, checkpoints and
resume. Six training launches and seven failing ones (before Ray starts). Each training launch
costs ~1 min of CI on 2 cores, mostly start-up: a new check goes into an existing launch (the
module-scoped fixtures ``one_rank_run`` / ``one_rank_resumed`` are read by three tests) unless it
needs a configuration no launch has. The 1-rank launches run two at a time (``independent_runs``).
The two-rank launch (a Hub id, every logged metric, the frozen teacher's checksum, the replicas' weights)
is in test_two_nodes_e2e.py, where it is also the reference of the two-node run.

- 1 rank, 2 steps then the same command with 3 steps, the EMA teacher with decay 0.5: the rerun
  resumes from the step-2 checkpoint (no step repeated), its rollout serves the resumed weights,
  step 3 trains on the batch an uninterrupted run would see, the collapse monitor resumes with its
  window, and the EMA teacher follows the student and is resumed from the checkpoint.
- LoRA, 3 steps: the teacher is the base model with the adapter disabled (step 1 matches the
  full-parameter run's step 1; the checkpoint's base weights are bit-identical to the initial
  ones; the rollout serves the merged adapters); the collapse monitor stops the run after
  step 2 and a checkpoint (with the monitor's state) is saved there.
- ``+experiment=objective_sampled_token_task`` + ``opsd.loss.sft_weight=0.1``, 1 step: the
  sampled-token surrogate with the grader's GRPO advantage and the SFT term on the reference
  solutions (a second student forward on the workers) trains through the real trainer.
- teacher kinds, 2 steps each: ``live`` is the current student, ``checkpoint`` is another (larger)
  model (``ema`` with decay 0.5: the one-rank launches; decay 1 leaving the teacher bit-identical is
  tests/opsd/test_teacher_kinds.py); refusals before Ray.
- bad ``opsd.*`` values fail before Ray starts with a message naming the field; the pre-flight gate
  prints its line before Ray starts, and a student prompt of another context stops the run there
  with the diff of the two renderings.
"""

import json
import math

import pytest
import torch

from recipe.opsd.core.monitor import STOPPED_EXIT_CODE
from tests.e2e.opsd_checks import (check_preflight_positions, check_step_metrics, expected_index_sums, float64_sums,
                                   vocab_size)

pytestmark = pytest.mark.e2e

SCRIPT = "recipe/opsd/run_opsd.sh"

# A constant learning rate: the rerun below extends the run from 2 to 3 steps, and a schedule over
# the total step count (the yaml's cosine) would differ between the two launches (with cosine, the
# first resumed step uses the lr stored in the optimizer state: 0 at the end of a 2-step cosine).
RESUME_ARGS = [
    "trainer.log_fingerprints=true",
    "trainer.save_freq=1",
    "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
] + [  # a 1-step early window and a 1-step recent window: the monitor compares step s with step 1
    "opsd.diagnostics.monitor.early_start=1", "opsd.diagnostics.monitor.early_end=1", "opsd.diagnostics.monitor.recent_window=1",
]


# The resume launches also run the EMA teacher with decay 0.5 (one launch pair for both: the test of
# the EMA teacher reads them too). At step 1 every teacher kind is the initial model, so the first
# launch's step 1 is also the frozen-teacher reference of the LoRA and EMA-decay-1 tests. A frozen
# teacher across a resume: the kill test of test_opsd_faults_e2e.py.
EMA_HALF = ("opsd.teacher.kind=ema", "opsd.teacher.ema_decay=0.5")


def _one_rank_pair(run_cpu_verl, tiny_run_env, root):
    """1 rank, 2 steps, a checkpoint after every step, the EMA teacher (decay 0.5); then the same
    command with one more step (``STEPS=3``), which must resume at step 3. Returns ``(first, ckpt,
    weights_log, the tracker's step after the first launch, second)`` (a launch of independent_runs)."""
    ckpt, weights_log = root / "ckpt", root / "rollout_weights.jsonl"

    def launch(workdir, steps):
        return run_cpu_verl(SCRIPT, RESUME_ARGS + list(EMA_HALF), workdir=root / workdir,
                            env=tiny_run_env(ckpt, weights_log, STEPS=steps), script=True, timeout=300)

    first = launch("launch1", "2")
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    saved = tracker.read_text().strip() if tracker.exists() else None
    second = launch("launch2", "3") if first.returncode == 0 else None
    return first, ckpt, weights_log, saved, second


@pytest.fixture(scope="module")
def one_rank_run(independent_runs):
    """``(VerlRun, ckpt_dir, weights_log)`` of the first one-rank launch: of the resume and EMA tests,
    the full-parameter reference of the LoRA test."""
    first, ckpt, weights_log, _, _ = independent_runs["one_rank"]
    assert first.returncode == 0, first.tail()
    return first, ckpt, weights_log


@pytest.fixture(scope="module")
def one_rank_resumed(one_rank_run, independent_runs):  # one_rank_run: its checks first
    """The same command as ``one_rank_run`` again, with one more step (``STEPS=3``): it must resume at step 3."""
    _, _, _, saved, second = independent_runs["one_rank"]
    assert saved == "2"  # the first launch's last save
    return second


def test_resume_continues_from_the_last_checkpoint(
    one_rank_run, one_rank_resumed, check_rollout_weights, tiny_model_dir, tiny_data, tiny_initial_state
):
    first, ckpt, weights_log = one_rank_run
    second = one_rank_resumed
    assert sorted(first.metrics) == [1, 2], first.tail()
    assert second.returncode == 0, second.tail()
    assert sorted(second.metrics) == [3], "the rerun must continue at step 3 and repeat no step"
    # the pre-flight report (the one-rank launches run the EMA-0.5 teacher): checked at the fresh start; after a
    # resume the teacher is no longer the student's weights (reported, logged with step 3)
    check_preflight_positions(first, "ema")
    check_preflight_positions(second, "ema", checked=False)
    check_step_metrics(second.metrics[3], step=3, vocab_size=vocab_size(tiny_model_dir))

    # Same data order as an uninterrupted run (the dataloader state is restored, not restarted).
    expected = expected_index_sums(tiny_data["train"], steps=3)
    steps = {1: first.metrics[1], 2: first.metrics[2], 3: second.metrics[3]}
    seen = [(m["training/data_index_sum"], m["training/data_index_sqsum"]) for m in steps.values()]
    assert seen == expected

    # The resumed trainer starts from the step-2 weights: at start-up the rollout is given exactly
    # the step-2 checkpoint (not the initial model), then the step-3 weights.
    check_rollout_weights(
        weights_log, ckpt, expected_steps=[0, 1, 2, 2, 3], initial=tiny_initial_state
    )
    assert second.metrics[3]["opsd/actor_param_sqsum"] != first.metrics[2]["opsd/actor_param_sqsum"]
    assert second.metrics[3]["actor/lr"] == first.metrics[2]["actor/lr"] == first.metrics[1]["actor/lr"] > 0

    # The collapse monitor resumed with its window (saved with the step-2 checkpoint): step 3 is
    # compared with step 1 of the first launch, as in an uninterrupted run.
    def entropy(m):
        return m["opsd/student_entropy"]

    assert first.metrics[2]["opsd_monitor/entropy_ratio"] == pytest.approx(entropy(first.metrics[2]) / entropy(first.metrics[1]))
    assert second.metrics[3]["opsd_monitor/entropy_ratio"] == pytest.approx(
        entropy(second.metrics[3]) / entropy(first.metrics[1])
    ), "after the resume the monitor's window must hold the steps before it"
    launches = [json.loads(line) for line in (ckpt / "run_times.jsonl").read_text().splitlines()]
    assert [(r["recipe"], r["exit_code"]) for r in launches] == [("opsd", 0), ("opsd", 0)]


LORA_RANK, LORA_ALPHA = 8, 16


# ------------------------------------------------------------------ independent launches
# 1 rank each, none reads another's files: run two at a time (CI budget: a launch keeps ~1 core busy),
# the one-rank pair (two dependent launches) in one slot.
# also (folded in): opsd.diagnostics.preflight=false skips both parts of the pre-flight gate
SAMPLED_TOKEN_ARGS = ["+experiment=objective_sampled_token_task", "opsd.loss.sft_weight=0.1",
                      "data.train_batch_size=2", "trainer.save_freq=-1", "opsd.diagnostics.preflight=false",
                      "actor_rollout_ref.actor.ppo_epochs=2"]
# RLSD as its reference runs it (current policy as teacher, 8 rollouts, 2 updates per batch, lam schedule), 2 steps
RLSD_ARGS = ["+experiment=objective_rlsd", "data.train_batch_size=2", "trainer.save_freq=-1"]
# The checkpoint teacher: a larger model with the student's tokenizer (hidden 128 vs 64, another seed).
CHECKPOINT_TEACHER = {"seed": 1, "hidden_size": 128, "num_heads": 4, "num_kv_heads": 2}


@pytest.fixture(scope="module")
def independent_runs(run_cpu_verl_side_by_side, run_cpu_verl, tiny_run_env, tmp_path_factory):
    """``{name: (VerlRun, ckpt_dir, weights_log)}`` of the LoRA launch (``LORA_ARGS``, 3 steps), the
    sampled-token launch (1 step) and one launch per ``TEACHER_KINDS`` entry (2 steps each, the
    one-rank run's ``RESUME_ARGS``); ``"one_rank"``: the one-rank pair (``_one_rank_pair``, in one
    slot, first); ``"checkpoint_teacher_dir"``: that teacher's model directory."""
    from recipe.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("independent_runs")
    teacher_dir = build_tiny_model(root / "checkpoint_teacher", **CHECKPOINT_TEACHER)
    plans = {"lora": (LORA_ARGS, "3"), "sampled_token": (SAMPLED_TOKEN_ARGS, "1"), "rlsd": (RLSD_ARGS, "2")}
    plans |= {kind: (RESUME_ARGS + overrides, "2") for kind, overrides in TEACHER_KINDS.items()}
    plans["checkpoint"][0].append(f"opsd.teacher.path={teacher_dir}")
    paths = {name: (root / name / "ckpt", root / name / "rollout_weights.jsonl") for name in plans}
    launches = {
        name: dict(target=SCRIPT, args=args, workdir=root / name, env=tiny_run_env(*paths[name], STEPS=steps),
                   script=True, timeout=300)
        for name, (args, steps) in plans.items()
    }
    pair = {"one_rank": lambda: _one_rank_pair(run_cpu_verl, tiny_run_env, root / "one_rank")}
    runs = run_cpu_verl_side_by_side(pair | launches)
    return ({name: (runs[name], *paths[name]) for name in plans}
            | {"one_rank": runs["one_rank"], "checkpoint_teacher_dir": teacher_dir})


# LoRA (test_lora_teacher_is_the_base_model), 3 steps; a launch of independent_runs.
LORA_ARGS = [
    "trainer.log_fingerprints=true",
    f"actor_rollout_ref.model.lora_rank={LORA_RANK}",
    f"actor_rollout_ref.model.lora_alpha={LORA_ALPHA}",
    # the HF rollout takes merged weights (it does not serve adapters)
    "actor_rollout_ref.model.lora.merge=True",
    # Also (folded in to save a launch): the collapse monitor stops the run and a checkpoint is
    # saved although no save_freq step or last step was reached. The "length" role is pointed at
    # the step counter, so the signature fires at step 2 (2 / 1 >= length_ratio_threshold 1.5).
    "trainer.save_freq=5",
    "opsd.diagnostics.monitor.early_start=1", "opsd.diagnostics.monitor.early_end=1", "opsd.diagnostics.monitor.recent_window=1",
    "+opsd.diagnostics.monitor.metric_keys.length=training/global_step", "opsd.diagnostics.monitor.stop_on=[length]",
]


def test_lora_teacher_is_the_base_model(one_rank_run, independent_runs, fsdp_state_dict, tiny_initial_state,
                                       tiny_model_dir):
    """LoRA: the student trains adapters (B starts at zero), the teacher is the same model with the
    adapter disabled, no second copy. Step 1 (student = base, same seeds, same data) equals the
    full-parameter run's step 1; the checkpoint's base weights (= the teacher) are the initial ones;
    the rollout serves the merged adapters."""
    full, _, _ = one_rank_run
    run, ckpt, weights_log = independent_runs["lora"]
    assert run.returncode == STOPPED_EXIT_CODE, run.tail()  # the monitor's stop, not a crash
    assert sorted(run.metrics) == [1, 2], "the monitor must stop the 3-step run after step 2: " + run.tail()
    # pre-flight: student (adapters on, B = 0) and teacher (adapters off) score the none control identically
    check_preflight_positions(run, "frozen_initial")
    assert run.metrics[2]["opsd_monitor/should_stop"] == 1.0 and run.metrics[1]["opsd_monitor/should_stop"] == 0.0
    assert "[opsd] stopped by the collapse monitor: step 2: length signature" in run.log
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    saved = json.loads((ckpt / "global_step_2" / "opsd_monitor.json").read_text())
    assert saved["should_stop"] and saved["stop_signature"] == "length" and len(saved["history"]) == 2
    lora1, full1 = run.metrics[1], full.metrics[1]
    assert lora1["training/data_index_sum"] == full1["training/data_index_sum"]  # same prompts
    # Step 1: student = base (B = 0) and teacher = base on the same teacher prompts, so the step-1
    # statistics are those of the full-parameter run, but the rollouts are not the same samples: the
    # HF server batches requests in a 20 ms window (its seeds follow the batches). Measured over 3 pairs of
    # runs in bf16 compute: full-parameter step-1 loss 8.92e-4 / 8.92e-4 / 9.04e-4, LoRA 8.88e-4 / 8.88e-4 /
    # 8.85e-4; entropies within 1e-5 relative.
    # A teacher without its privileged context would give a loss near 0, a nonzero initial adapter a
    # different student entropy.
    assert lora1["opsd/loss"] == pytest.approx(full1["opsd/loss"], rel=0.1)
    assert lora1["opsd/fwd_kl"] == pytest.approx(full1["opsd/fwd_kl"], rel=0.1)
    for key in ("opsd/teacher_entropy", "opsd/student_entropy"):
        assert lora1[key] == pytest.approx(full1[key], rel=1e-4), key
    # no second copy of the model: the worker has no separate teacher parameters
    assert "opsd/teacher_param_checksum" not in lora1
    for step in (1, 2):
        # no teacher copy; one checkpoint, at the stop
        absent = ("opsd/teacher_param_checksum",) + (("timing_s/save_checkpoint",) if step == 1 else ())
        check_step_metrics(run.metrics[step], step=step, vocab_size=vocab_size(tiny_model_dir), not_logged=absent)

    # The base weights (= the teacher: the adapter-disabled model) are exactly the initial model's;
    # the adapters trained.
    state = fsdp_state_dict(ckpt / "global_step_2" / "actor")
    initial = tiny_initial_state
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in state.items() if "lora_" not in k}
    assert base.keys() == initial.keys(), sorted(base.keys() ^ initial.keys())[:5]
    changed = [name for name, tensor in base.items() if not torch.equal(tensor, initial[name])]
    assert not changed, f"base weights moved in LoRA mode: {changed[:5]}"
    lora_b = [v for k, v in state.items() if "lora_B" in k]
    assert lora_b and any(bool(v.abs().max() > 0) for v in lora_b)

    # verl sends merged LoRA weights cast to bfloat16 whatever the param dtype (FSDPEngine.
    # _merged_lora_per_tensor_param): at start-up (B = 0) the base rounded to bfloat16; after each update
    # merged weights that moved (verl's merge order and W + (alpha / r) B A computed here differ in the last
    # bits, so step 2 is not compared bitwise).
    from opsd_test_hooks.hf_rollout import weights_fingerprint

    records = [json.loads(line) for line in weights_log.read_text().splitlines()]
    assert [r["global_steps"] for r in records] == [0, 1, 2]
    assert records[0]["sha256"] == weights_fingerprint({k: v.to(torch.bfloat16) for k, v in initial.items()})
    moved = [name for name, digest in records[2]["sha256"].items() if digest != records[0]["sha256"][name]]
    assert moved, records[2]


@pytest.mark.parametrize(
    "override, field",
    [
        ("opsd.teacher_context=bogus", "opsd.teacher_context"),
        ("opsd.loss.beta=2", "opsd.loss.beta"),
        ("opsd.loss.clip_tau=-1", "opsd.loss.clip_tau"),
    ],
)
def test_bad_opsd_config_fails_before_ray_starts(run_cpu_verl, tiny_run_env, tmp_path, override, field):
    run = run_cpu_verl(
        SCRIPT,
        [override],
        workdir=tmp_path,
        env=tiny_run_env(tmp_path / "ckpt", tmp_path / "weights.jsonl"),
        script=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert f"error: config: {field} must be" in run.log, run.tail()
    assert "Traceback" not in run.log, run.tail()  # one line naming the field, no stack trace
    assert "ray init kwargs" not in run.log and "Started a local Ray instance" not in run.log, run.tail()


def test_sampled_token_objective_with_task_reward_one_step(independent_runs):
    """opsd.loss.objective through the real trainer: the sampled-token surrogate with the grader's GRPO group
    advantage (2 prompts x 4 rollouts, one step): the trainer grades, the workers get the advantages; with
    an SFT term (folded into this launch): the workers run the student on prompt + reference solution. Two
    updates per batch (ppo_epochs 2): pS_old is the actor's log-probs before the first, so the second update's
    ratios are off 1."""
    run, _, _ = independent_runs["sampled_token"]
    assert run.returncode == 0, run.tail()
    metrics = run.metrics[1]
    assert metrics["timing_s/old_log_prob"] > 0 and abs(metrics["opsd/pg_ratio"] - 1) > 1e-7
    for key in ("opsd/loss", "actor/loss", "actor/grad_norm", "opsd/pg_advantage", "opsd/task_reward",
                "opsd/task_advantage_abs", "opsd/fwd_kl", "opsd/sft_nll", "opsd/sft_truncated_frac"):
        assert math.isfinite(metrics[key]), (key, metrics)
    assert metrics["opsd/sft_nll"] > 0 and metrics["opsd/sft_tokens"] > 0
    assert metrics["opsd/loss"] == pytest.approx(metrics["actor/loss"], rel=1e-5, abs=1e-8)
    assert 0.0 <= metrics["opsd/task_reward"] <= 1.0 and metrics["actor/grad_norm"] > 0
    assert "[opsd] preflight" not in run.log and not any(key.startswith("preflight/") for key in metrics)


def test_rlsd_as_its_reference_runs_it(independent_runs):
    """The objective_rlsd preset through the real trainer: the current policy scores the reference's teacher prompt,
    8 rollouts per prompt, two updates per batch against the actor's pre-update log-probs, and lam read at
    generation time (0.5, then 0.5 x (1 - 2/50) after the first batch's two optimizer steps)."""
    run, _, _ = independent_runs["rlsd"]
    assert run.returncode == 0, run.tail()
    assert [run.metrics[s]["opsd/rlsd_lambda"] for s in (1, 2)] == pytest.approx([0.5, 0.48], abs=1e-12)
    for step in (1, 2):
        metrics = run.metrics[step]
        for key in ("opsd/pg_ratio", "opsd/rlsd_weight", "opsd/task_reward", "timing_s/old_log_prob", "actor/loss"):
            assert math.isfinite(metrics[key]), (key, metrics)
        assert 0.8 <= metrics["opsd/rlsd_weight"] <= 1.2


def test_preflight_mismatch_fails_before_ray_starts_with_the_diff(run_cpu_verl, tiny_run_env, tmp_path):
    """The tiny parquet holds the default student message; an instruction-only context changes the
    student's message, so the gate stops the run with the diff of the two renderings, in one message."""
    run = run_cpu_verl(
        SCRIPT,
        ["opsd.teacher_context=concise_to_detailed"],
        workdir=tmp_path,
        env=tiny_run_env(tmp_path / "ckpt", tmp_path / "weights.jsonl"),
        script=True,
        timeout=120,
    )
    assert run.returncode != 0, run.tail()
    assert "error: preflight: row 0" in run.log and "(opsd.diagnostics.preflight=false skips this gate)" in run.log, \
        run.tail()
    assert "+Write a concise solution" in run.log, run.tail()
    assert "Traceback" not in run.log, run.tail()
    assert "Started a local Ray instance" not in run.log, run.tail()


def test_incomplete_resume_checkpoint_fails_before_ray_starts(run_cpu_verl, tiny_run_env, tmp_path):
    """trainer.resume_mode=auto (the default) would resume from a save whose rank shards are missing
    (a run killed while saving): one line naming the checkpoint, before Ray starts."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step_2" / "actor").mkdir(parents=True)
    (ckpt / "global_step_2" / "actor" / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 1}')
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    run = run_cpu_verl(
        SCRIPT,
        [],
        workdir=tmp_path,
        env=tiny_run_env(ckpt, tmp_path / "weights.jsonl", STEPS="3"),
        script=True,
        timeout=120,
    )
    assert run.returncode != 0, run.tail()
    # the launcher's check of the checkpoint a run resumes from (recipe.launch.checks), before the recipe's own
    assert (f"error: trainer.default_local_dir={ckpt} (CKPT_DIR): {ckpt / 'global_step_2' / 'actor'}: "
            "no FSDP model shards") in run.log, run.tail()
    assert "Traceback" not in run.log, run.tail()
    assert "Started a local Ray instance" not in run.log, run.tail()


# ------------------------------------------------------------------ teacher kinds (opsd.teacher)
# 1 rank, 2 steps each (launches of independent_runs), the one-rank run's settings (RESUME_ARGS; the
# one-rank launches themselves run the EMA teacher with decay 0.5, their step 1 is every kind's
# reference: the initial model). opsd/teacher_param_* are the float64 sums of the weights that scored
# the step, taken right before the teacher forward; opsd/actor_param_* those of the actor after the
# step's update.


TEACHER_KINDS = {
    "live": ["opsd.teacher.kind=live"],
    "checkpoint": ["opsd.teacher.kind=checkpoint"],  # + opsd.teacher.path of the fixture's model
}


def _teacher_kind_run(independent_runs, kind, tiny_model_dir):
    run, _, _ = independent_runs[kind]
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    for step in (1, 2):
        check_step_metrics(run.metrics[step], step=step, vocab_size=vocab_size(tiny_model_dir))
    return run


def _sums(metrics, who):
    return metrics[f"opsd/{who}_param_checksum"], metrics[f"opsd/{who}_param_sqsum"]


def test_ema_teacher_follows_the_student_and_resumes(one_rank_run, one_rank_resumed, tiny_model_dir):
    """decay 0.5 (the one-rank launches): the teacher of step s + 1 is 0.5 x the teacher of step s +
    0.5 x the student after step s, on every parameter, so its float64 sum is the mean of theirs; the
    EMA teacher is saved with each checkpoint, and the rerun with 3 steps resumes it (not the initial
    model) at step 3."""
    run, ckpt, _ = one_rank_run
    assert sorted(run.metrics) == [1, 2], run.tail()
    check_preflight_positions(run, "ema")
    for step in (1, 2):
        check_step_metrics(run.metrics[step], step=step, vocab_size=vocab_size(tiny_model_dir))
    initial_sum, _ = float64_sums(tiny_model_dir)
    assert _sums(run.metrics[1], "teacher") == pytest.approx(float64_sums(tiny_model_dir), rel=1e-12)
    actor_sum, _ = _sums(run.metrics[1], "actor")
    assert run.metrics[2]["opsd/teacher_param_checksum"] == pytest.approx(0.5 * initial_sum + 0.5 * actor_sum, rel=1e-6)
    assert run.metrics[2]["opsd/teacher_param_checksum"] != pytest.approx(initial_sum, rel=1e-9)
    assert (ckpt / "global_step_2" / "opsd_ema_teacher" / "rank_0.pt").is_file()

    resumed = one_rank_resumed
    assert resumed.returncode == 0, resumed.tail()
    assert sorted(resumed.metrics) == [3], resumed.tail()
    teacher2, actor2 = run.metrics[2]["opsd/teacher_param_checksum"], run.metrics[2]["opsd/actor_param_checksum"]
    assert resumed.metrics[3]["opsd/teacher_param_checksum"] == pytest.approx(0.5 * teacher2 + 0.5 * actor2, rel=1e-6)


def test_live_teacher_is_the_current_student(independent_runs, tiny_model_dir):
    """No second copy: the weights that score step s are the actor's after step s - 1 (the student
    that sampled the rollouts), the initial model at step 1."""
    run = _teacher_kind_run(independent_runs, "live", tiny_model_dir)
    check_preflight_positions(run, "live")
    assert _sums(run.metrics[1], "teacher") == pytest.approx(float64_sums(tiny_model_dir), rel=1e-12)
    assert _sums(run.metrics[2], "teacher") == _sums(run.metrics[1], "actor")
    assert _sums(run.metrics[2], "actor") != _sums(run.metrics[1], "actor")


def test_checkpoint_teacher_is_that_model(independent_runs, tiny_model_dir):
    """A larger model with the student's tokenizer (hidden 128 vs 64, another seed) scores the
    rollouts, its lm_head the teacher head: its checksum at both steps is that checkpoint's."""
    teacher_dir = independent_runs["checkpoint_teacher_dir"]
    run = _teacher_kind_run(independent_runs, "checkpoint", tiny_model_dir)
    check_preflight_positions(run, "checkpoint", checked=False)  # another model: reported, not checked
    assert run.metrics[1]["preflight/none_control_max"] > 0
    for step in (1, 2):
        assert _sums(run.metrics[step], "teacher") == pytest.approx(float64_sums(teacher_dir), rel=1e-12)
    assert float64_sums(teacher_dir) != float64_sums(tiny_model_dir)


def test_teacher_refusals_before_ray_starts(run_cpu_verl, tiny_run_env, tiny_model_dir, tmp_path):
    """One line each, before Ray: a teacher checkpoint with another tokenizer; the same model, prompt
    (context none), mode and temperature as the student (the loss would be identically 0)."""
    import shutil

    other = tmp_path / "other_tokenizer"
    shutil.copytree(tiny_model_dir, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    tokenizer["added_tokens"][0]["content"] = "<|renamed|>"
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    cases = [
        (["opsd.teacher.kind=checkpoint", f"opsd.teacher.path={other}"], f"{other / 'tokenizer.json'}: vocabulary differs"),
        (["opsd.teacher_context=none"], "error: config: opsd.teacher: the teacher is the student itself"),
    ]
    for index, (overrides, expected) in enumerate(cases):
        run = run_cpu_verl(
            SCRIPT,
            overrides,
            workdir=tmp_path / f"case{index}",
            env=tiny_run_env(tmp_path / f"ckpt{index}", tmp_path / "weights.jsonl"),
            script=True,
            timeout=120,
        )
        assert run.returncode != 0, run.tail()
        assert expected in run.log, run.tail()
        assert "Traceback" not in run.log and "Started a local Ray instance" not in run.log, run.tail()
