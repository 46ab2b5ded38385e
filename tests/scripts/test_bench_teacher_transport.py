"""scripts/bench_teacher_transport.py: the pure helpers that turn the probe's call records and verl's
metrics lines into the table's bytes, times and the step-1 agreement (hand-written records)."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_teacher_transport.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_teacher_transport", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_from_jsonl_merges_records_of_a_step(bench):
    lines = [json.dumps({"step": 1, "data": {"a": 1.0}}), "", json.dumps({"step": 2, "data": {"a": 2.0}}),
             json.dumps({"step": 1, "data": {"b": 3.0}})]
    assert bench.steps_from_jsonl(lines) == {1: {"a": 1.0, "b": 3.0}, 2: {"a": 2.0}}


def test_bytes_per_step_sums_teacher_and_update_calls_per_update(bench):
    calls = [  # two steps of the "before" trainer: teacher call (hidden states back), update (them out again)
        {"method": "actor_rollout_compute_teacher_hidden", "to_workers": 100, "from_workers": 4000},
        {"method": "actor_rollout_update_actor", "to_workers": 4300, "from_workers": 10},
        {"method": "actor_rollout_generate_sequences", "to_workers": 999, "from_workers": 999},  # not counted
        {"method": "actor_rollout_compute_teacher_hidden", "to_workers": 100, "from_workers": 4000},
        {"method": "actor_rollout_update_actor", "to_workers": 4300, "from_workers": None},  # non-blocking
    ]
    got = bench.bytes_per_step(calls)
    assert got["to"] == (100 + 4300 + 100 + 4300) / 2
    assert got["from"] == (4000 + 10 + 4000 + 0) / 2
    assert got["compute_teacher_hidden/to"] == 100 and got["compute_teacher_hidden/from"] == 4000
    assert got["update_actor/to"] == 4300 and got["update_actor/from"] == 5


def test_bytes_per_step_without_an_update_is_an_error(bench):
    with pytest.raises(ValueError, match="no update_actor call"):
        bench.bytes_per_step([{"method": "x_compute_teacher_hidden", "to_workers": 1, "from_workers": 1}])


def test_mean_times_skip_the_first_step(bench):
    steps = {1: {"timing_s/step": 100.0}, 2: {"timing_s/step": 2.0, "timing_s/gen": 1.0},
             3: {"timing_s/step": 4.0, "timing_s/gen": 2.0}}
    got = bench.mean_times(steps, keys=("timing_s/step", "timing_s/gen", "timing_s/teacher"))
    assert got == {"timing_s/step": 3.0, "timing_s/gen": 1.5, "timing_s/teacher": 0.0}
    assert bench.mean_times({1: {"timing_s/step": 7.0}}, keys=("timing_s/step",)) == {"timing_s/step": 7.0}


def test_relative_difference(bench):
    assert bench.relative_difference(0.0, 0.0) == 0.0
    assert bench.relative_difference(2.0, 1.0) == 0.5
    assert bench.relative_difference(-1.0, 1.0) == 2.0
    assert bench.relative_difference(float("nan"), 1.0) == math.inf


def test_step_one_agreement_reads_each_revisions_loss_name(bench):
    # before 53ad249 the token mean was logged as opsd/loss; after it as opsd/loss_token_mean
    # (opsd/loss then being the optimised loss under loss_agg_mode, not compared)
    before = {"opsd/loss": 0.5, "actor/grad_norm": 2.0, "opsd/teacher_entropy": 1.0, "opsd/only_before": 9.0,
              "response_length/mean": 8.0}
    after = {"opsd/loss": 0.7, "opsd/loss_token_mean": 0.5000005, "actor/grad_norm": 2.0,
             "opsd/teacher_entropy": 1.25, "opsd/only_after": 3.0, "response_length/mean": 8.0}
    rows = bench.step_one_agreement(before, after)
    names = [row[0] for row in rows]
    assert names == ["loss (token mean)", "actor/grad_norm", "response_length/mean", "opsd/teacher_entropy"]
    assert rows[0][1:3] == (0.5, 0.5000005)
    assert rows[0][3] == pytest.approx(0.0000005 / 0.5000005)
    assert rows[3][3] == pytest.approx(0.25 / 1.25)


@pytest.mark.parametrize("args, line", [
    (["--before", "no-such-revision"], "error: --before no-such-revision: not a commit of"),
    (["--before", "HEAD", "--steps", "0"], "error: --steps must be >= 1, got 0"),
    (["--before", "HEAD", "--model", "{tmp}"], "error: --model {tmp}: not an HF model directory (no config.json)"),
])
def test_input_errors_are_one_line_before_any_run(args, line, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(line.replace("{tmp}", str(tmp_path))) and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing built, nothing run
