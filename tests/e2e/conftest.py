"""Shared fixtures of the end-to-end (Ray + verl on CPU) tests.

- ``tiny_model_dir``: a tiny Qwen3 model + character tokenizer, built once per session
  (``recipe.common.tiny_model.build_tiny_model``, seed 0).
- ``tiny_data``: ``{"train": path, "val": path}`` toy addition parquet files in the
  project's verl schema (``build_tiny_parquet``: 64 train / 16 val rows).
- ``run_cpu_verl``: runs a verl entry point (``python -m <module>``) or a bash script in a
  subprocess with ``recipe/common/cpu_env.sh`` sourced and its ``CPU_OVERRIDES`` appended
  (for ``python -m``), a file logger writing the metrics jsonl, and a timeout. Returns a
  ``VerlRun`` with the return code, the combined log and the metrics parsed per step.

Example::

    def test_two_steps(run_cpu_verl, tiny_model_dir, tiny_data, tmp_path):
        run = run_cpu_verl(
            "verl.trainer.main_ppo",
            [f"actor_rollout_ref.model.path={tiny_model_dir}", ...],
            workdir=tmp_path,
        )
        assert run.returncode == 0, run.tail()
        assert run.metrics[2]["timing_s/step"] > 0
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU_ENV = REPO_ROOT / "recipe" / "common" / "cpu_env.sh"


@dataclass
class VerlRun:
    """Outcome of one ``run_cpu_verl`` call."""

    returncode: int
    log: str
    metrics: dict[int, dict]
    metrics_path: Path
    log_path: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-lines:])


def read_metrics_jsonl(path: Path) -> dict[int, dict]:
    """verl's file logger output (``{"step": s, "data": {...}}`` per line) -> ``{step: metrics}``."""
    metrics: dict[int, dict] = {}
    if not path.exists():
        return metrics
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            metrics.setdefault(int(record["step"]), {}).update(record["data"])
    return metrics


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from recipe.common.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    from recipe.common.tiny_model import build_tiny_parquet

    train, val = build_tiny_parquet(tmp_path_factory.mktemp("tiny_data"), num_train=64, num_val=16, seed=0)
    return {"train": train, "val": val}


@pytest.fixture
def run_cpu_verl():
    """``run(target, args, *, workdir, env=None, timeout=240, script=False) -> VerlRun``.

    ``target`` is a module for ``python -m`` (CPU_OVERRIDES are appended before ``args``)
    or, with ``script=True``, a bash script path relative to the repo root (run as
    ``bash <script> <args>``; the script sources cpu_env.sh itself). The metrics jsonl is
    ``<workdir>/metrics.jsonl`` (``VERL_FILE_LOGGER_PATH``); add ``trainer.logger=[console,file]``.
    """

    def run(
        target: str,
        args: list[str],
        *,
        workdir: Path,
        env: dict[str, str] | None = None,
        timeout: float = 240,
        script: bool = False,
    ) -> VerlRun:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        metrics_path = workdir / "metrics.jsonl"
        log_path = workdir / "run.log"
        quoted = " ".join(shlex.quote(a) for a in args)
        if script:
            command = f"bash {shlex.quote(str(REPO_ROOT / target))} {quoted}"
        else:
            command = (
                f"source {shlex.quote(str(CPU_ENV))} && "
                f'exec {shlex.quote(sys.executable)} -m {shlex.quote(target)} "${{CPU_OVERRIDES[@]}}" {quoted}'
            )
        full_env = dict(os.environ)
        full_env.update(
            {"VERL_FILE_LOGGER_PATH": str(metrics_path), "RAY_DEDUP_LOGS": "0", "PYTHON": sys.executable}
        )
        full_env.update(env or {})
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=REPO_ROOT,
                env=full_env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group (driver + Ray)
                proc.wait()
                returncode = -9
        return VerlRun(
            returncode=returncode,
            log=log_path.read_text(errors="replace"),
            metrics=read_metrics_jsonl(metrics_path),
            metrics_path=metrics_path,
            log_path=log_path,
        )

    return run
