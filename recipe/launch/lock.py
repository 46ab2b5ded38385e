"""One launch at a time per checkpoint directory (pure stdlib).

``hold(ckpt_dir, command=...)`` takes an exclusive ``flock`` on ``<ckpt_dir>/launch.lock`` and writes
who holds it (process, host, start time, command) into the file. A second launch on the same
directory fails at once with a ``LockedError`` naming the first. The kernel releases a ``flock``
when the last process holding its file descriptor exits, however it ends (SIGKILL included), so a
killed launch never leaves the directory locked; the file itself stays, unlocked. The launcher
passes the descriptor to the trainer it starts (``pass_fds``), so the directory stays locked while
a trainer whose launcher was killed is still running. Held again by the process that holds it, the
lock is re-entrant (a CPU demo holds it over training, merge and evaluation).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from recipe.common.cli import InputError

LOCK_FILE = "launch.lock"
_held: dict[str, int] = {}  # lock path -> descriptor, in this process


class LockedError(InputError):
    """The checkpoint directory is in use by another launch."""


def holder(ckpt_dir: str | os.PathLike) -> dict | None:
    """What the lock file says about the launch holding (or last holding) the directory."""
    try:
        return json.loads((Path(ckpt_dir) / LOCK_FILE).read_text() or "null")
    except (OSError, ValueError):
        return None


def held_fd(ckpt_dir: str | os.PathLike) -> int | None:
    """The descriptor of the lock this process holds on ``ckpt_dir`` (to pass to a child), or None."""
    return _held.get(str(Path(ckpt_dir).absolute() / LOCK_FILE))


@contextmanager
def hold(ckpt_dir: str | os.PathLike, *, command: str):
    """Hold the directory's lock for the block; raise LockedError when another launch holds it."""
    path = Path(ckpt_dir).absolute() / LOCK_FILE
    if str(path) in _held:  # re-entrant
        yield _held[str(path)]
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = holder(ckpt_dir) or {}
        who = (f"pid {other.get('pid')} on {other.get('host')}, started {other.get('started_utc')}: "
               f"{other.get('command')}") if other else "another process"
        raise LockedError(f"in use by another launch ({who})", file=f"CKPT_DIR={Path(ckpt_dir)}",
                          hint="wait for it to end (or stop it), or set CKPT_DIR to another directory") from None
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:  # a full disk: the lock holds, only the description of its holder is missing
        pass
    _held[str(path)] = fd
    try:
        yield fd
    finally:
        del _held[str(path)]
        os.close(fd)  # releases the lock (unless a child still holds the descriptor)
