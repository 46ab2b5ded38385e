"""A launch on a Ray cluster the user started (``ray start`` on every node; docs/cluster.md).

``RAY_ADDRESS`` (Ray's own variable, read by ``recipe.launch.config``) makes a launch join that cluster
instead of starting Ray itself: ``join_overrides`` gives verl's ``ray.init`` the address and every Ray
worker the launch's environment (``forwarded_environment``); ``preflight`` checks the engine and the
cluster before verl starts (not in ``--dry-run``), each failure one ``PreflightError`` line (exit 2).
The processes a launch may kill are its own (``recipe.launch.processes``): the cluster's daemons stay up
whatever happens to the launch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recipe.common.cli import InputError

ENGINE_EXTRAS = {"vllm": ".[vllm]", "sglang": ".[sglang]"}
# What reaches every worker of a joined cluster besides what the launcher set: the project's own
# variables (weight-push timeout, test hooks, ...). Anything else (HF_TOKEN, NCCL_*, ...): export it
# on each node before `ray start`, or pass ray_kwargs.ray_init.runtime_env.env_vars.NAME=value.
FORWARDED_PREFIXES = ("OPSD_",)
# The run's own files (the trainer runs in a Ray worker) and its unbuffered console.
RUN_VARIABLES = ("VERL_FILE_LOGGER_PATH", "TENSORBOARD_DIR", "WANDB_DIR", "PYTHONUNBUFFERED")
ENV_VARS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"
PROBE_TIMEOUT_S = 90.0
CONNECT_TIMEOUT_S = 5.0


class PreflightError(InputError):
    """A launch that cannot start on this machine or cluster (its message begins with the setting)."""


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` of a RAY_ADDRESS (``ray://`` client addresses are not supported: ValueError)."""
    if "://" in address:
        raise ValueError(f"RAY_ADDRESS={address!r}: give the head node's GCS address host:port "
                         "(the one `ray start --head` prints), not a Ray Client or dashboard URL")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"RAY_ADDRESS={address!r} is not host:port (the head node's `ray start --head --port`)")
    return host, int(port)


def forwarded_environment(env: Mapping[str, str], launcher_set: Mapping[str, str]) -> dict[str, str]:
    """The variables every worker of a joined cluster gets: what the launcher set, the run's files, OPSD_*."""
    names = [*launcher_set, *RUN_VARIABLES, *sorted(k for k in env if k.startswith(FORWARDED_PREFIXES))]
    return {name: env[name] for name in dict.fromkeys(names) if name in env}


def join_overrides(address: str, forwarded: Mapping[str, str]) -> list[str]:
    """Hydra overrides of a launch that joins the cluster at ``address``: the address and no resource counts
    (Ray refuses them when joining), and ``forwarded`` for every Ray worker of the job, on every node,
    through ``runtime_env.env_vars`` (a worker on a ``ray start`` node inherits the environment of that
    node's raylet, not the launcher's)."""
    host_port(address)
    overrides = [f"++ray_kwargs.ray_init.address={address}", "++ray_kwargs.ray_init.num_cpus=null",
                 "++ray_kwargs.ray_init.num_gpus=null"]
    for name, value in forwarded.items():
        if '"' in value or "\\" in value:
            raise ValueError(f"{name}={value!r}: a value forwarded to the cluster's workers may not hold '\"' or '\\'")
        overrides.append(f'++{ENV_VARS_KEY}.{name}="{value}"')
    return overrides


# ---------------------------------------------------------------- what the probe reports, judged


@dataclass(frozen=True)
class NodeReport:
    """One alive Ray node as the probe saw it (``error``: its task could not run there)."""

    node_id: str
    ip: str
    gpus: float
    ray: str | None = None
    python: str | None = None
    project: str | None = None
    engine: str | None = None
    error: str | None = None

    @property
    def name(self) -> str:
        return f"node {self.ip} ({self.node_id[:8]})"


def cluster_problems(*, address: str, nodes: Sequence[NodeReport], ray_version: str, nnodes: int,
                     gpus_per_node: int, engine: str | None) -> list[str]:
    """The reasons a launch of ``nnodes`` x ``gpus_per_node`` cannot run on these nodes (empty: it can)."""
    problems = []
    for node in nodes:
        if node.error:
            problems.append(f"{node.name} of the Ray cluster at {address} could not run a task: {node.error}")
        elif node.project is None:
            problems.append(f"{node.name} of the Ray cluster at {address} cannot import this project (recipe): "
                            "install it there (`pip install -e .` in the environment that ran `ray start` on that node)")
        elif node.ray != ray_version:
            problems.append(f"{node.name} of the Ray cluster at {address} runs ray {node.ray}, this launch ray "
                            f"{ray_version}: install one Ray version on every node")
        elif engine and node.gpus >= gpus_per_node and node.engine is None:
            problems.append(f"{node.name} of the Ray cluster at {address} has no {engine} (the rollout engine): "
                            f"`pip install -e '{ENGINE_EXTRAS.get(engine, engine)}'` there")
    usable = [node for node in nodes if node.gpus >= gpus_per_node]
    if len(usable) < nnodes:
        have = ", ".join(f"{n.ip} ({n.node_id[:8]}) {n.gpus:g}" for n in nodes) or "none"
        problems.append(f"trainer.nnodes={nnodes} (NNODES) needs {nnodes} nodes with {gpus_per_node} GPU(s) each "
                        f"(trainer.n_gpus_per_node); the Ray cluster at {address} has {len(usable)} (GPUs per node: {have})")
    return problems


# ---------------------------------------------------------------- the probe (a Ray job of its own)

# Run with the interpreter that runs verl as ``python -c PROBE address engine``; its functions live in
# __main__, so Ray ships them by value and a node without the project can still run them.
PROBE = r'''
import importlib.metadata, importlib.util, json, platform, sys
address, engine, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
def versions():
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None
    project = importlib.util.find_spec("recipe") is not None and importlib.util.find_spec("recipe.launch") is not None
    return {"ray": version("ray"), "python": platform.python_version(),
            "project": (version("opsd-verl") or "source") if project else None,
            "engine": (version(engine) or "unknown") if engine and importlib.util.find_spec(engine) else None}
import ray
try:
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
except Exception as error:
    print("PROBE " + json.dumps({"error": f"{type(error).__name__}: {error}"}))
    sys.exit(0)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
probe = ray.remote(num_cpus=0)(versions)
nodes = [n for n in ray.nodes() if n["Alive"]]
refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(): n for n in nodes}
ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
reports = []
for ref, node in refs.items():
    report = {"node_id": node["NodeID"], "ip": node["NodeManagerAddress"], "gpus": node["Resources"].get("GPU", 0.0)}
    if ref in ready:
        try:
            report.update(ray.get(ref))
        except Exception as error:
            report["error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    else:
        report["error"] = f"no answer within {timeout_s:.0f} s"
    reports.append(report)
print("PROBE " + json.dumps({"ray": ray.__version__, "nodes": reports}))
ray.shutdown()
'''


def probe_cluster(*, python: str, address: str, engine: str | None, timeout_s: float = PROBE_TIMEOUT_S,
                  env: Mapping[str, str] | None = None) -> dict:
    """Ask the cluster at ``address`` what each alive node has; the probe process is gone on return."""
    command = [python, "-c", PROBE, address, engine or "", str(timeout_s / 2)]
    # Ray puts its driver's working directory on every worker's sys.path: run from a checkout, the probe
    # would lend each node this checkout and find the project on a node that has not installed it.
    with tempfile.TemporaryDirectory(prefix="opsd_cluster_probe_") as neutral:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=neutral,
                                   env=dict(os.environ if env is None else env), start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except BaseException as error:  # a timeout, or the launcher interrupted: the probe goes too
            os.killpg(process.pid, 9)
            process.wait()
            if isinstance(error, subprocess.TimeoutExpired):
                raise PreflightError(f"RAY_ADDRESS={address}: the Ray cluster did not answer within {timeout_s:.0f} s")
            raise
    lines = [line for line in output.splitlines() if line.startswith("PROBE ")]
    if not lines:
        raise PreflightError(f"RAY_ADDRESS={address}: asking the Ray cluster failed: {output.strip()[-500:]}")
    return json.loads(lines[-1][len("PROBE "):])


def address_answers(address: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def engine_installed(python: str, engine: str) -> bool:
    """True when ``python`` (the interpreter that runs verl) can import ``engine``."""
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
    return subprocess.run([python, "-c", check, engine], capture_output=True, check=False).returncode == 0


def preflight(*, python: str, device: str, engine: str | None, address: str | None, nnodes: int,
              gpus_per_node: int, env: Mapping[str, str] | None = None) -> str | None:
    """The checks of a launch on a GPU or on a cluster, before verl starts (PreflightError on the first
    failure); returns the line describing the cluster joined (None without one).

    The rollout engine is installed for ``python`` (the interpreter that runs verl); the address answers;
    the cluster runs this launch's Ray; every node imports the project (and the engine); ``nnodes`` nodes
    with ``gpus_per_node`` GPUs exist. The probe that asked the cluster has exited on return (its own Ray
    job, nothing left running)."""
    if device == "gpu" and engine in ENGINE_EXTRAS and not engine_installed(python, engine):
        raise PreflightError(f"actor_rollout_ref.rollout.name={engine} but {engine} is not installed for {python}: "
                             f"`pip install torch==2.11.0 && pip install -e '{ENGINE_EXTRAS[engine]}'` (docs/cluster.md)")
    if address is None:
        if nnodes > 1:
            raise PreflightError(f"trainer.nnodes={nnodes} (NNODES) runs on a Ray cluster: start one with "
                                 "`ray start` on every node and set RAY_ADDRESS=<head>:<port> (docs/cluster.md)")
        return None
    if not address_answers(address):
        raise PreflightError(f"RAY_ADDRESS={address}: nothing answers there (is `ray start --head --port` running "
                             "on that host, and is the port reachable from here?)")
    report = probe_cluster(python=python, address=address, engine=engine if device == "gpu" else None, env=env)
    if "error" in report:
        first = report["error"].splitlines()[0]
        if "version mismatch" in report["error"].lower():
            detail = " ".join(report["error"].split())
            raise PreflightError(f"RAY_ADDRESS={address}: the cluster's Ray or Python differs from this launch's "
                                 f"({python}): {detail[:400]}")
        if "authentication" in report["error"].lower():
            raise PreflightError(f"RAY_ADDRESS={address}: the cluster wants its authentication token: set RAY_AUTH_MODE=token "
                                 "and RAY_AUTH_TOKEN (or ~/.ray/auth_token) as on its nodes (Ray's token authentication)")
        raise PreflightError(f"RAY_ADDRESS={address}: could not join the Ray cluster: {first}")
    nodes = [NodeReport(**node) for node in report["nodes"]]
    problems = cluster_problems(address=address, nodes=nodes, ray_version=report["ray"], nnodes=nnodes,
                                gpus_per_node=gpus_per_node, engine=engine if device == "gpu" else None)
    if problems:
        raise PreflightError(problems[0])
    gpus = ", ".join(f"{node.ip} ({node.node_id[:8]}) {node.gpus:g}" for node in nodes)
    return (f"Ray cluster at {address}: {len(nodes)} nodes, GPUs per node: {gpus}; ray {report['ray']} and this "
            f"project on every node; the launch uses {nnodes} x {gpus_per_node}")
