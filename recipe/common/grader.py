"""The one math grader, with two documented modes; Math-Verify decides equivalence.

Every path grades with ``grade(response, gold, mode=...)`` (a required keyword): evaluation and analysis
with ``mode="evaluation"`` (the final balanced ``\\boxed{}`` only), the GRPO reward
(``recipe.common.reward.compute_score``) with ``mode="reward"`` (the same, else the last ``Answer:`` line).
Math-Verify runs in killable worker subprocesses (``python -m recipe.common.grader --serve``), so grading
is bounded in time from threads, process pools and Ray workers, and never raises on model output.
The rules, the paper's wording and why: docs/evaluation.md#grading-two-modes.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

# Extracted answers longer than this are graded incorrect without parsing.
MAX_ANSWER_CHARS = 1000
# Default wall-clock bound of one Math-Verify comparison.
DEFAULT_TIMEOUT_S = 10.0
# Time allowed for a fresh worker to import math_verify and report ready.
WORKER_STARTUP_TIMEOUT_S = 120.0
# Address-space limit of a worker (huge exponents raise MemoryError instead of swapping).
WORKER_MEMORY_BYTES = 4 * 1024**3
# Concurrent worker processes per grading process (threads beyond this wait their turn).
MAX_WORKERS = int(os.environ.get("OPSD_GRADER_WORKERS", "2"))

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOX_RE = re.compile(r"\\boxed(?![A-Za-z])")
_ANSWER_RE = re.compile(r"(?<![A-Za-z])answer\s*:", re.IGNORECASE)
_INT_RE = re.compile(r"[+-]?\d+")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\left|\\right|\s+")
_BOX_GAP = " \t\r\n"  # whitespace allowed between `\boxed` and its `{`

# Grading modes (``grade(..., mode=...)``): see the module docstring.
EVALUATION = "evaluation"
REWARD = "reward"
MODES = (EVALUATION, REWARD)


def check_mode(mode) -> str:
    """``mode`` itself if it is one of ``MODES``, else ValueError naming the allowed values."""
    if mode not in MODES:
        raise ValueError(
            f"grader mode must be one of {MODES} ('evaluation': final balanced \\boxed{{}} only, the paper's "
            f"evaluation rule; 'reward': boxed, then the Answer: line, the paper's GRPO reward); got {mode!r}"
        )
    return mode


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one response.

    Attributes:
        score: 1.0 if correct else 0.0.
        acc: whether the extracted answer equals the ground truth.
        pred: the extracted answer (boxed content, or the ``Answer:`` text in reward mode),
            None if none found.
        has_boxed: whether the final balanced ``\\boxed{}`` holds an answer (``has_boxed_answer``:
            an empty ``\\boxed{}``, e.g. the instruction's echoed, is none); the same in both modes
            (the paper's "Format", the boxed-answer rate).
    """

    score: float
    acc: bool
    pred: str | None
    has_boxed: bool


def _match_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its closing ``}`` (escaped ``\\{`` / ``\\}`` ignored)."""
    match: dict[int, int] = {}
    stack: list[int] = []
    escaped = False
    for idx, char in enumerate(text):
        if escaped:  # the character after a backslash is never structural (`\{`, but `\\{` is)
            escaped = False
            continue
        if char == "\\":
            escaped = True
        elif char == "{":
            stack.append(idx)
        elif char == "}" and stack:
            match[stack.pop()] = idx
    return match


def extract_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}``, else None (``\\fbox`` and ``\\boxed 5`` do not count)."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    if not starts:
        return None
    braces = _match_braces(text)
    for start in reversed(starts):
        pos = start
        while pos < len(text) and text[pos] in _BOX_GAP:
            pos += 1
        close = braces.get(pos) if pos < len(text) and text[pos] == "{" else None
        if close is not None:
            return text[pos + 1 : close].strip()
    return None


def has_boxed_answer(boxed: str | None) -> bool:
    """Whether ``extract_boxed``'s result is a boxed answer: present and not empty. A model that
    echoes the prompt's "put your final answer within \\boxed{}" writes an empty box, which the
    boxed-answer rate must not count (SmolLM2 does: docs/real_model.md §5b)."""
    return bool(boxed)


def extract_answer_line(text: str) -> str | None:
    """Text after the last ``Answer:`` on its line, without ``$``, ``*`` or a final period."""
    last = None
    for last in _ANSWER_RE.finditer(text):
        pass
    if last is None:
        return None
    line_end = text.find("\n", last.end())
    answer = text[last.end() : None if line_end < 0 else line_end]
    # Strip to the fixed point of strip() / strip("*$") / rstrip("."): whitespace, `*`, `$` on the
    # left and those plus `.` on the right, in one pass each (repeating the three strips until
    # nothing changes is quadratic on a line like ".$.$.$...").
    start, end = 0, len(answer)
    while start < end and (answer[start].isspace() or answer[start] in "*$"):
        start += 1
    while end > start and (answer[end - 1].isspace() or answer[end - 1] in "*$."):
        end -= 1
    return answer[start:end] or None


def extract_answer(text: str, *, mode: str = EVALUATION) -> str | None:
    """The answer ``mode`` extracts: the final balanced boxed content, and in ``reward`` mode
    the ``Answer:`` line when there is no boxed answer.

    ``mode`` defaults to ``evaluation`` (boxed only); ``grade`` has no default.
    """
    boxed = extract_boxed(text)
    if check_mode(mode) == REWARD and boxed is None:
        return extract_answer_line(text)
    return boxed


def _normalise(answer: str) -> str:
    answer = _SPACING_RE.sub("", answer.strip().strip("$"))
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return answer.rstrip(".")


def fast_equal(pred: str, gold: str) -> bool | None:
    """Decide without Math-Verify when possible: True/False, or None (undecided)."""
    pred_n, gold_n = _normalise(pred), _normalise(gold)
    if pred_n == gold_n:
        return True
    if _INT_RE.fullmatch(pred_n) and _INT_RE.fullmatch(gold_n):
        return int(pred_n) == int(gold_n)
    return None


def _wrap(answer: str) -> str:
    return answer if "\\boxed" in answer else "\\boxed{" + answer + "}"


def verify_in_process(pred: str, gold: str) -> bool:
    """Math-Verify with its signal-based timeouts off. Unbounded in time: call via a worker."""
    from math_verify import parse, verify

    try:
        gold_parsed = parse(_wrap(gold), parsing_timeout=None)
        pred_parsed = parse(_wrap(pred), parsing_timeout=None)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:  # model output that breaks the parser is simply wrong
        return False


class _Worker:
    """One ``--serve`` subprocess answering JSON-line requests; killed on timeout."""

    def __init__(self):
        self.owner_pid = os.getpid()
        self.proc: subprocess.Popen | None = None
        self._buffer = b""
        # select.select() raises for descriptors >= FD_SETSIZE (1024), which a process with many
        # open files (Ray, vLLM) reaches; the default selector (epoll on Linux) has no such limit.
        self._selector: selectors.BaseSelector | None = None

    def _start(self) -> None:
        # The repository root goes first on the child's path, so the worker imports this very
        # module even when the parent found it through a runtime sys.path change.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recipe.common.grader", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=env,
        )
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        if self._read_line(time.monotonic() + WORKER_STARTUP_TIMEOUT_S) != b"ready":
            self.kill()
            raise RuntimeError(
                f"grader worker did not start within {WORKER_STARTUP_TIMEOUT_S:.0f} s "
                f"(`{sys.executable} -m recipe.common.grader --serve`); is math-verify installed?"
            )

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # worker died
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def verify(self, pred: str, gold: str, timeout_s: float) -> bool | None:
        """True/False, or None if the worker timed out or died (it is then killed)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        request = json.dumps({"pred": pred, "gold": gold}).encode() + b"\n"
        try:
            self.proc.stdin.write(request)
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            return None
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            self.kill()
            return None
        return bool(json.loads(line)["ok"])

    def kill(self) -> None:
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                stream.close()
        self.proc = None


class _WorkerPool:
    """At most ``MAX_WORKERS`` workers per process, shared by all threads.

    A forked child starts with an empty pool (``_reset`` runs after every ``os.fork``): the
    parent's pipes are not the child's, and a lock or queue another parent thread held at the
    moment of the fork would stay held in the child forever.
    """

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._created = 0

    def acquire(self) -> _Worker:
        with self._lock:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                if self._created < max(1, MAX_WORKERS):
                    self._created += 1
                    return _Worker()
        return self._idle.get()

    def release(self, worker: _Worker) -> None:
        if worker.owner_pid == os.getpid():
            self._idle.put(worker)

    def close(self) -> None:
        if self._pid != os.getpid():
            return
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


_POOL = _WorkerPool()
atexit.register(_POOL.close)
os.register_at_fork(after_in_child=_POOL._reset)


def answers_match(pred: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether an extracted answer equals the ground truth (bounded by ``timeout_s``)."""
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    decided = fast_equal(pred, gold)
    if decided is not None:
        return decided
    worker = _POOL.acquire()
    try:
        return bool(worker.verify(pred, gold, timeout_s))
    finally:
        _POOL.release(worker)


def grade(response: str, ground_truth, *, mode: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> GradeResult:
    """Grade one response against its ground truth (str, or a number that is converted).

    ``mode`` (required): ``"evaluation"`` (final balanced ``\\boxed{}`` only) or ``"reward"``
    (boxed, then the ``Answer:`` line); see the module docstring. Returns
    GradeResult(score, acc, pred, has_boxed). Never raises on the response text; the
    Math-Verify comparison is bounded by ``timeout_s`` seconds of wall-clock time (plus a
    one-off worker start-up after a timeout).
    """
    check_mode(mode)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    gold = str(ground_truth).strip()
    boxed = extract_boxed(response)
    pred = extract_answer_line(response) if boxed is None and mode == REWARD else boxed
    acc = pred is not None and gold != "" and answers_match(pred, gold, timeout_s=timeout_s)
    return GradeResult(score=1.0 if acc else 0.0, acc=acc, pred=pred, has_boxed=has_boxed_answer(boxed))


def _serve() -> None:
    """Worker loop: one JSON request per stdin line, one ``{"ok": bool}`` per stdout line."""
    import logging

    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    logging.disable(logging.WARNING)
    import math_verify  # noqa: F401  (import before reporting ready)

    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        try:
            ok = verify_in_process(request["pred"], request["gold"])
        except MemoryError:
            ok = False
        out.write(json.dumps({"ok": ok}).encode() + b"\n")
        out.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
