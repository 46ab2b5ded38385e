"""Every command-line tool (data_prep builders, scripts/*.py and their subcommands, the ``python -m`` builders,
merge_checkpoint.sh): a user's input error is
ONE stderr line ``error: <file>[:<line> | :row '<id>']: <what> (<fix>)`` and exit code 2; ``--debug`` (or
OPSD_DEBUG=1) adds the traceback; no output is replaced without ``--overwrite``. Real subprocess runs, each
on a bad input the test writes (none of them trains, samples or builds the toy student)."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]


def run(*args, env=None, timeout=180):
    """``python <args>`` (a module ``-m x`` or a script path relative to the repo) from the repo root.

    In its own process group, killed whole on timeout: a regression that starts real work (the toy
    student's SFT run) must not outlive the test.
    """
    command = [sys.executable, *args] if args[0] != "bash" else list(args)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True,
                            env={**os.environ, "OPSD_DEBUG": "", "HF_HUB_OFFLINE": "1", **(env or {})})
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def one_error_line(proc) -> str:
    """The single ``error: ...`` line of a failed run (exit code 2, nothing else on stderr)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_inputs")
    (d / "bad.jsonl").write_text('{"id": "a", "problem": "What is 1+1?", "answer": "2"}\n\n'
                                 '{"id": "b", "problem": "x", "answer": 2,}\n')
    (d / "no_answer.jsonl").write_text('{"id": "a", "problem": "What is 1+1?"}\n{"id": "b", "problem": "x"}\n')
    (d / "eval").mkdir()
    (d / "eval" / "set.jsonl").write_text('{"id": "e1", "problem": "Find x.", "answer": "1"}\n{"id": "e2", "problem": \n')
    (d / "not.parquet").write_text("plain text\n")
    model = build_tiny_model(d / "tiny", seed=0)
    shutil.copytree(model, d / "demo" / "model")
    truncated = Path(shutil.copytree(model, d / "truncated"))
    (truncated / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:-100])
    no_tokenizer = Path(shutil.copytree(model, d / "no_tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    (d / "log.jsonl").write_text('{"step": 1, "data": {"actor/entropy": 1.0}}\n{"step": 2, "data": \n{"step": 3}\n')
    (d / "spec.json").write_text('{"Qwen3": {"0": "eval/base",\n  "50": }}\n')
    (d / "exists.md").write_text("keep me\n")
    return d


# --------------------------------------------------------------------------- data_prep builders
def test_malformed_jsonl_line_names_file_and_line(inputs, tmp_path):
    bad = inputs / "bad.jsonl"
    args = ["-m", "data_prep.dapo", "--input", str(bad), "--out", str(tmp_path / "o.parquet")]
    line = one_error_line(run(*args))
    assert line.startswith(f"error: {bad}:3: not valid JSON: Expecting property name enclosed in double quotes")
    assert line.endswith("(fix or delete the line; one JSON object per line)")
    for debug in (run(*args, "--debug"), run(*args, env={"OPSD_DEBUG": "1"})):
        assert debug.returncode == 2 and debug.stderr.startswith("Traceback (most recent call last):")
        assert "iter_jsonl" in debug.stderr and debug.stderr.splitlines()[-1] == line
    assert not (tmp_path / "o.parquet").exists()


def test_missing_field_strict_by_row_default_counted(inputs, tmp_path):
    src = inputs / "no_answer.jsonl"
    args = ["-m", "data_prep.dapo", "--input", str(src), "--out", str(tmp_path / "o.parquet")]
    assert one_error_line(run(*args, "--strict")) == (
        f"error: {src}:row 'a': field 'answer' (source column 'answer') is missing "
        "(fix the row, or leave out --strict to count and skip such rows)")
    assert one_error_line(run(*args)) == (
        f"error: {src}: no rows left to write to {tmp_path / 'o.parquet'}; rows dropped: missing_answer 2 "
        "(check the input file and the column / filter options)")
    assert one_error_line(run(*args[:2], "--input", str(inputs / "missing.jsonl"), *args[4:])).startswith(
        f"error: {inputs / 'missing.jsonl'}: no such input file")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["openthoughts_column", "eval_sets", "length_filter", "decontaminate", "sft"])
def test_other_data_prep_tools(inputs, tmp_path, case):
    argv, expected = {
        "openthoughts_column": (["-m", "data_prep.openthoughts", "--input", str(inputs / "no_answer.jsonl"),
                                 "--out", str(tmp_path / "o.parquet")],
                                f"error: {inputs / 'no_answer.jsonl'}: no column 'solution' for required field 'solution'"),
        "eval_sets": (["-m", "data_prep.eval_sets", "--eval-dir", str(inputs / "eval"), "--out-dir", str(tmp_path)],
                      f"error: {inputs / 'eval' / 'set.jsonl'}:2: not valid JSON"),
        "length_filter": (["-m", "data_prep.length_filter", "--input", str(inputs / "not.parquet"), "--tokenizer",
                           str(inputs / "tiny"), "--student-mode", "think", "--out", str(tmp_path / "o.parquet")],
                          f"error: {inputs / 'not.parquet'}: not a readable parquet file"),
        "decontaminate": (["-m", "data_prep.decontaminate", "--check", str(tmp_path / "none.parquet")],
                          f"error: {tmp_path / 'none.parquet'}: no such parquet file"),
        "sft": (["-m", "data_prep.sft", "--input", str(inputs / "tiny"), "--out", str(tmp_path / "o.parquet")],
                f"error: {inputs / 'tiny'}: is a directory, expected a parquet file"),
    }[case]
    assert one_error_line(run(*argv)).startswith(expected)


def test_builder_never_replaces_an_output_without_overwrite(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "problem": f"What is {i} times {i}?", "answer": str(i * i)}) + "\n"
                           for i in range(3)))
    out = tmp_path / "o.parquet"
    args = ["-m", "data_prep.dapo", "--input", str(src), "--out", str(out)]
    assert run(*args).returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.glob("o.*")}
    assert set(before) == {"o.parquet", "o.summary.json", "o.decontamination.json"}
    assert one_error_line(run(*args)) == f"error: {out}: exists and 2 more output(s) (pass --overwrite to replace it, " \
                                         "or choose another --out)"
    assert {p.name: p.read_bytes() for p in tmp_path.glob("o.*")} == before
    assert run(*args, "--overwrite").returncode == 0


# --------------------------------------------------------------------------- evaluation and analysis
@pytest.mark.slow
def test_evaluate_bad_benchmark_line_leaves_no_run_config(inputs, tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"id": "a", "problem": "What is 1+1?", "answer": "2"}\n{"id": "b", "problem": "x"}\n')
    out = tmp_path / "eval"
    # a hub-like model id: nothing is loaded before the benchmark is read
    line = one_error_line(run("scripts/evaluate.py", "run", "--model", "org/model", "--preset", "tiny_cpu",
                              "--benchmarks", str(bench), "--out-dir", str(out)))
    assert line == f"error: {bench}:2: field 'answer' is missing or empty (every line needs id, problem and answer)"
    assert not (out / "run_config.json").exists()  # a rerun with another model is not blocked


@pytest.mark.slow
@pytest.mark.parametrize("case", ["truncated", "no_tokenizer", "compare_missing"])
def test_evaluate_and_analyze_model_dirs(inputs, tmp_path, case):
    truncated = inputs / "truncated" / "model.safetensors"
    if case == "truncated":
        line = one_error_line(run("scripts/evaluate.py", "run", "--model", str(inputs / "truncated"), "--preset",
                                  "tiny_cpu", "--out-dir", str(tmp_path / "e")))
        size = truncated.stat().st_size
        assert line == (f"error: {truncated}: truncated: {size} bytes, its header needs {size + 100} "
                        "(the copy or download is incomplete: copy the model directory again)")
        assert not (tmp_path / "e").exists()
    elif case == "no_tokenizer":
        line = one_error_line(run("scripts/analyze_signals.py", "--model", str(inputs / "no_tokenizer"), "--data",
                                  str(inputs / "not.parquet"), "--out-dir", str(tmp_path / "s")))
        assert line.startswith(f"error: {inputs / 'no_tokenizer'}: no tokenizer files (tokenizer.json, ")
    else:
        line = one_error_line(run("scripts/evaluate.py", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")))
        assert line == f"error: {tmp_path / 'a.json'}: no such results.json (check the path)"


def test_monitor_run_bad_line_and_json_output(inputs, tmp_path):
    log = inputs / "log.jsonl"
    assert one_error_line(run("scripts/monitor_run.py", str(log))) == (
        f"error: {log}:2: not a JSON line (Expecting value, column 21) (fix or delete the line)")
    good = tmp_path / "run.jsonl"
    good.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 0.5}}) + "\n" for s in (1, 2))
                    + '{"step": 3, "da')  # a running run: the logger is writing line 3
    report = inputs / "exists.md"
    assert one_error_line(run("scripts/monitor_run.py", str(good), "--json", str(report))) == (
        f"error: {report}: exists (pass --overwrite to replace it, or choose another --json path)")
    assert report.read_text() == "keep me\n"
    fresh = tmp_path / "report.json"
    assert run("scripts/monitor_run.py", str(good), "--json", str(fresh)).returncode == 0
    assert json.loads(fresh.read_text())["run"]["steps"] == 2


@pytest.mark.slow
def test_make_figures_bad_spec_and_existing_png(inputs, tmp_path):
    spec = inputs / "spec.json"
    assert one_error_line(run("scripts/make_figures.py", "accuracy", "--spec", str(spec), "--out", str(tmp_path / "a.png"))
                          ).startswith(f"error: {spec}:2: not valid JSON: Expecting value")
    png = tmp_path / "b.png"
    png.write_bytes(b"old")
    assert one_error_line(run("scripts/make_figures.py", "accuracy", "--spec", str(spec), "--out", str(png))) == (
        f"error: {png}: exists (pass --overwrite to replace it, or choose another --out)")
    assert png.read_bytes() == b"old"


# --------------------------------------------------------------------------- sweeps, benchmarks, builders, toy world
@pytest.mark.parametrize("case", ["sweep", "bench", "tiny_model", "toy_experiments", "compare", "seed_study",
                                  "toy_student"])
@pytest.mark.slow
def test_option_and_output_errors_before_any_work(inputs, tmp_path, case):
    argv, expected = {
        "sweep": (["scripts/sweep.py", "plan", "--model", "nosuch", "--presets", "default", "--out", str(tmp_path)],
                  "error: unknown model preset 'nosuch'; known: ["),
        "bench": (["scripts/bench.py", "loss", "--n", "0"], "error: --n must be >= 1, got 0"),
        "tiny_model": (["-m", "recipe.toy.demo", "--out-dir", str(inputs / "demo")],  # demo/model holds a model
                       f"error: {inputs / 'demo' / 'model'}: is not empty (pass --overwrite"),
        "toy_experiments": (["scripts/toy_studies.py", "signals", "--model", str(tmp_path / "none")],
                            f"error: {tmp_path / 'none'}: no such model directory (check the path)"),
        "compare": (["scripts/toy_studies.py", "compare", "--out", str(inputs / "exists.md")],
                    f"error: {inputs / 'exists.md'}: exists (pass --overwrite to replace it, or choose another --out)"),
        "seed_study": (["scripts/toy_studies.py", "seeds", "--run-root", str(inputs)],
                       f"error: {inputs}: is not empty (pass another --run-root)"),
        "toy_student": (["-m", "recipe.toy.student", "--sft-steps", "0"],
                        "error: StudentConfig.sft_steps must be a positive integer, got 0"),
    }[case]
    assert one_error_line(run(*argv, env={"OPSD_CACHE": str(tmp_path / "cache")})).startswith(expected)
    assert not (tmp_path / "cache").exists()  # refused before the toy student (or anything) was built


def test_merge_checkpoint_refuses_partial_save_and_existing_target(inputs, tmp_path):
    import torch

    actor = tmp_path / "run" / "global_step_5" / "actor"
    actor.mkdir(parents=True)
    torch.save({"w": torch.zeros(2)}, actor / "model_world_size_2_rank_0.pt")  # rank 1 never written
    proc = run("bash", "scripts/merge_checkpoint.sh", str(tmp_path / "run" / "global_step_5"), str(tmp_path / "merged"))
    assert one_error_line(proc) == (f"error: {actor}: missing model shard(s) of rank [1] (world size 2) "
                                    "(the save was interrupted; resume from an earlier global_step_N)")
    assert not (tmp_path / "merged").exists()
    (tmp_path / "merged").mkdir()
    proc = run("bash", "scripts/merge_checkpoint.sh", str(actor), str(tmp_path / "merged"))
    assert one_error_line(proc).startswith(f"error: {tmp_path / 'merged'}: exists")
