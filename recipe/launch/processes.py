"""The processes of one launch, found and killed together.

The launcher starts verl in a new session, but that session does not hold the whole run: Ray's
daemons and workers, started by the driver, put themselves in process groups of their own, so a
kill of the launch's group leaves them running (holding memory, and GPUs on a cluster). Every
process of a launch inherits its environment, so the launcher marks it with ``LAUNCH_ID_ENV`` and
``kill_launch`` kills every process on this node whose environment carries the mark (Linux
``/proc``). Workers on other nodes of a ``ray start`` cluster are the job's and end with it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

LAUNCH_ID_ENV = "OPSD_LAUNCH_ID"


def new_launch_id() -> str:
    return uuid.uuid4().hex


def pids_with(*, variable: str, value: str, proc: Path = Path("/proc")) -> list[int]:
    """Processes whose environment holds ``variable=value`` (unreadable or vanished ones are skipped)."""
    entry_bytes = f"{variable}={value}".encode()
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                if entry_bytes in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def kill_marked(*, variable: str, value: str, attempts: int = 20, wait_s: float = 0.5) -> list[int]:
    """SIGKILL every process marked ``variable=value`` until none is left (new ones may start while
    the first die); returns the processes still alive after ``attempts`` rounds (empty: all gone)."""
    for _ in range(attempts):
        pids = [pid for pid in pids_with(variable=variable, value=value) if pid != os.getpid()]
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(wait_s)
    return [pid for pid in pids_with(variable=variable, value=value) if pid != os.getpid()]


def kill_launch(process_group: int, launch_id: str) -> list[int]:
    """Kill the launch's process group, then every process of the launch outside it (Ray)."""
    try:
        os.killpg(process_group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return kill_marked(variable=LAUNCH_ID_ENV, value=launch_id)
