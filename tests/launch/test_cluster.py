"""A launch on a Ray cluster (recipe.launch.cluster): what it adds to the config, and every refusal's line.

The two-node runs themselves are tests/e2e/test_two_nodes_e2e.py; here the judgement of a probe's
report (pure), the checks that need no cluster, and the kill that spares a cluster's daemons.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from recipe.launch.cluster import (NodeReport, PreflightError, cluster_problems, forwarded_environment,
                                   join_overrides, preflight)
from recipe.launch.config import Settings, get_recipe
from recipe.launch.processes import LAUNCH_ID_ENV, is_ray_daemon, kill_launch
from recipe.launch.run import plan

OPSD = get_recipe("opsd")


def _node(ip="10.0.0.1", node_id="a" * 40, gpus=8.0, **values) -> NodeReport:
    report = {"ray": "2.60.0", "python": "3.11.7", "project": "0.1.0", "engine": "0.24.0"} | values
    return NodeReport(node_id=node_id, ip=ip, gpus=gpus, **report)


def _problems(nodes, *, nnodes=2, gpus_per_node=8, engine="vllm"):
    return cluster_problems(address="10.0.0.1:6379", nodes=nodes, ray_version="2.60.0", nnodes=nnodes,
                            gpus_per_node=gpus_per_node, engine=engine)


def test_a_cluster_that_fits_has_no_problem():
    assert _problems([_node(), _node(ip="10.0.0.2", node_id="b" * 40)]) == []


@pytest.mark.parametrize(("change", "line"), [
    ({"project": None}, "node 10.0.0.2 (bbbbbbbb) of the Ray cluster at 10.0.0.1:6379 cannot import this project (recipe)"),
    ({"ray": "2.59.0"}, "runs ray 2.59.0, this launch ray 2.60.0: install one Ray version on every node"),
    ({"engine": None}, "has no vllm (the rollout engine): `pip install -e '.[vllm]'` there"),
    ({"error": "no answer within 45 s"}, "could not run a task: no answer within 45 s"),
])
def test_each_bad_node_is_one_line_naming_it(change, line):
    problems = _problems([_node(), _node(ip="10.0.0.2", node_id="b" * 40, **change)])
    assert len(problems) == 1 and line in problems[0], problems


def test_nnodes_larger_than_the_cluster_names_what_it_has():
    problems = _problems([_node(), _node(ip="10.0.0.2", node_id="b" * 40, gpus=4.0)], nnodes=2)
    assert problems == ["trainer.nnodes=2 (NNODES) needs 2 nodes with 8 GPU(s) each (trainer.n_gpus_per_node); the Ray "
                        "cluster at 10.0.0.1:6379 has 1 (GPUs per node: 10.0.0.1 (aaaaaaaa) 8, 10.0.0.2 (bbbbbbbb) 4)"]
    # a CPU-only head node (0 GPUs) needs no engine and does not count
    assert _problems([_node(gpus=0.0, engine=None), _node(ip="10.0.0.2", node_id="b" * 40)], nnodes=1) == []


def test_forwarded_environment_is_the_launchs_not_the_users_whole_environment():
    env = {"HOME": "/root", "HF_TOKEN": "secret", "OPSD_WEIGHT_SYNC_TIMEOUT_S": "60", "VERL_PLATFORM": "cpu",
           "VERL_FILE_LOGGER_PATH": "/c/metrics.jsonl", "PYTHONUNBUFFERED": "1"}
    assert forwarded_environment(env, {"VERL_PLATFORM": "cpu"}) == {
        "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": "/c/metrics.jsonl", "PYTHONUNBUFFERED": "1",
        "OPSD_WEIGHT_SYNC_TIMEOUT_S": "60"}
    with pytest.raises(ValueError, match="may not hold"):
        join_overrides("h:1", {"X": 'a"b'})


@pytest.mark.slow
def test_a_gpu_launch_with_ray_address_joins_and_gives_every_worker_its_environment(launch_inputs, tmp_path):
    ckpt = tmp_path / "shared" / "ckpt"
    settings = Settings(device="gpu", model_path=str(launch_inputs.model), train_files=str(launch_inputs.train), ngpus=4,
                        nnodes=2, ray_address="10.0.0.1:6379", ckpt_dir=str(ckpt))
    launch = plan(OPSD, settings, [], detect_gpus=lambda: 0, environ=launch_inputs.env)
    ray_init = launch.config.ray_kwargs.ray_init
    assert ray_init.address == "10.0.0.1:6379" and ray_init.num_cpus is None
    env_vars = ray_init.runtime_env.env_vars
    assert env_vars.VERL_USE_EXTERNAL_MODULES == "recipe.rollout.extension"
    assert env_vars.VERL_FILE_LOGGER_PATH == str(ckpt / "metrics.jsonl")
    assert (launch.config.trainer.nnodes, launch.config.trainer.n_gpus_per_node) == (2, 4)
    # without RAY_ADDRESS the launch starts Ray itself, as before
    local = plan(OPSD, Settings(device="gpu", model_path=str(launch_inputs.model), train_files=str(launch_inputs.train),
                                ckpt_dir=str(tmp_path / "local")), [], detect_gpus=lambda: 0, environ=launch_inputs.env)
    assert "address" not in local.config.ray_kwargs.ray_init


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_refusals_that_need_no_cluster():
    python = sys.executable
    with pytest.raises(PreflightError) as error:
        preflight(python=python, device="cpu", engine="hf", address=None, nnodes=2, gpus_per_node=1)
    assert error.value.line.startswith("error: trainer.nnodes=2 (NNODES) runs on a Ray cluster")
    address = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(PreflightError, match=rf"RAY_ADDRESS={address}: nothing answers there"):
        preflight(python=python, device="cpu", engine="hf", address=address, nnodes=2, gpus_per_node=1)
    assert time.monotonic() - start < 10
    assert preflight(python=python, device="cpu", engine="hf", address=None, nnodes=1, gpus_per_node=1) is None


def test_a_gpu_launch_without_its_rollout_engine_is_refused():
    with pytest.raises(PreflightError) as error:  # this CPU venv has no sglang
        preflight(python=sys.executable, device="gpu", engine="sglang", address=None, nnodes=1, gpus_per_node=8)
    assert error.value.line == (f"error: actor_rollout_ref.rollout.name=sglang but sglang is not installed for "
                                f"{sys.executable}: `pip install torch==2.11.0 && pip install -e '.[sglang]'` "
                                "(docs/cluster.md)")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_launch_on_a_joined_cluster_never_kills_a_ray_daemon(tmp_path):
    """Both processes carry the launch's mark; only the one that is not a Ray daemon (raylet) dies."""
    env = {**os.environ, LAUNCH_ID_ENV: "run-x"}
    daemon = subprocess.Popen(["bash", "-c", "exec -a raylet sleep 60"], env=env, start_new_session=True)
    worker = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        time.sleep(0.3)
        assert is_ray_daemon(daemon.pid) and not is_ray_daemon(worker.pid)
        assert kill_launch(worker.pid, "run-x", joined_cluster=True) == []
        assert worker.wait(timeout=10) == -9
        assert daemon.poll() is None
        kill_launch(daemon.pid, "run-x")  # a launch that started its own Ray kills its daemons
        assert daemon.wait(timeout=10) == -9
    finally:
        for process in (daemon, worker):
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    from recipe.models.tiny import build_tiny_model
    from recipe.toy.demo import write_tiny_data

    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_model(root / "model", seed=0), write_tiny_data(root / "data")["train"]


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "line"), [
    ({}, "error: actor_rollout_ref.rollout.name=vllm but vllm is not installed for "),
    ({"NNODES": "2"}, "error: actor_rollout_ref.rollout.name=vllm but vllm"),  # the engine is checked first
])
def test_the_launcher_refuses_a_gpu_launch_without_its_engine_in_one_line(tiny_inputs, tmp_path, extra, line):
    model, train = tiny_inputs
    env = {**os.environ, "DEVICE": "gpu", "MODEL_PATH": str(model), "TRAIN_FILES": str(train),
           "CKPT_DIR": str(tmp_path / "ckpt"), "NGPUS": "1", **extra}
    done = subprocess.run([sys.executable, "-m", "recipe.launch", "opsd", "actor_rollout_ref.rollout.name=vllm"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(line), done.stderr[-2000:]
    assert not (tmp_path / "ckpt" / "run_times.jsonl").exists()  # nothing started


@pytest.mark.parametrize(("error", "line"), [
    ("RuntimeError: Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.11.7\n"
     "This process on node 10.0.0.9 was started with:\n    Ray: 2.60.0\n    Python: 3.11.7",
     "RAY_ADDRESS=10.0.0.1:6379: the cluster's Ray or Python differs from this launch's (/py): RuntimeError: Version "
     "mismatch: The cluster was started with: Ray: 2.59.0 Python: 3.11.7 This process on node 10.0.0.9 was started "
     "with: Ray: 2.60.0 Python: 3.11.7"),
    ("AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or incorrect",
     "RAY_ADDRESS=10.0.0.1:6379: the cluster wants its authentication token: set RAY_AUTH_MODE=token and "
     "RAY_AUTH_TOKEN (or ~/.ray/auth_token) as on its nodes (Ray's token authentication)"),
])
def test_a_cluster_that_refuses_the_probe_is_one_line(monkeypatch, error, line):
    """What the probe's ray.init raises (Ray's own version check, its token check) becomes the launch's line."""
    from recipe.launch import cluster

    monkeypatch.setattr(cluster, "address_answers", lambda address: True)
    monkeypatch.setattr(cluster, "probe_cluster", lambda **kwargs: {"error": error})
    with pytest.raises(PreflightError) as refused:
        preflight(python="/py", device="cpu", engine="hf", address="10.0.0.1:6379", nnodes=2, gpus_per_node=1)
    assert refused.value.line == f"error: {line}"


def test_the_cluster_probe_runs_outside_the_checkout(tmp_path):
    """Ray puts its driver's working directory on every worker's sys.path: a probe run from the checkout would
    find the project on a node that has not installed it. A stand-in python prints its working directory."""
    from pathlib import Path

    from recipe.launch import cluster

    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "PROBE {\\"cwd\\": \\"$(pwd)\\"}"\n')
    fake.chmod(0o755)
    report = cluster.probe_cluster(python=str(fake), address="127.0.0.1:1", engine=None, timeout_s=30)
    repo = Path(__file__).resolve().parents[2]
    assert not Path(report["cwd"]).resolve().is_relative_to(repo) and Path(report["cwd"]) != Path.cwd()
    assert not Path(report["cwd"]).exists()  # a temporary directory, removed afterwards
