"""One launch per checkpoint directory (recipe.launch.lock): the second is refused naming the first,
a killed launch leaves nothing locked, a trainer still running keeps the directory locked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from recipe.launch import lock

TRY = """
import sys
from recipe.launch.lock import LockedError, hold
try:
    with hold(sys.argv[1], command="second"):
        print("acquired")
except LockedError as err:
    print(err.line)
    sys.exit(2)
"""

HOLD = """
import sys, time
from recipe.launch.lock import hold
with hold(sys.argv[1], command="python -m recipe.launch opsd (first)"):
    print("held", flush=True)
    time.sleep(120)
"""


def try_from_another_process(ckpt) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TRY, str(ckpt)], capture_output=True, text=True, timeout=60)


def holding_process(ckpt) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(ckpt)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_launch_is_refused_naming_the_first(tmp_path):
    first = holding_process(tmp_path / "ckpt")
    try:
        second = try_from_another_process(tmp_path / "ckpt")
        record = json.loads((tmp_path / "ckpt" / lock.LOCK_FILE).read_text())
        assert second.returncode == 2 and second.stdout.strip() == (
            f"error: CKPT_DIR={tmp_path / 'ckpt'}: in use by another launch (pid {first.pid} on "
            f"{record['host']}, started {record['started_utc']}: python -m recipe.launch opsd (first)) (wait for it "
            "to end (or stop it), or set CKPT_DIR to another directory)")
    finally:
        first.kill()
        first.wait()


def test_a_killed_launch_leaves_the_directory_free(tmp_path):
    first = holding_process(tmp_path / "ckpt")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert try_from_another_process(tmp_path / "ckpt").stdout.strip() == "acquired"


def test_the_trainer_it_started_keeps_the_lock_after_the_launcher_is_gone(tmp_path):
    with lock.hold(tmp_path / "ckpt", command="launcher") as fd:
        with lock.hold(tmp_path / "ckpt", command="again"):  # re-entrant in the process holding it
            assert lock.held_fd(tmp_path / "ckpt") == fd
        trainer = subprocess.Popen(["sleep", "60"], pass_fds=(fd,))  # as recipe.launch.run.execute starts it
    try:
        assert lock.held_fd(tmp_path / "ckpt") is None
        assert try_from_another_process(tmp_path / "ckpt").returncode == 2
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 10
    while try_from_another_process(tmp_path / "ckpt").returncode != 0:
        assert time.monotonic() < deadline, "the lock outlived every process holding it"


@pytest.mark.parametrize("content", ["", "not json"])
def test_an_unreadable_lock_file_names_another_process(tmp_path, content):
    (tmp_path / lock.LOCK_FILE).write_text(content)
    assert lock.holder(tmp_path) is None
