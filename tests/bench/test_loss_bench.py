"""``scripts/bench.py loss``: every implementation it times computes the loss it names (values and the
hidden-state gradient against the float64 reference), and the table has a row per configuration."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import loss

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("impl", loss.IMPLS)
def test_each_implementation_matches_the_float64_reference(impl):
    result = loss._worker(impl, n=24, vocab=97, hidden=16, chunk=5, repeats=1, ref_rows=24, threads=1)
    assert result["impl"] == impl and result["n"] == 24
    assert result["mean_value"] != 0.0
    assert result["err_values"] < 1e-5 and result["err_grad_h"] < 1e-5, result


@pytest.mark.slow
def test_the_table_has_every_configuration_and_exit_0():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "loss", "--n", "16", "--vocab", "64",
                          "--hidden", "8", "--chunk-size", "4", "--repeats", "1", "--ref-rows", "8", "--threads", "1"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.strip().startswith("16 ")]
    assert [row[1] for row in rows] == list(loss.IMPLS), run.stdout
    assert all(float(row[6]) < 1e-5 and float(row[7]) < 1e-5 for row in rows), run.stdout


def test_a_configuration_that_fails_makes_the_run_fail(monkeypatch, capsys):
    class Failed:
        returncode, stdout, stderr = 1, "", "TypeError: a broken implementation"

    monkeypatch.setattr(loss.subprocess, "run", lambda *a, **k: Failed())
    assert loss.main(["--n", "8", "--vocab", "16", "--hidden", "4", "--ref-rows", "8", "--impls", "naive", "fused"]) == 1
    captured = capsys.readouterr()
    assert "fused  failed (exit 1): TypeError: a broken implementation" in captured.out
    assert "2 configuration(s) did not finish" in captured.err
