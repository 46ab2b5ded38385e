"""Killing a launch reaches the processes Ray starts outside the launch's process group
(recipe.launch.processes, recipe.launch.run.execute)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from recipe.launch.config import Settings, get_recipe
from recipe.launch.processes import LAUNCH_ID_ENV, kill_launch, pids_with
from recipe.launch.run import execute, plan

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")

# A "driver" that starts a "Ray worker" in a session of its own (as Ray's raylet does), writes the
# worker's pid to argv[1], then sleeps argv[2] seconds.
DRIVER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(float(sys.argv[2]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (dead, not yet reaped) counts as gone
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(path, timeout_s=30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


def _start_driver(tmp_path, launch_id: str, sleep_s: float):
    env = {**os.environ, LAUNCH_ID_ENV: launch_id}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / f"{launch_id}.pid"), str(sleep_s)],
                              env=env, start_new_session=True)
    return driver, _wait_for(tmp_path / f"{launch_id}.pid")


def test_kill_launch_reaches_a_worker_in_its_own_session_and_spares_other_launches(tmp_path):
    driver, worker = _start_driver(tmp_path, "run-a", 120)
    other_driver, other_worker = _start_driver(tmp_path, "run-b", 120)
    try:
        assert set(pids_with(variable=LAUNCH_ID_ENV, value="run-a")) == {driver.pid, worker}
        os.killpg(driver.pid, 9)  # what the launcher did before: the worker survives its group's kill
        driver.wait()
        assert _alive(worker)
        assert kill_launch(driver.pid, "run-a") == []
        assert not _alive(worker)
        assert _alive(other_driver.pid) and _alive(other_worker)
    finally:
        kill_launch(other_driver.pid, "run-b")
        other_driver.wait()


INPUTS = None  # tests/launch/conftest.py launch_inputs


@pytest.fixture(autouse=True)
def _inputs(launch_inputs):
    global INPUTS
    INPUTS = launch_inputs


def _launch(tmp_path, seconds: float):
    launch = plan(get_recipe("opsd"), Settings(device="cpu", model_path=str(INPUTS.model), train_files=str(INPUTS.train),
                                               ckpt_dir=str(tmp_path / "ckpt")), [], environ=INPUTS.env)
    return dataclasses.replace(launch, command=[sys.executable, "-c", DRIVER, str(tmp_path / "worker.pid"),
                                                str(seconds)])


@pytest.mark.slow
def test_execute_kills_what_a_finished_driver_left_running(tmp_path, capsys):
    record = execute(_launch(tmp_path, 0))
    worker = int((tmp_path / "worker.pid").read_text())
    assert record["exit_code"] == 0
    assert not _alive(worker)
    assert "[launch] killed 1 processes the launch left running" in capsys.readouterr().out


@pytest.mark.slow
def test_execute_timeout_kills_the_driver_and_its_workers(tmp_path):
    record = execute(_launch(tmp_path, 120), log=tmp_path / "train.log", timeout_s=3)
    worker = int((tmp_path / "worker.pid").read_text())
    assert record["exit_code"] == -9
    assert not _alive(worker)


# A "driver" whose ray.init fails as Ray's does when its node misses the 30 s start-up wait, argv[2] times
# (counted in the file argv[1]); then it succeeds.
RAY_START_FAILS = """
import pathlib, sys
count = pathlib.Path(sys.argv[1])
runs = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(runs))
if runs <= int(sys.argv[2]):
    print("Exception: The current node timed out during startup. This could happen because some of the raylet "
          "failed to startup or the GCS has become overloaded.")
    sys.exit(1)
print("trained")
"""


@pytest.mark.slow
@pytest.mark.parametrize("failures, exit_code, runs", [(1, 0, 2), (2, 1, 2)])
def test_a_driver_whose_ray_node_missed_its_start_up_wait_is_started_once_more(tmp_path, capsys, failures, exit_code,
                                                                                runs):
    launch = dataclasses.replace(_launch(tmp_path, 0), command=[sys.executable, "-c", RAY_START_FAILS,
                                                                str(tmp_path / "runs"), str(failures)])
    record = execute(launch, log=tmp_path / "train.log")
    assert record["exit_code"] == exit_code and int((tmp_path / "runs").read_text()) == runs
    assert capsys.readouterr().out.count("[launch] Ray's node did not register within Ray's fixed 30 s") == 1
    assert (tmp_path / "train.log").read_text().count("timed out during startup") == failures


@pytest.mark.slow
def test_a_driver_failing_otherwise_is_not_started_again(tmp_path):
    fails = "import sys; open(sys.argv[1], 'a').write('run'); print('ValueError: bad value'); sys.exit(1)"
    launch = dataclasses.replace(_launch(tmp_path, 0), command=[sys.executable, "-c", fails, str(tmp_path / "runs")])
    assert execute(launch, log=tmp_path / "train.log")["exit_code"] == 1
    assert (tmp_path / "runs").read_text() == "run"
