"""``scripts/bench.py gpu``: its ``--smoke`` run (the GPU run's code on the CPU at tiny shapes) works without verl,
Ray, vLLM, OmegaConf, Hydra or pandas (a bare GPU machine has none of them), writes both tables, and every
implementation it times matches the float64 reference."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks import gpu
from recipe.analysis.memory_model import QWEN3, ModelShape
from recipe.common import cli

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("verl", "ray", "vllm", "omegaconf", "hydra", "pandas")

# the blocked packages are made absent, as on a bare GPU machine: every finder of sys.meta_path is wrapped so that it
# finds none of them (an import raises ModuleNotFoundError; importlib.util.find_spec, which torch and transformers use
# to probe for optional packages, answers None); scripts/bench.py then runs as from the command line
BLOCKED_RUN = textwrap.dedent("""
    import importlib.util, runpy, sys
    BLOCKED = {blocked!r}

    class Absent:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                return None
            return self.finder.find_spec(name, path, target)

        def __getattr__(self, attribute):
            return getattr(self.finder, attribute)

    for name in [m for m in sys.modules if m.partition(".")[0] in BLOCKED]:
        del sys.modules[name]
    sys.meta_path[:] = [Absent(finder) for finder in sys.meta_path]
    for name in BLOCKED:  # the blocking works (all but vllm are installed in the test environment)
        try:
            __import__(name)
        except ModuleNotFoundError:
            continue
        raise SystemExit(f"{{name}} was imported although it is blocked")
    assert importlib.util.find_spec("verl") is None
    sys.argv = ["scripts/bench.py", "gpu", "--smoke", "--out", {out!r}]
    try:
        runpy.run_path("scripts/bench.py", run_name="__main__")
    finally:
        print("loaded blocked:", sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED), file=sys.stderr)
""")


def test_smoke_runs_with_the_cluster_stack_blocked_and_matches_float64(tmp_path):
    out = tmp_path / "gpu_out"
    run = subprocess.run([sys.executable, "-c", BLOCKED_RUN.format(blocked=BLOCKED, out=str(out))],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loaded blocked: []" in run.stderr
    report = json.loads((out / "gpu_bench.json").read_text())
    assert (out / "gpu_bench.md").read_text() == run.stdout
    assert report["smoke"] and report["machine"]["torch"] and report["machine"]["date"]

    rows = {(r["n"], r["beta"], r["clip_tau"], r["impl"]): r for r in report["loss_rows"]}
    expected = {(n, beta, clip, impl) for n in gpu.SMOKE.token_counts for beta in gpu.BETAS for clip in gpu.CLIPS
                for impl in gpu.IMPLS if impl != "liger" or clip is None}
    assert set(rows) == expected
    for key, row in rows.items():
        if key[3] == "liger":  # the venv has no liger-kernel (and no CUDA)
            assert row["status"].startswith("skipped: liger-kernel"), row
            continue
        assert row["status"] == "ok", row
        errors = [row[f"err_{what}{suffix}"] for what in ("values", "grad_h") for suffix in ("", "_rounded")]
        assert max(errors) < 1e-5 and row["ms"] > 0, row
        assert row["loss_vs_fused"] is None if key[3] == "fused" else row["loss_vs_fused"] < 1e-5, row
        assert row["peak_gb"] is None  # no allocator statistics on the CPU

    assert [(r["model"], r["gradient_checkpointing"]) for r in report["memory_rows"]] == [
        (name, on) for name in gpu.SMOKE.models for on in (True, False)]
    for row in report["memory_rows"]:
        assert row["status"] == "ok" and row["predicted_gb"] > 0 and row["measured_gb"] is None, row
    assert "| 256 | 0.5 | 0.05 | fused |" in run.stdout and "| tiny Qwen3 (2 layers) | on |" in run.stdout


TINY = dataclasses.replace(gpu.SMOKE, hidden=4, vocab=16, token_counts=(8,), ref_rows=8, warmup=0, repeats=1)


def test_an_out_of_memory_or_failed_call_is_its_rows_status(monkeypatch):
    def measure(impl, inp, scale):  # receives what the patched _loss_fn returns: the implementation's name
        if impl == "naive":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        raise RuntimeError("a broken kernel")

    monkeypatch.setattr(gpu, "_loss_fn", lambda impl, *args: impl)
    monkeypatch.setattr(gpu, "measure", measure)
    statuses = {(r["impl"], r["status"]) for r in gpu.loss_rows(TINY, deadline=float("inf")) if r["impl"] != "liger"}
    assert statuses == {("naive", "OOM"), ("fused", "failed: RuntimeError: a broken kernel")}


def test_rows_past_the_time_budget_are_skipped():
    rows = gpu.loss_rows(TINY, deadline=0.0)
    assert {r["status"] for r in rows if r["impl"] != "liger"} == {"skipped: time budget spent (--budget-s)"}


def test_the_qwen3_configs_are_the_memory_models_shapes():
    assert ModelShape.from_hf_config(gpu.QWEN3_CONFIGS["Qwen3-1.7B"], name="Qwen3-1.7B") == QWEN3["Qwen3-1.7B"]
    assert gpu.GPU.hidden == QWEN3["Qwen3-1.7B"].hidden and gpu.GPU.vocab == QWEN3["Qwen3-1.7B"].vocab


@pytest.mark.parametrize("argv, message", [
    (["--smoke", "--repeats", "0"], "error: --repeats: must be >= 1, got 0"),
    (["--smoke", "--budget-s", "0"], "error: --budget-s: must be > 0, got 0.0"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.run(gpu.main, argv) == 2
    assert capsys.readouterr().err.strip() == message


def test_an_existing_report_is_not_replaced(tmp_path, capsys):
    (tmp_path / "gpu_bench.md").write_text("an earlier run")
    assert cli.run(gpu.main, ["--smoke", "--out", str(tmp_path)]) == 2
    assert "gpu_bench.md: exists" in capsys.readouterr().err
    assert (tmp_path / "gpu_bench.md").read_text() == "an earlier run"
