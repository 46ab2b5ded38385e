"""One clear line for a user's input error, in every command-line tool of the project (pure stdlib).

A CLI raises :class:`InputError` (a full disk: :class:`NoSpaceError`) for anything wrong in what the user
gave it; :func:`run` turns it into one ``error: <file>[:<line> | :row '<id>']: <what> (<fix>)`` line on
stderr and exit code 2, any other exception keeps its traceback (docs/errors_and_outputs.md). Also the
readers and guards the tools share (:func:`iter_jsonl`, :func:`read_json`, :func:`require_file`,
:func:`refuse_overwrite`, :func:`require_space`, :func:`on_full_disk`). Each script ends with::

    if __name__ == "__main__":
        sys.exit(cli.run(main))        # main(argv: list[str]) -> int | None
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEBUG_FLAG = "--debug"
DEBUG_ENV = "OPSD_DEBUG"
EXIT_INPUT_ERROR = 2
DEBUG_HELP = f"show the Python traceback of an input error (or set {DEBUG_ENV}=1)"


class InputError(ValueError):
    """Something wrong in what the user gave a tool, located and with a way out.

    Args:
        what: what is wrong, e.g. ``"not valid JSON: Expecting ',' delimiter (column 12)"``.
        file: the file (or directory, or command-line option) it is about.
        line: 1-based line number in ``file`` (kept as ``line_number``).
        row: row id in ``file`` (used when there is no line number).
        hint: how to fix it, e.g. ``"pass --overwrite to replace it"``.
        detail: more lines printed after the error line (a diff), or None.

    A ``ValueError`` so that library callers catching ``ValueError`` keep working.
    """

    def __init__(self, what: str, *, file: str | os.PathLike | None = None, line: int | None = None,
                 row: str | None = None, hint: str | None = None, detail: str | None = None):
        self.what, self.file, self.line_number, self.row, self.hint = what, file, line, row, hint
        self.detail = detail
        super().__init__(self.message)

    @property
    def location(self) -> str:
        where = str(self.file) if self.file is not None else ""
        if self.line_number is not None:
            where += f":{self.line_number}"
        elif self.row is not None:
            where += f":row {self.row!r}" if where else f"row {self.row!r}"
        return where

    @property
    def message(self) -> str:
        text = f"{self.location}: {self.what}" if self.location else self.what
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(text.split())  # one line, whatever the parts held

    def __str__(self) -> str:
        return self.message

    @property
    def line(self) -> str:
        """What every entry point prints for it (exit code 2): the line ``error: <where>: <what> (<fix>)``, then
        ``detail`` if any."""
        return f"error: {self.message}" + (f"\n{self.detail}" if self.detail else "")

    def located(self, *, file: str | os.PathLike | None = None, line: int | None = None,
                row: str | None = None) -> InputError:
        """A copy of this error with the location parts it lacks filled in (same class)."""
        new = copy.copy(self)
        new.file = self.file if self.file is not None else file
        new.line_number = self.line_number if self.line_number is not None else line
        new.row = self.row if self.row is not None else row
        new.args = (new.message,)
        return new


def error_line(err: BaseException) -> str:
    """What an entry point prints for a user error: an ``InputError``'s line, else ``error: <its message>`` on one
    line (a ValueError of a config check, whose message begins with the setting)."""
    return err.line if isinstance(err, InputError) else "error: " + " ".join(str(err).split())


class MissingInputError(InputError, FileNotFoundError):
    """An input file or directory that does not exist."""


class OutputExistsError(InputError, FileExistsError):
    """An output that exists and would be replaced without ``--overwrite``."""


class NoSpaceError(InputError):
    """The file system of an output has less free space than a write needs (before or during it)."""


# --------------------------------------------------------------------------- running a CLI
def split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (only before a ``--``), and whether it was there."""
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    head = [arg for arg in argv[:end] if arg != DEBUG_FLAG]
    return head + argv[end:], len(head) != end


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def add_debug_argument(parser) -> None:
    """List ``--debug`` in ``parser``'s help (``run`` removes it from argv before parsing)."""
    parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)


def run(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; an :class:`InputError` becomes one ``error: ...`` line and exit code 2."""
    argv, flag = split_debug(sys.argv[1:] if argv is None else argv)
    debug = debug_enabled(flag)
    try:
        return main(argv) or 0
    except InputError as err:
        if debug:
            traceback.print_exc()
        print(err.line, file=sys.stderr, flush=True)
        return EXIT_INPUT_ERROR


def dispatch(commands: dict[str, tuple[str, str]], argv: Sequence[str], *, description: str) -> int:
    """``<script> <command> [args]``: run the command's ``main(args)``.

    ``commands``: ``{name: ("module:function", one-line help)}``; the module is imported only when
    its command runs. ``--help`` (or nothing) lists the commands; an unknown one is an input error.
    """
    argv = list(argv)
    script = Path(sys.argv[0]).name
    if not argv or argv[0] in ("-h", "--help"):
        width = max(len(name) for name in commands)
        print(f"usage: {script} <command> [options]   ({script} <command> --help: its options)\n\n{description}\n")
        print("\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in commands.items()))
        return 0 if argv else EXIT_INPUT_ERROR
    name, rest = argv[0], argv[1:]
    if name not in commands:
        raise InputError(f"unknown command {name!r}", hint=f"one of {', '.join(commands)}")
    module, _, function = commands[name][0].partition(":")
    import importlib

    sys.argv[0] = f"{sys.argv[0]} {name}"  # argparse's prog: "<script> <command>"
    return getattr(importlib.import_module(module), function)(rest) or 0


@contextmanager
def reraise_as_input(*types: type[BaseException], file: str | os.PathLike | None = None, hint: str | None = None):
    """Inside the block, an exception of ``types`` is an input error about ``file``.

    Use it around ONE call whose only failures of that type are input validation (a config
    dataclass built from options, a loader of one user file), never around a whole program.
    """
    try:
        yield
    except InputError as err:
        if err.file is None and file is not None:
            raise err.located(file=file) from err
        raise
    except types as err:
        what = str(err) if str(err) else type(err).__name__
        if file is not None and what.startswith(f"{file}: "):
            what = what[len(f"{file}: "):]
        cls = MissingInputError if isinstance(err, FileNotFoundError) else (
            OutputExistsError if isinstance(err, FileExistsError) else InputError)
        raise cls(what, file=file, hint=hint) from err


# --------------------------------------------------------------------------- inputs
def require_file(path: str | os.PathLike, *, what: str = "file", hint: str | None = None) -> Path:
    """``path`` as a Path if it is an existing file, else a :class:`MissingInputError`."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"is a directory, expected a {what}", file=path, hint=hint)
    if not path.is_file():
        raise MissingInputError(f"no such {what}", file=path, hint=hint or "check the path")
    return path


def _json_error(err: json.JSONDecodeError) -> str:
    return f"not valid JSON: {err.msg} (column {err.colno})"


def iter_jsonl(path: str | os.PathLike, *, what: str = "JSONL file") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of every non-blank line; a bad line is an error naming file and line."""
    path = require_file(path, what=what)
    with open(path, encoding="utf-8") as handle:
        lines = enumerate(handle, 1)
        while True:
            try:
                line_no, line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError:
                raise InputError("not UTF-8 text", file=path, hint=f"pass a UTF-8 {what}") from None
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))  # columns of a cut-off line point at its end
            except json.JSONDecodeError as err:
                raise InputError(_json_error(err), file=path, line=line_no,
                                 hint="fix or delete the line; one JSON object per line") from None
            if not isinstance(value, dict):
                raise InputError(f"expected a JSON object, got {type(value).__name__}", file=path, line=line_no,
                                 hint="one JSON object per line")
            yield line_no, value


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> Any:
    """The value of a JSON file; missing file or bad JSON is an error naming file and line."""
    path = require_file(path, what=what)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", file=path, hint=f"pass a UTF-8 {what}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(_json_error(err), file=path, line=err.lineno, hint=f"fix the {what}") from None


# --------------------------------------------------------------------------- outputs
def refuse_overwrite(paths: Iterable[str | os.PathLike], *, overwrite: bool, flag: str = "--overwrite",
                     other: str = "another output path") -> None:
    """Fail before any work when an output exists and ``overwrite`` is off (names the first one)."""
    if overwrite:
        return
    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing:
        more = f" and {len(existing) - 1} more output(s)" if len(existing) > 1 else ""
        raise OutputExistsError(f"exists{more}", file=existing[0], hint=f"pass {flag} to replace it, or choose {other}")


def refuse_nonempty_dir(path: str | os.PathLike | None, *, flag: str) -> None:
    """Fail when ``path`` is a directory that already holds something (a run directory is never reused)."""
    if path is not None and Path(path).is_dir() and any(Path(path).iterdir()):
        raise OutputExistsError("is not empty", file=path, hint=f"pass another {flag}")


# --------------------------------------------------------------------------- disk space
# errno values of a full file system (ENOSPC) and of an exhausted quota (EDQUOT)
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# what torch.save / safetensors / the OS print when a write hits a full disk (torch's zip writer loses the errno)
FULL_DISK_TEXTS = ("No space left on device", "Disk quota exceeded", "file write failed")


def human_bytes(count: float) -> str:
    """``1536 -> '1.5 KB'`` (powers of 1024; B, KB, MB, GB, TB)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TB"


def existing_ancestor(path: str | os.PathLike) -> Path:
    """``path`` or its nearest existing parent (the file system an output not yet created will be on)."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes available to this user on the file system of ``path`` (which need not exist yet)."""
    return shutil.disk_usage(existing_ancestor(path)).free


def is_full_disk(err: BaseException) -> bool:
    """An OSError of a full disk or quota, or an error whose text says so (torch's zip writer)."""
    if isinstance(err, OSError) and err.errno in FULL_DISK_ERRNOS:
        return True
    return any(text in str(err) for text in FULL_DISK_TEXTS)


def free_inodes(path: str | os.PathLike) -> int:
    """Files that can still be created on the file system of ``path`` (a full inode table is a full disk too)."""
    return os.statvfs(existing_ancestor(path)).f_favail


def no_space(directory: str | os.PathLike, *, needed: int | None, what: str,
             hint: str = "free space there or choose another directory, then run the same command again") -> NoSpaceError:
    """The error of ``what`` not fitting on the file system of ``directory`` (needed: bytes, None: unknown)."""
    need = f"needs ~{human_bytes(needed)}, " if needed is not None else ""
    inodes = " and no free inodes (too many files)" if free_inodes(directory) == 0 else ""
    return NoSpaceError(f"no space left for {what}: {need}{human_bytes(free_bytes(directory))} free{inodes}",
                        file=directory, hint=hint)


def require_space(directory: str | os.PathLike, needed: int, *, what: str, hint: str | None = None) -> None:
    """Raise :class:`NoSpaceError` before writing ``what`` when ``needed`` bytes do not fit in ``directory``."""
    if free_bytes(directory) < needed:
        raise no_space(directory, needed=needed, what=what, **({"hint": hint} if hint else {}))


@contextmanager
def on_full_disk(directory: str | os.PathLike, *, what: str, needed=None, hint: str | None = None):
    """Inside the block, a write that hits a full disk becomes one :class:`NoSpaceError` line.

    ``needed``: bytes, or a callable returning them when the error happens (None: unknown).
    """
    try:
        yield
    except OSError as err:
        if not is_full_disk(err):
            raise
        amount = needed() if callable(needed) else needed
        raise no_space(directory, needed=amount, what=what, **({"hint": hint} if hint else {})) from err


class TolerantLog:
    """A launch's (or a merge's) log file that stops being written (one line says so) when its disk is full, so that
    the launcher keeps following the trainer instead of failing on its own log."""

    def __init__(self, path: Path):
        self.path, self.full = path, False
        self.sink = open(path, "a")

    def flush(self) -> None:  # every write is flushed
        pass

    def write(self, line: str) -> None:
        if self.full:
            return
        try:
            self.sink.write(line)
            self.sink.flush()
        except OSError as err:
            if not is_full_disk(err):
                raise
            self.full = True
            print(f"[launch] {self.path}: no space left, the rest of the trainer's output is not written there",
                  flush=True)

    def close(self) -> None:
        try:
            self.sink.close()
        except OSError:
            pass
