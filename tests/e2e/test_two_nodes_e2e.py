"""One node with two ranks, then two Ray nodes on this machine, joined as a user joins a cluster (docs/cluster.md).

- One node, 2 FSDP ranks, 2 steps (``CPU_DEMO=tiny CPU_NUM_RANKS=2 STEPS=2``, greedy rollouts), the model given by a
  fake Hub id resolved offline from a temporary Hugging Face cache (sharded): every logged metric is there and
  finite (file logger, and verl's tensorboard logger with the same names and values); the teacher's float64
  parameter checksum equals the initial model's at every step while the actor's moves; after every step both
  rollout replicas serve bit-identical trainer weights (server sha256 log vs the FSDP checkpoint of that step);
  the data order is verl's seeded sampler order. Its step 1 is the reference of the two-node run.

A cluster of two raylets on this machine started with Ray's own ``ray start`` (one placeholder GPU
each, in a Ray temp dir of its own so no other ``ray.init`` on the machine finds it, with a token of
its own: Ray's token authentication), joined at the loopback address (``RAY_ADDRESS=127.0.0.1:<port>``;
Ray itself gives each node the machine's own address, never a loopback one), then the launcher with
``RAY_ADDRESS`` and ``NNODES=2``:

- OPSD and GRPO run 1 step with ``trainer.nnodes=2``: one FSDP rank per node (each node has exactly
  one GPU and the job takes two), FSDP over gloo across the nodes, the teacher on every rank, the
  rollout server on its rank's node. The raylets' environment has none of the CPU path's variables:
  the launch's environment reaches the workers through ``runtime_env``. Step 1 of OPSD equals step 1 of the
  one-node two-rank run (greedy rollouts, so both sample the same tokens) within float tolerance.
- The launch's end (normal, or the launcher killed) leaves the cluster's daemons running: a second
  launch joins the same cluster.
- Bad input on this path fails before verl starts, one line, exit 2: an address where nothing
  answers, NNODES larger than the cluster, a node whose Python cannot import the project.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import json

import pytest

from recipe.launch.processes import is_ray_daemon, kill_marked, pids_with
from tests.e2e.conftest import bound
from tests.e2e.opsd_checks import (HUB_ID, check_preflight_positions, check_step_metrics, expected_index_sums,
                                   float64_sums, hub_cache, vocab_size)

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
OPSD = "recipe/opsd/run_opsd.sh"
MARK = "OPSD_TEST_RAY_CLUSTER"
RAY = str(Path(sys.executable).with_name("ray"))
# Greedy rollouts: the one-node and two-node runs sample the same tokens whatever replica serves a prompt.
GREEDY = "actor_rollout_ref.rollout.temperature=0"
SAME_SAMPLES = [GREEDY, "trainer.save_freq=-1", "trainer.val_before_train=false"]
STEP1_KEYS = ("opsd/loss", "opsd/fwd_kl", "actor/grad_norm")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RayCluster:
    """``ray start`` head + workers on 127.0.0.1, every daemon marked ``MARK=<id>`` for the teardown."""

    def __init__(self, tmp: Path):
        self.mark = uuid.uuid4().hex
        self.temp_dir = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = tmp / "ray_start.log"
        # what every node, and every process that joins, needs (Ray 2.60 enables token authentication)
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}

    def _start(self, args: list[str], python_bin: str = RAY) -> None:
        # what a node's workers import is that node's Python (an inherited PYTHONPATH would hide a bare node)
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
        env |= {MARK: self.mark, "RAY_DISABLE_USAGE_STATS": "1", **self.auth}
        ports = [f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={_free_port()}",
                 f"--runtime-env-agent-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}"]
        with open(self.log, "a") as log:
            # every node in the same temp dir: `ray start` writes the cluster's address file there, not in
            # /tmp/ray, where any plain ray.init() on this machine would find and join the cluster
            subprocess.run([python_bin, "start", "--num-cpus=32", "--num-gpus=1",
                            f"--temp-dir={self.temp_dir}", "--disable-usage-stats", *ports, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                           check=True, timeout=120)

    def start_head(self) -> None:
        self._start(["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--ray-client-server-port={_free_port()}"])

    def add_node(self, ray_bin: str = RAY) -> None:
        self._start([f"--address={self.address}"], ray_bin)

    def daemons(self) -> list[int]:
        return [pid for pid in pids_with(variable=MARK, value=self.mark) if is_ray_daemon(pid)]

    def stop(self) -> None:
        left = kill_marked(variable=MARK, value=self.mark)  # this cluster's processes only (never `ray stop`)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        assert not left, left


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The cluster; started again (at most 3 times) when a node does not register with the head within Ray's
    fixed 30 s ("The current node timed out during startup"), which happens when the lane's other worker
    saturates the cores."""
    for attempt in range(1, 4):
        cluster = RayCluster(tmp_path_factory.mktemp("cluster"))
        try:
            cluster.start_head()
            cluster.add_node()
            break
        except subprocess.CalledProcessError:
            log = cluster.log.read_text(errors="replace")
            cluster.stop()
            if attempt == 3 or "timed out during startup" not in log:
                raise AssertionError(f"ray start failed:\n{log[-3000:]}") from None
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def one_node_two_ranks(run_cpu_verl, tiny_run_env, tiny_model_dir, tmp_path_factory):
    """``(VerlRun, ckpt_dir, weights_log)``: ``CPU_DEMO=tiny CPU_NUM_RANKS=2 STEPS=2`` with greedy rollouts, the model
    given by a Hub id (``MODEL_PATH=org/name``, as on GPU clusters) that resolves offline from a local Hugging Face
    cache, sharded."""
    root = tmp_path_factory.mktemp("one_node")
    ckpt, weights_log = root / "ckpt", root / "rollout_weights.jsonl"
    env = tiny_run_env(ckpt, weights_log, STEPS="2", CPU_NUM_RANKS="2")
    env |= {"MODEL_PATH": HUB_ID, "HF_HOME": str(hub_cache(tiny_model_dir, root / "hf_home")), "HF_HUB_OFFLINE": "1"}
    args = [GREEDY, "trainer.log_fingerprints=true", "trainer.save_freq=1", "trainer.logger=[console,file,tensorboard]"]
    return run_cpu_verl(OPSD, args, workdir=root, env=env, script=True, timeout=300), ckpt, weights_log


def test_two_ranks_two_steps(one_node_two_ranks, check_rollout_weights, tiny_initial_state, tiny_model_dir, tiny_data):
    run, ckpt, weights_log = one_node_two_ranks
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    # the pre-flight gate ran before Ray (on by default) on the tokenizer of the Hub id
    assert "[opsd] preflight: ok (4 rows, context full_solution, modes think/think)" in run.log, run.tail()
    # and its model-level part on the workers before the first rollout (the frozen teacher is the student now)
    check_preflight_positions(run, "frozen_initial")
    for step in (1, 2):
        check_step_metrics(run.metrics[step], step=step, vocab_size=vocab_size(tiny_model_dir))

    # verl's tensorboard logger wrote event files next to the checkpoints (the launcher's TENSORBOARD_DIR)
    # with the same metric names and values as the file logger.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(ckpt / "tensorboard"))
    events.Reload()
    for key in ("opsd/loss", "opsd/fwd_kl", "actor/grad_norm", "timing_s/step"):
        scalars = events.Scalars(key)
        assert [e.step for e in scalars] == [1, 2], key
        assert [e.value for e in scalars] == pytest.approx([run.metrics[1][key], run.metrics[2][key]], rel=1e-6), key

    # The teacher is the frozen initial model at every step; the actor moves at every step.
    initial_sum, initial_sqsum = float64_sums(tiny_model_dir)
    first, second = run.metrics[1], run.metrics[2]
    for m in (first, second):
        assert m["opsd/teacher_param_checksum"] == pytest.approx(initial_sum, rel=1e-12)
        assert m["opsd/teacher_param_sqsum"] == pytest.approx(initial_sqsum, rel=1e-12)
    assert first["opsd/teacher_param_checksum"] == second["opsd/teacher_param_checksum"]
    assert first["opsd/teacher_param_sqsum"] == second["opsd/teacher_param_sqsum"]
    assert first["opsd/actor_param_sqsum"] != pytest.approx(initial_sqsum, rel=1e-9)
    assert second["opsd/actor_param_sqsum"] != pytest.approx(first["opsd/actor_param_sqsum"], rel=1e-9)

    # After start-up (step 0) and after every step, each of the 2 replicas serves the trainer's weights.
    served = check_rollout_weights(
        weights_log, ckpt, expected_steps=[0, 1, 2], initial=tiny_initial_state
    )
    assert sorted(served) == [0, 1]
    assert sum(served[0][0][n] != served[0][2][n] for n in served[0][0]) >= len(served[0][0]) // 2

    # Data order: verl's seeded sampler.
    expected = expected_index_sums(tiny_data["train"], steps=2)
    seen = [(run.metrics[s]["training/data_index_sum"], run.metrics[s]["training/data_index_sqsum"]) for s in (1, 2)]
    assert seen == expected

    launches = [json.loads(line) for line in (ckpt / "run_times.jsonl").read_text().splitlines()]
    assert [(r["recipe"], r["n_devices"], r["exit_code"]) for r in launches] == [("opsd", 2, 0)]
    assert launches[0]["wall_time_s"] >= first["timing_s/step"] + second["timing_s/step"]


def _cluster_env(tiny_run_env, ckpt: Path, cluster: RayCluster, *, steps: int = 1) -> dict[str, str]:
    # no test hook: the second node's workers cannot import tests/hooks (the launcher forwards no PYTHONPATH)
    return tiny_run_env(ckpt, rollout_hook=False, RAY_ADDRESS=cluster.address, NNODES="2", STEPS=str(steps),
                        **cluster.auth)


def test_opsd_on_two_nodes_equals_one_node_two_ranks_and_grpo_runs(two_nodes, one_node_two_ranks, run_cpu_verl,
                                                                   tiny_run_env, tmp_path):
    daemons = two_nodes.daemons()
    assert len([p for p in daemons if Path(os.readlink(f"/proc/{p}/exe")).name == "raylet"]) == 2, daemons
    one_node = one_node_two_ranks[0]
    assert one_node.returncode == 0, one_node.tail()
    opsd = run_cpu_verl(OPSD, SAME_SAMPLES, workdir=tmp_path / "opsd", script=True,
                        env=_cluster_env(tiny_run_env, tmp_path / "opsd" / "ckpt", two_nodes), timeout=400)
    assert opsd.returncode == 0, opsd.tail()
    assert "[launch] Ray cluster at 127.0.0.1" in opsd.log and "2 nodes" in opsd.log, opsd.tail()
    assert sorted(opsd.metrics) == [1], opsd.tail()
    for key in STEP1_KEYS:
        assert opsd.metrics[1][key] == pytest.approx(one_node.metrics[1][key], rel=1e-5, abs=1e-7), key
    # the launch ended; the user's cluster did not
    assert set(daemons) <= set(two_nodes.daemons())

    grpo = run_cpu_verl("recipe/grpo_baseline/run_grpo.sh", ["trainer.save_freq=-1"], workdir=tmp_path / "grpo",
                        script=True, env=_cluster_env(tiny_run_env, tmp_path / "grpo" / "ckpt", two_nodes),
                        timeout=400)
    assert grpo.returncode == 0, grpo.tail()
    assert sorted(grpo.metrics) == [1], grpo.tail()
    assert set(daemons) <= set(two_nodes.daemons())
    print(f"[two nodes] opsd step 1 loss {opsd.metrics[1]['opsd/loss']:.6g} (one node, two ranks: "
          f"{one_node.metrics[1]['opsd/loss']:.6g}); timing_s/step opsd {opsd.metrics[1]['timing_s/step']:.1f} "
          f"grpo {grpo.metrics[1]['timing_s/step']:.1f}")


def test_killing_the_launcher_spares_the_cluster(two_nodes, tiny_run_env, tmp_path):
    """SIGTERM to the launcher once verl runs: the launch's processes end, the cluster's daemons stay."""
    daemons = set(two_nodes.daemons())
    launch_mark = uuid.uuid4().hex  # carried by the launcher and everything it starts on this machine
    env = {**os.environ, **_cluster_env(tiny_run_env, tmp_path / "ckpt", two_nodes, steps=50),
           "PYTHON": sys.executable, MARK + "_LAUNCH": launch_mark}
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(["bash", str(REPO_ROOT / "recipe/grpo_baseline/run_grpo.sh"), "trainer.save_freq=-1"],
                                    cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "[launch] Ray cluster at" not in log.read_text(errors="replace"):  # joined: verl is starting
            assert launcher.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        time.sleep(20)  # Ray and the workers are up on both nodes
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=bound(60)) != 0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert daemons <= set(two_nodes.daemons())
    # the launch's own processes (driver and what it started) are gone
    deadline = time.monotonic() + 30
    while own := pids_with(variable=MARK + "_LAUNCH", value=launch_mark):
        assert time.monotonic() < deadline, f"processes of the launch still running 30 s after its SIGTERM: {own}"
        time.sleep(1)


def _refused(env: dict[str, str], args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Launch OPSD expecting a refusal; every process it started (the cluster probe included) must be gone."""
    mark = uuid.uuid4().hex
    done = subprocess.run(["bash", str(REPO_ROOT / OPSD), *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, env={**os.environ, **env, "PYTHON": sys.executable, MARK + "_LAUNCH": mark},
                          timeout=240)
    assert pids_with(variable=MARK + "_LAUNCH", value=mark) == [], "the refused launch left processes running"
    errors = [text for text in done.stderr.splitlines() if text.startswith("error:")]
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    done.error = errors[0]
    return done


def test_bad_cluster_input_fails_before_verl_with_one_line(two_nodes, tiny_run_env, tmp_path):
    silent = f"127.0.0.1:{_free_port()}"
    cases = {
        "nothing answers": (tiny_run_env(tmp_path / "a", RAY_ADDRESS=silent, NNODES="2"), (),
                            f"RAY_ADDRESS={silent}: nothing answers"),
        # a batch the 3 ranks split (the launcher's rank-division check comes first)
        "NNODES > nodes": (tiny_run_env(tmp_path / "b", RAY_ADDRESS=two_nodes.address, NNODES="3", **two_nodes.auth),
                           ("data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6"),
                           "trainer.nnodes=3 (NNODES) needs 3 nodes with 1 GPU(s) each"),
    }
    for name, (env, args, line) in cases.items():
        assert line in _refused(env, args).error, name


def test_node_without_the_project_is_refused(two_nodes, tiny_run_env, tmp_path):
    """A third node whose Python has Ray (same version) but not the project: refused before verl, one line."""
    import sysconfig

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    # the main venv's packages as a plain path: its .pth files (the editable install of this repo) are not run
    (site / "main.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / "bin" / "ray").write_text(f"#!{venv / 'bin' / 'python'}\nfrom ray.scripts.scripts import main\nmain()\n")
    (venv / "bin" / "ray").chmod(0o755)
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import ray, verl.version; import recipe.launch"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert "No module named 'recipe.launch'" in check.stderr, check.stderr[-500:]  # (verl ships a `recipe` package)
    daemons_before = set(two_nodes.daemons())
    two_nodes.add_node(str(venv / "bin" / "ray"))
    try:
        env = tiny_run_env(tmp_path / "ckpt", rollout_hook=False, RAY_ADDRESS=two_nodes.address, NNODES="2",
                           **two_nodes.auth)
        done = _refused(env)
        assert "cannot import this project (recipe)" in done.error, done.error
    finally:  # the bare node's daemons only; the two-node cluster stays for the other tests
        for pid in set(two_nodes.daemons()) - daemons_before:
            try:
                if Path(os.readlink(f"/proc/{pid}/exe")).name == "raylet":
                    os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
