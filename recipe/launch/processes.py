"""The processes of one launch, found and killed together (Linux ``/proc``).

Ray's daemons and workers, started by the driver, leave the launch's session for process groups of their
own, so killing the group leaves them running (holding memory, and GPUs on a cluster). The launcher marks
every process of a launch through its environment (``LAUNCH_ID_ENV``); ``kill_launch`` kills every
process on this node that carries the mark, and never a Ray daemon (``is_ray_daemon``) of a cluster the
user started (``RAY_ADDRESS``, ``recipe.launch.cluster``): Ray ends the job's workers on every node when
the driver dies. ``run_marked`` starts and follows one such command (a launch's driver, a sweep's stage).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
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


# The daemons `ray start` runs on a node (ray 2.60): executables, scripts, and process titles.
RAY_DAEMON_EXECUTABLES = ("raylet", "gcs_server")
RAY_DAEMON_SCRIPTS = ("log_monitor.py", "autoscaler/_private/monitor.py", "dashboard/dashboard.py",
                      "dashboard/agent.py", "runtime_env/agent/main.py", "ray_process_reaper.py",
                      "ray/util/client/server")
RAY_DAEMON_TITLES = ("ray-dashboard-",)


def is_ray_daemon(pid: int, *, proc: Path = Path("/proc")) -> bool:
    """True for a Ray cluster daemon (raylet, GCS, dashboard, log monitor, agents), from its command line."""
    try:
        argv = [a.decode(errors="replace") for a in (proc / str(pid) / "cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return False
    if not argv:
        return False
    return (Path(argv[0]).name in RAY_DAEMON_EXECUTABLES or argv[0].startswith(RAY_DAEMON_TITLES)
            or any(arg.endswith(RAY_DAEMON_SCRIPTS) or "ray/util/client/server" in arg for arg in argv[1:3]))


def kill_marked(*, variable: str, value: str, attempts: int = 20, wait_s: float = 0.5,
                spare=lambda pid: False) -> list[int]:
    """SIGKILL every process marked ``variable=value`` (but those ``spare(pid)`` keeps) until none is
    left (new ones may start while the first die); returns the processes still alive after
    ``attempts`` rounds (empty: all gone)."""

    def marked() -> list[int]:
        return [pid for pid in pids_with(variable=variable, value=value) if pid != os.getpid() and not spare(pid)]

    empty_scans = 0
    for _ in range(attempts):
        pids = marked()
        if not pids:
            empty_scans += 1
            if empty_scans == 2:  # twice, wait_s apart: a process forked while its parent died is caught
                return []
            time.sleep(wait_s)
            continue
        empty_scans = 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(wait_s)
    return marked()


def kill_launch(process_group: int, launch_id: str, *, joined_cluster: bool = False) -> list[int]:
    """Kill the launch's process group, then every process of the launch outside it (Ray); a launch
    that joined a cluster spares every Ray daemon (the cluster is the user's)."""
    try:
        os.killpg(process_group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return kill_marked(variable=LAUNCH_ID_ENV, value=launch_id, spare=is_ray_daemon if joined_cluster else lambda pid: False)


def _kill(process: subprocess.Popen, launch_id: str, joined_cluster: bool) -> None:
    """Kill the command: its own process group and every process it started outside it (Ray's)."""
    left = kill_launch(process.pid, launch_id, joined_cluster=joined_cluster)
    if left:
        print(f"[launch] processes of the launch still alive after SIGKILL: {left}", flush=True)


def _kill_orphans(launch_id: str, joined_cluster: bool) -> None:
    """After the command exits: any process still carrying its mark (Ray daemons or workers a killed or crashed
    driver left behind) is killed, with a line saying so (a joined cluster's daemons never)."""
    spare = is_ray_daemon if joined_cluster else (lambda pid: False)
    orphans = [pid for pid in pids_with(variable=LAUNCH_ID_ENV, value=launch_id) if not spare(pid)]
    if orphans:
        left = kill_marked(variable=LAUNCH_ID_ENV, value=launch_id, spare=spare)
        print(f"[launch] killed {len(orphans) - len(left)} processes the launch left running (Ray daemons or "
              f"workers){f'; still alive: {left}' if left else ''}", flush=True)


def run_marked(command: list[str], *, cwd: str | Path, env: dict[str, str], sink=None, on_line=None,
               timeout_s: float | None = None, pass_fds: tuple[int, ...] = (), joined_cluster: bool = False) -> int:
    """Run ``command`` in a new session, every process it starts marked with a new ``LAUNCH_ID_ENV``; return its exit
    code. Its output goes to ``sink`` (``write``) line by line, each line also to ``on_line``; without ``sink`` to
    this console. After ``timeout_s``, or when this process is interrupted, every marked process is killed (exit
    code -9); so is any left running when the command exits."""
    launch_id = new_launch_id()
    process = subprocess.Popen(command, cwd=cwd, env={**env, LAUNCH_ID_ENV: launch_id}, start_new_session=True,
                               text=True, pass_fds=pass_fds, stdout=subprocess.PIPE if sink else None,
                               stderr=subprocess.STDOUT if sink else None)
    watchdog = threading.Timer(timeout_s, _kill, args=(process, launch_id, joined_cluster)) if timeout_s else None
    try:
        if watchdog:
            watchdog.start()
        if sink is not None:
            for line in process.stdout:
                sink.write(line)
                if on_line is not None:
                    on_line(line)
        returncode = process.wait()
        _kill_orphans(launch_id, joined_cluster)
    except BaseException:
        _kill(process, launch_id, joined_cluster)
        raise
    finally:
        if watchdog:
            watchdog.cancel()
    return returncode
