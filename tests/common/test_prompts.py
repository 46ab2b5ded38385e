r"""Every prompt string against the paper's text (appendix "Training Prompts", "Evaluation Protocol").

The expected strings are written out by hand from opsd_diagnosis_paper.tex: `\\` is a line
break, a blank line is a paragraph break, `---` is an em dash with no spaces, `\promptboxed`
is `\boxed{}`.
"""

import pytest

from recipe.common import prompts
from recipe.common.prompts import (
    BOXED_INSTRUCTION,
    TEACHER_CONTEXTS,
    build_prompt_pair,
    eval_messages,
    student_messages,
    teacher_messages,
)

PROBLEM = "Find $x$ if $2x = 4$."
RECORD = {
    "problem": PROBLEM,
    "solution": "Divide by 2: $x = 2$. So $\\boxed{2}$.",
    "answer": "2",
    "cot": "We need x. 2x=4 so x=2.",
    "unrelated_problem": "What is $3+5$?",
    "unrelated_solution": "$3+5=8$.",
    "id": "row-1",
}

PAPER_STUDENT = "Problem: Find $x$ if $2x = 4$.\n\nPlease reason step by step, and put your final answer within \\boxed{}."
PAPER_EVAL = "Find $x$ if $2x = 4$.\n\nPlease reason step by step, and put your final answer within \\boxed{}."
PAPER_FULL_SOLUTION = (
    "Problem: Find $x$ if $2x = 4$.\n"
    "\n"
    "Here is a reference solution to this problem:\n"
    "=== Reference Solution Begin ===\n"
    "Divide by 2: $x = 2$. So $\\boxed{2}$.\n"
    "=== Reference Solution End ===\n"
    "\n"
    "After reading the reference solution above, make sure you truly understand the reasoning behind each "
    "step\u2014do not copy or paraphrase it. Now, using your own words and independent reasoning, derive the "
    "same final answer to the problem above. Think step by step, explore different approaches, and don't be "
    "afraid to backtrack or reconsider if something doesn't work out:\n"
    "\n"
    "Please reason step by step, and put your final answer within \\boxed{}."
)
PAPER_ANSWER_ONLY = (
    "Problem: Find $x$ if $2x = 4$.\n"
    "\n"
    "Here is the verified answer:\n"
    "2\n"
    "\n"
    "After understanding the privileged information, solve the problem using your own reasoning.\n"
    "\n"
    "Please reason step by step and put the final answer within \\boxed{}."
)
PAPER_UNRELATED = (
    "Problem: What is $3+5$?\n"
    "\n"
    "Solution: $3+5=8$.\n"
    "\n"
    "Problem: Find $x$ if $2x = 4$.\n"
    "\n"
    "Please reason step by step, and put your final answer within \\boxed{}."
)


def _content(messages):
    assert isinstance(messages, list) and len(messages) == 1
    assert messages[0]["role"] == "user"
    return messages[0]["content"]


def test_boxed_instruction_text():
    assert BOXED_INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."


def test_student_and_eval_messages_match_paper():
    assert _content(student_messages(PROBLEM)) == PAPER_STUDENT
    assert _content(eval_messages(PROBLEM)) == PAPER_EVAL
    assert not _content(eval_messages(PROBLEM)).startswith("Problem:")


def test_full_solution_matches_paper_with_unspaced_em_dash():
    text = _content(teacher_messages("full_solution", problem=PROBLEM, solution=RECORD["solution"]))
    assert text == PAPER_FULL_SOLUTION
    assert "step\u2014do" in text and " \u2014 " not in text and "---" not in text


def test_answer_only_matches_paper_without_comma():
    text = _content(teacher_messages("answer_only", problem=PROBLEM, answer="2"))
    assert text == PAPER_ANSWER_ONLY
    assert text.endswith("Please reason step by step and put the final answer within \\boxed{}.")


def test_unrelated_matches_paper_and_never_claims_to_solve_target():
    text = _content(
        teacher_messages(
            "unrelated",
            problem=PROBLEM,
            unrelated_problem=RECORD["unrelated_problem"],
            unrelated_solution=RECORD["unrelated_solution"],
        )
    )
    assert text == PAPER_UNRELATED
    assert text.count("Solution:") == 1 and text.index("Solution:") < text.index(PROBLEM)


def test_cot_solution_puts_cot_then_solution_in_reference_block():
    text = _content(teacher_messages("cot_solution", problem=PROBLEM, cot=RECORD["cot"], solution=RECORD["solution"]))
    expected = PAPER_FULL_SOLUTION.replace(
        "=== Reference Solution Begin ===\nDivide",
        "=== Reference Solution Begin ===\nWe need x. 2x=4 so x=2.\n\nDivide",
    )
    assert text == expected


def test_none_context_is_the_student_message():
    assert teacher_messages("none", problem=PROBLEM) == student_messages(PROBLEM)


def test_instruction_only_contexts_change_both_sides():
    concise = prompts.STYLE_INSTRUCTIONS["concise"]
    detailed = prompts.STYLE_INSTRUCTIONS["detailed"]
    student, teacher = build_prompt_pair("concise_to_detailed", RECORD)
    assert _content(student) == f"Problem: {PROBLEM}\n\n{concise}\n\n{BOXED_INSTRUCTION}"
    assert _content(teacher) == f"Problem: {PROBLEM}\n\n{detailed}\n\n{BOXED_INSTRUCTION}"
    student_r, teacher_r = build_prompt_pair("detailed_to_concise", RECORD)
    assert student_r == teacher and teacher_r == student
    # the wording documented in docs/prompts.md
    assert concise.startswith("Write a concise solution:") and detailed.startswith("Write a detailed solution:")


@pytest.mark.parametrize("context", TEACHER_CONTEXTS)
def test_build_prompt_pair_student_is_default_except_instruction_only(context):
    student, teacher = build_prompt_pair(context, RECORD)
    if context in ("concise_to_detailed", "detailed_to_concise"):
        assert _content(student) != PAPER_STUDENT
    else:
        assert _content(student) == PAPER_STUDENT
    assert PROBLEM in _content(teacher)


def test_build_prompt_pair_teacher_texts():
    assert _content(build_prompt_pair("full_solution", RECORD)[1]) == PAPER_FULL_SOLUTION
    assert _content(build_prompt_pair("answer_only", RECORD)[1]) == PAPER_ANSWER_ONLY
    assert _content(build_prompt_pair("unrelated", RECORD)[1]) == PAPER_UNRELATED


def test_context_list():
    assert TEACHER_CONTEXTS == (
        "full_solution",
        "answer_only",
        "unrelated",
        "cot_solution",
        "none",
        "concise_to_detailed",
        "detailed_to_concise",
        "rlsd_solution",
    )


def test_the_rlsd_teacher_prompt_is_the_reference_trainers():
    """siyan-zhao/OPSD rlsd_train.py, make_format_prompt: the teacher message, written out."""
    want = (f"Problem: {PROBLEM}\n\nHere is a reference solution to this problem:\n"
            f"=== Reference Solution Begin ===\n{RECORD['solution']}\n=== Reference Solution End ===\n\n"
            "Using the reference solution only as privileged evidence, solve the problem in your own words. "
            "Please reason step by step, and put your final answer within \\boxed{}.")
    assert _content(build_prompt_pair("rlsd_solution", RECORD)[1]) == want


@pytest.mark.parametrize(
    "context,field",
    [
        ("full_solution", "solution"),
        ("answer_only", "answer"),
        ("unrelated", "unrelated_problem"),
        ("unrelated", "unrelated_solution"),
        ("cot_solution", "cot"),
        ("cot_solution", "solution"),
    ],
)
def test_missing_field_names_context_and_field(context, field):
    for bad in (None, "", "  \n"):
        record = dict(RECORD, **{field: bad})
        with pytest.raises(ValueError) as err:
            build_prompt_pair(context, record)
        assert repr(context) in str(err.value) and repr(field) in str(err.value)


def test_missing_problem_and_unknown_context():
    with pytest.raises(ValueError, match="'problem'"):
        build_prompt_pair("none", {"problem": ""})
    with pytest.raises(ValueError, match="full_solution"):
        teacher_messages("reference", problem=PROBLEM)
    with pytest.raises(ValueError, match="concise"):
        student_messages(PROBLEM, style="short")


def test_reference_only_prompt_drops_only_the_problem_paragraph():
    from recipe.common.prompts import reference_only_messages

    record = {"problem": "What is 2+3?", "solution": "2+3=5, so \\boxed{5}.", "answer": "5", "cot": "add"}
    full = reference_only_messages("full_solution", record)[0]["content"]
    assert full == (
        "Here is a reference solution to this problem:\n=== Reference Solution Begin ===\n"
        "2+3=5, so \\boxed{5}.\n=== Reference Solution End ===\n\n"
        "After reading the reference solution above, make sure you truly understand the reasoning "
        "behind each step\u2014do not copy or paraphrase it. Now, using your own words and independent "
        "reasoning, derive the same final answer to the problem above. Think step by step, explore "
        "different approaches, and don't be afraid to backtrack or reconsider if something doesn't "
        "work out:\n\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    answer = reference_only_messages("answer_only", record)[0]["content"]
    assert answer == (
        "Here is the verified answer:\n5\n\n"
        "After understanding the privileged information, solve the problem using your own reasoning.\n\n"
        "Please reason step by step and put the final answer within \\boxed{}."
    )
    assert "What is 2+3?" not in reference_only_messages("cot_solution", record)[0]["content"]
    with pytest.raises(ValueError, match="'none' has no reference"):
        reference_only_messages("none", record)
    with pytest.raises(ValueError, match="'solution'"):
        reference_only_messages("full_solution", {"problem": "p"})
