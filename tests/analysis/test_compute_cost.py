"""recipe.analysis.compute_cost and scripts/compare_opsd_grpo.py on hand-written metrics files
(no run is launched: the table arithmetic only)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.analysis.compute_cost import (
    DataMismatch,
    check_same_data,
    cost_table,
    loss_aggregation,
    read_data_order,
    read_launch_config,
    run_cost,
    step_phases,
)

REPO = Path(__file__).resolve().parents[2]

# OPSD: the teacher runs inside update_actor (timing_s/teacher is a part of it).
OPSD_ROWS = [
    {"step": 1, "timing_s/step": 9.0, "timing_s/gen": 5.0, "timing_s/update_actor": 3.0, "timing_s/teacher": 1.0,
     "perf/total_num_tokens": 100.0},
    {"step": 2, "timing_s/step": 4.0, "timing_s/gen": 1.0, "timing_s/update_actor": 2.5, "timing_s/teacher": 0.5,
     "perf/total_num_tokens": 200.0},
    {"step": 3, "timing_s/step": 6.0, "timing_s/gen": 2.0, "timing_s/update_actor": 3.5, "timing_s/teacher": 1.5,
     "perf/total_num_tokens": 300.0},
]
# GRPO: the reference scoring is its own phase; old_log_prob, reward, adv fall into "other".
GRPO_ROWS = [
    {"step": 1, "timing_s/step": 20.0, "timing_s/gen": 10.0, "timing_s/ref": 2.0, "timing_s/update_actor": 4.0,
     "timing_s/old_log_prob": 1.0, "perf/total_num_tokens": 800.0, "perf/max_memory_allocated_gb": 3.0},
    {"step": 2, "timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/ref": 1.0, "timing_s/update_actor": 3.0,
     "timing_s/old_log_prob": 1.0, "perf/total_num_tokens": 1000.0, "perf/max_memory_allocated_gb": 5.0},
]


def test_step_phases_split_the_step_exactly():
    assert step_phases(OPSD_ROWS[0]) == {"generation": 5.0, "teacher": 1.0, "update": 2.0, "other": 1.0}
    assert step_phases(GRPO_ROWS[0]) == {"generation": 10.0, "teacher": 2.0, "update": 4.0, "other": 4.0}


def test_run_cost_means_after_warmup_and_totals_over_all_steps():
    opsd = run_cost(rows=OPSD_ROWS, n_devices=2, warmup_steps=1, measured_peak_gb=1.5)
    assert opsd.steps == 2
    assert opsd.loop_s == 19.0  # 9 + 4 + 6: every step
    assert opsd.device_hours == pytest.approx(19.0 * 2 / 3600)
    assert opsd.step_s == 5.0  # (4 + 6) / 2
    # steps 2, 3: gen (1 + 2)/2, teacher (0.5 + 1.5)/2, update (2 + 2)/2, other (0.5 + 0.5)/2
    assert opsd.phases_s == {"generation": 1.5, "teacher": 1.0, "update": 2.0, "other": 0.5}
    assert opsd.tokens_per_s == 50.0  # (200 + 300) / (4 + 6)
    assert opsd.peak_memory_gb == 1.5  # nothing logged: the measured value
    grpo = run_cost(rows=GRPO_ROWS, n_devices=4, warmup_steps=1)
    assert grpo.peak_memory_gb == 5.0  # verl's logged maximum wins
    assert grpo.phases_s == {"generation": 4.0, "teacher": 1.0, "update": 3.0, "other": 2.0}
    assert grpo.tokens_per_s == 100.0
    # fewer steps than the warm-up: all steps are kept
    assert run_cost(rows=OPSD_ROWS[:1], n_devices=1, warmup_steps=1).step_s == 9.0


def test_cost_table_ratios_and_paper_numbers():
    table = cost_table(opsd=run_cost(rows=OPSD_ROWS, n_devices=2, measured_peak_gb=1.5),
                       grpo=run_cost(rows=GRPO_ROWS, n_devices=4), memory_label="test")
    lines = table.splitlines()
    assert "| training loop, all steps (s) | 19.0 | 30.0 | 0.633 |" in lines
    assert "| step, mean of 2 / 1 steps (s) | 5.000 | 10.000 | 0.500 |" in lines
    assert "|   teacher (s) | 1.000 | 1.000 | 1.000 |" in lines
    assert "| tokens per second | 50.0 | 100.0 | 0.500 |" in lines
    assert "| peak memory (GB): test | 1.50 | 5.00 | 0.300 |" in lines
    # device hours: 19 * 2 vs 30 * 4 device-seconds
    assert f"| device hours (loop x devices) | {38 / 3600:.5f} | {120 / 3600:.5f} | {38 / 120:.3f} |" in lines
    assert "| Qwen3-1.7B | 0.66 | 114.27 | 0.0058 |" in lines
    assert "| Qwen3-4B | 1.13 | 171.81 | 0.0066 |" in lines


def test_cost_table_says_which_data_and_which_grpo_aggregation():
    table = cost_table(opsd=run_cost(rows=OPSD_ROWS, n_devices=2), grpo=run_cost(rows=GRPO_ROWS, n_devices=4),
                       memory_label="test", same_data="same data: both runs ...",
                       grpo_aggregation=loss_aggregation({"actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}}}))
    lines = table.splitlines()
    assert "Data: same data: both runs ..." in lines
    assert "GRPO loss aggregation: token-mean: every token of the mini-batch weighs the same (DAPO; verl's default)" in lines
    assert "| GRPO loss aggregation | - | 1/|y| per response, then the mean (eq. grpo_related) |" in lines
    # a caller that passes neither says so
    bare = cost_table(opsd=run_cost(rows=OPSD_ROWS, n_devices=2), grpo=run_cost(rows=GRPO_ROWS, n_devices=4),
                      memory_label="test").splitlines()
    assert "Data: not checked" in bare and "GRPO loss aggregation: not recorded" in bare


def test_loss_aggregation_from_the_launch_config(tmp_path):
    config = tmp_path / "launch_config.yaml"
    config.write_text("actor_rollout_ref:\n  actor:\n    loss_agg_mode: seq-mean-token-mean\n")
    assert loss_aggregation(read_launch_config({"config": str(config)})) == (
        "seq-mean-token-mean: each response's token mean, then the mean over responses (the paper's GRPO equation)")
    assert loss_aggregation(read_launch_config({})) == "not recorded"  # a launch from before the record had it


ORDER = {"format": 1, "rows": 3200, "order_sha256": "a" * 64, "rows_in_files": 9000, "rows_in_dataset": 9000,
         "filter_overlong_prompts": False}


def test_check_same_data_accepts_one_order_and_refuses_another(tmp_path):
    for name, record in (("opsd", {**ORDER, "rows_in_files": 3200, "rows_in_dataset": 3200}), ("grpo", ORDER)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data_order.json").write_text(json.dumps(record))
    opsd, grpo = read_data_order(tmp_path / "opsd"), read_data_order(tmp_path / "grpo")
    assert opsd["path"] == str(tmp_path / "opsd" / "data_order.json")
    assert check_same_data(opsd=opsd, grpo=grpo) == (
        "same data: both runs trained on the same 3200 rows in the same order (sha256 aaaaaaaaaaaaaaaa)")
    # GRPO's prompt-length filter dropped a row: another order, and the record says why
    shifted = {**grpo, "order_sha256": "b" * 64, "rows_in_dataset": 8999, "filter_overlong_prompts": True}
    with pytest.raises(DataMismatch) as err:
        check_same_data(opsd=opsd, grpo=shifted)
    message = str(err.value)
    assert "another row order" in message and "data.filter_overlong_prompts False vs True" in message
    assert "3200/3200 vs 8999/9000" in message and "released_grpo" in message and "opsd_vs_grpo_matched" in message
    with pytest.raises(DataMismatch, match="3200 vs 1600 rows"):
        check_same_data(opsd=opsd, grpo={**grpo, "rows": 1600})
    # a run without a record (launched before runs recorded their order) is refused, naming the file
    with pytest.raises(DataMismatch, match="data_order.json: no data-order record"):
        read_data_order(tmp_path)


def test_run_cost_refuses_rows_without_timing():
    with pytest.raises(ValueError, match="timing_s/step"):
        run_cost(rows=[{"step": 1, "actor/loss": 0.1}], n_devices=1)


def _write_run(directory: Path, rows, n_devices: int) -> Path:
    directory.mkdir()
    with open(directory / "metrics.jsonl", "w") as out:
        for row in rows:
            out.write(json.dumps({"step": row["step"], "data": {k: v for k, v in row.items() if k != "step"}}) + "\n")
    record = {"recipe": directory.name, "device": "gpu", "n_devices": n_devices, "wall_time_s": 99,
              "exit_code": 0, "metrics": str(directory / "metrics.jsonl")}
    (directory / "run_times.jsonl").write_text(json.dumps(record) + "\n")
    (directory / "data_order.json").write_text(json.dumps({"rows": 4, "order_sha256": "a" * 64}))
    return directory


def _write_launch_config(directory: Path, rollout: str, modules: str) -> None:
    (directory / "launch_config.yaml").write_text(
        f"actor_rollout_ref:\n  rollout:\n    name: {rollout}\n"
        f"ray_kwargs:\n  ray_init:\n    runtime_env:\n      env_vars:\n        VERL_USE_EXTERNAL_MODULES: {modules}\n")


def test_script_reads_existing_runs(tmp_path):
    opsd = _write_run(tmp_path / "opsd", OPSD_ROWS, 2)
    grpo = _write_run(tmp_path / "grpo", GRPO_ROWS, 4)
    for run in (opsd, grpo):
        _write_launch_config(run, "vllm", "recipe.rollout.extension")
    proc = subprocess.run([sys.executable, "scripts/compare_opsd_grpo.py", "--opsd-run", str(opsd),
                           "--grpo-run", str(grpo)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| tokens per second | 50.0 | 100.0 | 0.500 |" in proc.stdout.splitlines()
    assert "perf/max_memory_allocated_gb" in proc.stdout  # the GRPO run logged it
    assert "same data: both runs trained on the same 4 rows in the same order" in proc.stdout
    # both runs used the guarded vLLM weight push (every RL launch lists recipe.rollout.extension)
    assert ("weight push: opsd guarded vLLM push (recipe.rollout.extension); grpo guarded vLLM push "
            "(recipe.rollout.extension) (the same path)") in proc.stdout.splitlines()
    _write_launch_config(grpo, "vllm", "my.ext")
    proc = subprocess.run([sys.executable, "scripts/compare_opsd_grpo.py", "--opsd-run", str(opsd),
                           "--grpo-run", str(grpo)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ("grpo verl's vLLM push (unguarded) (DIFFERENT paths: the step times are not comparable)"
            in proc.stdout), proc.stdout


def test_script_refuses_a_pair_that_trained_on_other_rows(tmp_path):
    opsd = _write_run(tmp_path / "opsd", OPSD_ROWS, 2)
    grpo = _write_run(tmp_path / "grpo", GRPO_ROWS, 4)
    (grpo / "data_order.json").write_text(json.dumps({"rows": 4, "order_sha256": "b" * 64}))
    proc = subprocess.run([sys.executable, "scripts/compare_opsd_grpo.py", "--opsd-run", str(opsd),
                           "--grpo-run", str(grpo)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "the runs did not train on the same data: OPSD 4 rows, order sha256 aaaaaaaaaaaaaaaa" in proc.stderr
    assert "another row order" in proc.stderr


def test_script_names_a_missing_launch_record(tmp_path):
    (tmp_path / "opsd").mkdir()
    grpo = _write_run(tmp_path / "grpo", GRPO_ROWS, 4)
    proc = subprocess.run([sys.executable, "scripts/compare_opsd_grpo.py", "--opsd-run", str(tmp_path / "opsd"),
                           "--grpo-run", str(grpo)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "run_times.jsonl" in proc.stderr
