r"""Every user-message text of the paper, built in one place (pure stdlib).

The strings are the paper's ``promptbox`` texts (appendices "Training Prompts" and "Evaluation Protocol
and Inference Settings") character for character; where the official OPSD code differs, the paper wins
(docs/prompts.md). Only user turns are built here; ``recipe.common.chat.render`` renders them. Example::

    >>> student, teacher = build_prompt_pair("answer_only", {"problem": "1+1?", "answer": "2"})
    >>> student[0]["content"]
    'Problem: 1+1?\n\nPlease reason step by step, and put your final answer within \\boxed{}.'
"""

from __future__ import annotations

from collections.abc import Mapping

# Transcribed from the paper's ``promptbox`` environments: ``\\`` = newline, blank line = "\n\n", ``---`` = an
# em dash with no spaces, ``\promptboxed`` = ``\boxed{}`` (the official code's differences: docs/prompts.md).
# The paper's boxed instruction (student, evaluation, full-solution, unrelated, CoT+solution).
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# The answer-only prompt's variant: no comma after "step by step", "the final answer".
ANSWER_ONLY_BOXED_INSTRUCTION = "Please reason step by step and put the final answer within \\boxed{}."

FULL_SOLUTION_HEADER = "Here is a reference solution to this problem:"
REFERENCE_BEGIN = "=== Reference Solution Begin ==="
REFERENCE_END = "=== Reference Solution End ==="
FULL_SOLUTION_TRANSITION = (
    "After reading the reference solution above, make sure you truly understand the reasoning "
    "behind each step\u2014do not copy or paraphrase it. Now, using your own words and independent "
    "reasoning, derive the same final answer to the problem above. Think step by step, explore "
    "different approaches, and don't be afraid to backtrack or reconsider if something doesn't "
    "work out:"
)
ANSWER_ONLY_HEADER = "Here is the verified answer:"
ANSWER_ONLY_TRANSITION = (
    "After understanding the privileged information, solve the problem using your own reasoning."
)
# RLSD's teacher prompt (not in the paper): the reference RLSD trainer's, siyan-zhao/OPSD rlsd_train.py
# (make_format_prompt), character for character.
RLSD_EVIDENCE_INSTRUCTION = (
    "Using the reference solution only as privileged evidence, solve the problem in your own words. "
)
# CoT+Solution: "the reference block contains the dataset-provided CoT followed by the gold
# solution". The paper does not print the joint; we separate the two by one blank line.
COT_SOLUTION_SEPARATOR = "\n\n"

# Instruction-only prefixes (appendix "Instruction-Only Teacher Prefixes"): the paper does not
# print their wording; these are ours (docs/prompts.md). Inserted between the problem and the
# boxed instruction.
STYLE_INSTRUCTIONS = {
    "concise": (
        "Write a concise solution: keep the reasoning short, include only the steps that are "
        "needed, and skip lengthy explanations."
    ),
    "detailed": (
        "Write a detailed solution: explain every step of the reasoning carefully and completely, "
        "justifying each claim before moving on."
    ),
}

TEACHER_CONTEXTS = (
    "full_solution",
    "answer_only",
    "unrelated",
    "cot_solution",
    "none",
    "concise_to_detailed",
    "detailed_to_concise",
    "rlsd_solution",
)

# Fields of the parquet ``extra_info`` each context needs (besides ``problem``).
REQUIRED_FIELDS = {
    "full_solution": ("solution",),
    "answer_only": ("answer",),
    "unrelated": ("unrelated_problem", "unrelated_solution"),
    "cot_solution": ("cot", "solution"),
    "none": (),
    "concise_to_detailed": (),
    "detailed_to_concise": (),
    "rlsd_solution": ("solution",),
}

# (student style, teacher style) for the instruction-only contexts.
_STYLE_PAIRS = {
    "concise_to_detailed": ("concise", "detailed"),
    "detailed_to_concise": ("detailed", "concise"),
}


def _check_context(context: str) -> None:
    if context not in TEACHER_CONTEXTS:
        raise ValueError(f"teacher context {context!r} is not one of {list(TEACHER_CONTEXTS)}")


def _require(where: str, field: str, value: object) -> str:
    """The field's text, or a ValueError naming the prompt (context) and the field."""
    if value is None or not isinstance(value, str) or not value.strip():
        shown = value if not isinstance(value, str) or len(value) < 40 else value[:40] + "..."
        raise ValueError(f"{where} needs a non-empty string field {field!r}, got {shown!r}")
    return value


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def student_messages(problem: str, *, style: str | None = None) -> list[dict[str, str]]:
    """The student's chat: ``Problem: {problem}\\n\\n`` + the boxed instruction.

    Args:
        problem: the problem text.
        style: ``None`` (the paper's default student message), ``"concise"`` or
            ``"detailed"`` (instruction-only contexts: the style instruction is inserted as its
            own paragraph before the boxed instruction).
    """
    problem = _require("student message", "problem", problem)
    if style is None:
        return _user(f"Problem: {problem}\n\n{BOXED_INSTRUCTION}")
    if style not in STYLE_INSTRUCTIONS:
        raise ValueError(f"student style {style!r} is not one of {[None, *STYLE_INSTRUCTIONS]}")
    return _user(f"Problem: {problem}\n\n{STYLE_INSTRUCTIONS[style]}\n\n{BOXED_INSTRUCTION}")


def eval_messages(problem: str) -> list[dict[str, str]]:
    """The evaluation chat: ``{problem}\\n\\n`` + the boxed instruction (no ``Problem:`` label)."""
    problem = _require("eval message", "problem", problem)
    return _user(f"{problem}\n\n{BOXED_INSTRUCTION}")


def _reference_solution_prompt(problem: str, reference: str) -> str:
    return (
        f"Problem: {problem}\n\n"
        f"{FULL_SOLUTION_HEADER}\n{REFERENCE_BEGIN}\n{reference}\n{REFERENCE_END}\n\n"
        f"{FULL_SOLUTION_TRANSITION}\n\n"
        f"{BOXED_INSTRUCTION}"
    )


def teacher_messages(
    context: str,
    *,
    problem: str,
    solution: str | None = None,
    answer: str | None = None,
    cot: str | None = None,
    unrelated_problem: str | None = None,
    unrelated_solution: str | None = None,
) -> list[dict[str, str]]:
    """The teacher's chat for one teacher context of ``TEACHER_CONTEXTS``.

    ``full_solution``: problem + reference-solution block + transition paragraph.
    ``cot_solution``: the same prompt, the block holding ``cot`` + blank line + ``solution``.
    ``answer_only``: problem + verified answer + short transition + the comma-less instruction.
    ``unrelated``: ``Problem: {unrelated_problem}\\n\\nSolution: {unrelated_solution}\\n\\n``
    + the student message of the target problem. ``none``: the student message itself.
    ``concise_to_detailed`` / ``detailed_to_concise``: the student message with the
    teacher's style instruction (``"detailed"`` / ``"concise"``). ``rlsd_solution``: the
    reference RLSD trainer's prompt (problem + reference-solution block + one evidence sentence).

    Raises:
        ValueError: unknown context, or a field the context needs is missing/empty (the
            message names the context and the field).
    """
    _check_context(context)
    where = f"teacher context {context!r}"
    problem = _require(where, "problem", problem)
    fields = {
        "solution": solution,
        "answer": answer,
        "cot": cot,
        "unrelated_problem": unrelated_problem,
        "unrelated_solution": unrelated_solution,
    }
    values = {name: _require(where, name, fields[name]) for name in REQUIRED_FIELDS[context]}
    if context == "full_solution":
        return _user(_reference_solution_prompt(problem, values["solution"]))
    if context == "cot_solution":
        reference = f"{values['cot']}{COT_SOLUTION_SEPARATOR}{values['solution']}"
        return _user(_reference_solution_prompt(problem, reference))
    if context == "answer_only":
        return _user(
            f"Problem: {problem}\n\n"
            f"{ANSWER_ONLY_HEADER}\n{values['answer']}\n\n"
            f"{ANSWER_ONLY_TRANSITION}\n\n"
            f"{ANSWER_ONLY_BOXED_INSTRUCTION}"
        )
    if context == "unrelated":
        return _user(
            f"Problem: {values['unrelated_problem']}\n\n"
            f"Solution: {values['unrelated_solution']}\n\n"
            f"Problem: {problem}\n\n"
            f"{BOXED_INSTRUCTION}"
        )
    if context == "rlsd_solution":
        return _user(
            f"Problem: {problem}\n\n"
            f"{FULL_SOLUTION_HEADER}\n{REFERENCE_BEGIN}\n{values['solution']}\n{REFERENCE_END}\n\n"
            f"{RLSD_EVIDENCE_INSTRUCTION}{BOXED_INSTRUCTION}"
        )
    if context == "none":
        return student_messages(problem)
    return student_messages(problem, style=_STYLE_PAIRS[context][1])


# Contexts that carry a privileged reference C (Purified OPSD's reference-only teacher needs one).
REFERENCE_CONTEXTS = ("full_solution", "answer_only", "cot_solution")


def reference_only_messages(context: str, record: Mapping[str, object]) -> list[dict[str, str]]:
    """The reference-only teacher's chat (Purified OPSD's pR = pi_0(. | C, y_<i)).

    The teacher message of ``context`` with the ``Problem: {problem}\n\n`` paragraph removed,
    every other character unchanged, so log pT - log pR isolates what the question adds
    given the same reference text. The paper does not print this prompt; docs/prompts.md
    states the choice. Only contexts of ``REFERENCE_CONTEXTS`` have a reference.

    Raises:
        ValueError: a context without a reference, or a missing field (named).
    """
    if context not in REFERENCE_CONTEXTS:
        raise ValueError(f"reference-only prompt: context {context!r} has no reference; use one of {list(REFERENCE_CONTEXTS)}")
    if not isinstance(record, Mapping):
        raise ValueError(f"reference_only_messages: record must be a mapping (parquet extra_info), got {type(record).__name__}")
    problem = _require(f"teacher context {context!r}", "problem", record.get("problem"))
    content = build_prompt_pair(context, record)[1][0]["content"]
    prefix = f"Problem: {problem}\n\n"
    if not content.startswith(prefix):  # pragma: no cover - guarded by the prompt texts above
        raise AssertionError(f"teacher prompt of {context!r} does not start with the problem paragraph")
    return _user(content[len(prefix):])


def student_style(context: str) -> str | None:
    """The student-message style a teacher context implies (``None`` = the default message)."""
    _check_context(context)
    pair = _STYLE_PAIRS.get(context)
    return pair[0] if pair is not None else None


def build_prompt_pair(
    context: str, record: Mapping[str, object]
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(student messages, teacher messages) for one parquet ``extra_info`` record.

    ``record`` holds ``problem`` and whatever the context needs among ``solution``,
    ``answer``, ``cot``, ``unrelated_problem``, ``unrelated_solution`` (extra keys ignored).
    For the instruction-only contexts the student message changes too (concise/detailed).
    """
    _check_context(context)
    if not isinstance(record, Mapping):
        raise ValueError(f"build_prompt_pair: record must be a mapping (parquet extra_info), got {type(record).__name__}")
    problem = _require(f"teacher context {context!r}", "problem", record.get("problem"))
    student = student_messages(problem, style=student_style(context))
    teacher = teacher_messages(
        context,
        problem=problem,
        solution=record.get("solution"),
        answer=record.get("answer"),
        cot=record.get("cot"),
        unrelated_problem=record.get("unrelated_problem"),
        unrelated_solution=record.get("unrelated_solution"),
    )
    return student, teacher
