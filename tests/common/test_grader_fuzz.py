"""Fuzz test of the grader: random inputs from threads and processes, bounded in count and time.

``fuzz_cases(seed, count)`` draws ``(response, gold, mode)`` triples from: random LaTeX
(fractions, roots, powers, braces, escaped braces, ``\\boxed`` / ``\\fbox`` in every form,
``Answer:`` lines, ``<think>`` tags), huge numbers, deep nesting and inputs aimed at quadratic or
backtracking behaviour of the extraction (long runs of one character, alternating strip
characters, thousands of unclosed boxes). Responses are at most ``MAX_CHARS`` characters.

Every call must return a well-formed ``GradeResult`` (never raise) within ``CALL_BOUND_S``
(the comparison timeout, a worker restart after a timeout on a shared 2-core machine, and
waiting for one of the ``MAX_WORKERS`` workers when more threads than workers grade), times
``LOAD_FACTOR`` (the end-to-end lane's launches share the cores: tests/e2e/conftest.py). The
fixed seed keeps CI reproducible; ``OPSD_GRADER_FUZZ_SEED`` / ``OPSD_GRADER_FUZZ_CASES``
change it. A bigger sweep, standalone (prints failures and the slowest cases)::

    python tests/common/test_grader_fuzz.py --seed 7 --count 2000

Findings (each has a regression test in this file, failing before its fix):
1. ``extract_answer_line`` repeated strip()/strip("*$")/rstrip(".") until nothing changed:
   quadratic on an ``Answer:`` line like ``5.$.$.$...`` (4 s at 500k characters; 75 s at 1.2M on the loaded shared machine, 0.3 s after the fix).
2. ``select.select`` raised ``ValueError: filedescriptor out of range`` in a process with more
   than 1024 open files (Ray and vLLM workers): the worker pipes are now read through
   ``selectors.DefaultSelector`` (epoll).
3. A process forked while another thread held the worker pool's lock hung forever on its first
   non-trivial comparison: the pool is now reset in the child by an ``os.register_at_fork`` hook.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from recipe.common import grader
from recipe.common.grader import EVALUATION, GradeResult, extract_boxed, grade

MAX_CHARS = 1_200_000
SEED = int(os.environ.get("OPSD_GRADER_FUZZ_SEED", "20261124"))
CASES = int(os.environ.get("OPSD_GRADER_FUZZ_CASES", "160"))
TIMEOUT_S = 1.0
LOAD_FACTOR = 3
CALL_BOUND_S = 12.0 * LOAD_FACTOR

_ATOMS = [
    "0", "1", "7", "42", "-3", "025", "3.14", "1/2", "x", "n", "\\pi", "\\infty", "e", "i", "\\%", "^\\circ",
    "\\cdot", "\\times", "+", "-", "=", ",", "(", ")", "[", "]", "\\left(", "\\right)", "\\{", "\\}", "\\\\",
    "{", "}", "$", "$$", " ", "\n", "\t", "٣", "１２", "∞", "√", "\x00", "\ud800", "\\text{ cm}", "\\mathrm{m}",
    "\\dfrac", "\\tfrac", "\\sqrt", "\\frac", "\\boxed", "\\fbox", "Answer:", "answer :", "**Final Answer:**",
    "<think>", "</think>", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\\,", "\\!", "\\;",
]
_GOLDS = ["204", "25", "-984", "0", "\\frac{1}{576}", "1-\\frac{2}{\\pi}", "\\sqrt{\\frac{95}{24}}",
          "2^{25} \\cdot 26!", "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}", "8\\sqrt{10}"]


def _number(rng: random.Random) -> str:
    digits = rng.choice([1, 3, 20, 400, 999, 1001, 5000, 50_000])
    return rng.choice(["", "-"]) + str(rng.randint(1, 9)) + "".join(rng.choices("0123456789", k=digits - 1))


def _latex(rng: random.Random, depth: int) -> str:
    """A random LaTeX-ish expression (not necessarily valid)."""
    if depth <= 0 or rng.random() < 0.3:
        return _number(rng) if rng.random() < 0.2 else rng.choice(_ATOMS)
    a, b = _latex(rng, depth - 1), _latex(rng, depth - 1)
    return rng.choice([
        f"\\frac{{{a}}}{{{b}}}", f"\\sqrt{{{a}}}", f"{a}^{{{b}}}", f"{a}_{{{b}}}", f"{a}{b}", f"{a} {b}",
        f"\\boxed{{{a}}}", f"\\boxed {a}", f"\\fbox{{{a}}}", f"{{{a}", f"{a}}}", f"\\left({a}\\right)",
        f"{a}\\\\{b}", f"\\{{{a}\\}}", f"<think>{a}</think>{b}", f"{a}\nAnswer: {b}", f"$\\boxed{{{a}}}$.",
    ])


def _nested(rng: random.Random) -> str:
    depth = rng.choice([50, 500, 5000, 50_000])
    inner = rng.choice(["1", "x", "9^{9}", ""])
    left, right = rng.choice([("{", "}"), ("\\frac{", "}{2}"), ("\\sqrt{", "}"), ("10^{", "}"),
                              ("\\boxed{", "}"), ("(", ")"), ("\\left(", "\\right)")])
    body = left * depth + inner + right * rng.choice([depth, depth - 1, 0])
    return rng.choice([body, f"\\boxed{{{body}}}", f"Answer: {body}"])


def _pathological(rng: random.Random) -> str:
    n = rng.choice([1_000, 100_000, 1_200_000])
    unit = rng.choice([".$", "*.", " .", "$ ", "a", "{", "}", "\\", "\\boxed{", "\\boxed ", "\\fbox{", "answer",
                       "answer ", "Answer:", "\\{", "\\\\{", "0", "\\,", "\n"])
    run = unit * max(1, n // len(unit))
    return rng.choice([run, "Answer: " + run, "\\boxed{" + run + "}", run + "\\boxed{5}", "\\boxed{5}" + run,
                       "Answer: 5" + run, run + "\nAnswer: 5"])


def fuzz_case(rng: random.Random) -> tuple[str, str, str]:
    """One ``(response, gold, mode)``; the response is at most ``MAX_CHARS`` characters."""
    kind = rng.random()
    if kind < 0.55:
        response = "".join(_latex(rng, rng.randint(1, 7)) for _ in range(rng.randint(1, 6)))
    elif kind < 0.75:
        response = _nested(rng)
    else:
        response = _pathological(rng)
    if rng.random() < 0.5:  # most real responses end with a boxed answer
        response += f" so \\boxed{{{rng.choice(_GOLDS + [_latex(rng, 3)])}}}"
    gold = rng.choice(_GOLDS + [_latex(rng, 2), _number(rng)])
    return response[:MAX_CHARS], gold, rng.choice(["evaluation", "reward"])


def fuzz_cases(seed: int, count: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    return [fuzz_case(rng) for _ in range(count)]


def check_call(response: str, gold: str, mode: str) -> tuple[float, str | None]:
    """(seconds, problem or None) of one ``grade`` call: it must not raise and must return a sane result."""
    start = time.monotonic()
    try:
        result = grade(response, gold, mode=mode, timeout_s=TIMEOUT_S)
    except BaseException as error:  # noqa: BLE001  (the property under test: nothing escapes)
        return time.monotonic() - start, f"raised {type(error).__name__}: {error}"
    elapsed = time.monotonic() - start
    boxed = extract_boxed(response)
    if not isinstance(result, GradeResult) or not isinstance(result.acc, bool):
        return elapsed, f"returned {result!r}"
    if result.score != float(result.acc) or result.has_boxed is not bool(boxed):
        return elapsed, f"inconsistent {result!r}"
    if not (result.pred is None or isinstance(result.pred, str)) or (mode == EVALUATION and result.pred != boxed):
        return elapsed, f"wrong pred {result.pred!r}"
    return elapsed, None


def _describe(index: int, case: tuple[str, str, str], problem: str) -> str:
    response, gold, mode = case
    return f"case {index} ({mode}, {len(response)} chars, {response[:60]!r}..., gold {gold[:30]!r}): {problem}"


def run_cases(cases, *, bound_s: float = CALL_BOUND_S) -> list[str]:
    """Problems of grading ``[(index, case), ...]`` one after the other."""
    problems = []
    for index, case in cases:
        elapsed, problem = check_call(*case)
        if problem is None and elapsed > bound_s:
            problem = f"took {elapsed:.1f} s > {bound_s} s"
        if problem is not None:
            problems.append(_describe(index, case, problem))
    return problems


def _child(cases, open_files: int, sink) -> None:
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(open_files)]  # push descriptors past 1024
    try:
        sink.send(run_cases(cases))
    finally:
        for fd in held:
            os.close(fd)


def run_in_process(cases, *, open_files: int = 0) -> list[str]:
    """``run_cases`` in a forked child, killed (and reported) if it outlives every call's bound."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(cases, open_files, send), daemon=True)
    child.start()
    deadline = 30 + CALL_BOUND_S * len(cases)
    if not receive.poll(deadline):
        child.kill()
        child.join()
        return [f"child process grading cases {[i for i, _ in cases]} did not finish within {deadline:.0f} s"]
    problems = receive.recv()
    child.join(30)
    return problems


# --------------------------------------------------------------------------- the fuzz test
@pytest.mark.slow
def test_fuzz_from_threads():
    cases = list(enumerate(fuzz_cases(SEED, CASES)))
    threads = 4  # 2 per grader worker: a call may wait for one other call's timeout
    bound = CALL_BOUND_S + TIMEOUT_S * (threads // max(1, grader.MAX_WORKERS))
    chunks = [cases[i::threads] for i in range(threads)]
    start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        problems = [p for chunk in pool.map(lambda c: run_cases(c, bound_s=bound), chunks) for p in chunk]
    assert problems == []
    assert time.monotonic() - start < bound * len(cases) / threads + 60


@pytest.mark.slow
def test_fuzz_from_processes():
    cases = list(enumerate(fuzz_cases(SEED + 1, CASES // 2)))
    problems = run_in_process(cases[0::2]) + run_in_process(cases[1::2], open_files=1100)
    assert problems == []


# --------------------------------------------------------------------------- regression tests (one per finding)
@pytest.mark.slow
@pytest.mark.parametrize("unit", [".$", "*.", " .", "$ "])
def test_finding_1_answer_line_strip_is_linear(unit):
    response = "Answer: 5" + unit * (1_200_000 // len(unit))
    start = time.monotonic()
    assert grade(response, "5", mode="reward").acc
    assert time.monotonic() - start < 8.0  # 0.2-0.3 s after the fix, 75 s before it (shared machine)


@pytest.mark.slow
def test_finding_2_grading_with_more_than_1024_open_files():
    cases = [(0, ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", EVALUATION)),
             (1, ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", EVALUATION))]
    assert run_in_process(cases, open_files=1100) == []  # ValueError from select() before the fix


@pytest.mark.slow
def test_finding_3_fork_while_another_thread_holds_the_pool_lock():
    cases = [(0, ("\\boxed{\\frac{6}{8}}", "\\frac{3}{4}", EVALUATION))]
    ready, release = threading.Event(), threading.Event()

    def hold_lock():
        with grader._POOL._lock:
            ready.set()
            release.wait(60)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    ready.wait(10)
    try:
        problems = run_in_process(cases)  # the child hung on the copied, held lock before the fix
    finally:
        release.set()
        holder.join()
    assert problems == []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args(argv)
    slowest = []
    for index, case in enumerate(fuzz_cases(args.seed, args.count)):
        elapsed, problem = check_call(*case)
        if problem is not None:
            print(_describe(index, case, problem))
        slowest.append((elapsed, index, len(case[0]), case[0][:60]))
    for elapsed, index, size, head in sorted(slowest, reverse=True)[:10]:
        print(f"{elapsed:7.2f} s  case {index}  {size} chars  {head!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
