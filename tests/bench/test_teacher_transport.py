"""``scripts/bench.py teacher-transport`` / ``driver-bytes``: the pure helpers that turn the probe's call
records and verl's metrics lines into the table's bytes, times and the step-1 agreement (hand-written
records); the bench code is imported by nothing of the recipes."""

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    from recipe.bench import teacher_transport

    return teacher_transport


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


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    (["--before", "no-such-revision"], "error: --before no-such-revision: not a commit of"),
    (["--before", "HEAD", "--steps", "0"], "error: --steps must be >= 1, got 0"),
    (["--before", "HEAD", "--model", "{tmp}"], "error: --model {tmp}: not an HF model directory (no config.json)"),
])
def test_input_errors_are_one_line_before_any_run(args, line, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, str(SCRIPT), "teacher-transport", *args, "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(line.replace("{tmp}", str(tmp_path))) and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing built, nothing run


def test_native_mode_is_null_in_revisions_without_it(bench, tmp_path):
    opsd = tmp_path / "recipe" / "opsd"
    opsd.mkdir(parents=True)
    (opsd / "config.py").write_text('MODES = ("think", "no_think", None)\n')
    assert [bench.mode_value(tmp_path, m) for m in ("think", "native")] == ["think", "null"]
    (opsd / "config.py").write_text('MODES = ("think", "no_think", "native")\n')
    assert bench.mode_value(tmp_path, "native") == "native"


@pytest.mark.slow
def test_driver_bytes_table_from_a_probe_log(tmp_path):
    log = tmp_path / "bytes.jsonl"
    log.write_text("".join(json.dumps(c) + "\n" for c in [
        {"method": "wg_update_actor", "to_workers": 1000, "from_workers": 8},
        {"method": "wg_generate_sequences", "to_workers": 60, "from_workers": None},
        {"method": "wg_update_actor", "to_workers": 3000, "from_workers": 0},
    ]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "driver-bytes", str(log)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"| {log} | wg_update_actor | 2,000 | 4 |" in lines and f"| {log} | all | 2,030 | 4 |" in lines
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"method": "wg_generate_sequences", "to_workers": 1, "from_workers": 1}) + "\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "driver-bytes", str(empty)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {empty}: no update_actor call")


@pytest.mark.slow
def test_nothing_outside_recipe_bench_imports_it():
    importers = []
    for path in (REPO / "recipe").rglob("*.py"):
        if "bench" in path.relative_to(REPO / "recipe").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importers += [f"{path}: {n}" for n in names if n == "recipe.bench" or n.startswith("recipe.bench.")]
    assert importers == []
