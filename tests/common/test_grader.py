"""The one grader: its two modes, extraction rules, Math-Verify equivalence, bounded time, thread safety."""

import json
import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

from recipe.common.grader import (
    EVALUATION,
    MODES,
    REWARD,
    GradeResult,
    extract_answer,
    extract_boxed,
    fast_equal,
    grade,
)

EVAL_DIR = Path(__file__).resolve().parents[2] / "data" / "eval"


def _eval_rows():
    rows = []
    for path in sorted(EVAL_DIR.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def test_shipped_eval_sets_have_120_answers():
    assert len(_eval_rows()) == 120


@pytest.mark.parametrize("mode", MODES)
def test_every_eval_answer_verifies_against_itself(mode):
    # each gold's own \boxed{gold}, bare and after a closed think block, grades correct in both modes
    failures = [
        (row["id"], response)
        for row in _eval_rows()
        for response in (f"\\boxed{{{row['answer']}}}",
                         f"<think>Let me see.</think>\nThe answer is $\\boxed{{{row['answer']}}}$.")
        if not grade(response, row["answer"], mode=mode).acc
    ]
    assert failures == []


@pytest.mark.slow
def test_wrong_answers_rejected():
    wrong = []
    for row in _eval_rows():
        answer = row["answer"]
        bad = str(int(answer) + 1) if answer.lstrip("-").isdigit() else f"{answer}+1"
        if grade(f"\\boxed{{{bad}}}", answer, mode=EVALUATION).acc:
            wrong.append(row["id"])
    assert wrong == []


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{025}", "25"),
        ("\\boxed{25}", "025"),
        ("\\boxed{-984}", "-984"),
        ("\\boxed{ 3375 }", "3375"),
        ("\\boxed{336^\\circ}", "336"),
        ("\\boxed{\\dfrac{1}{576}}", "\\frac{1}{576}"),
        ("\\boxed{1/576}", "\\frac{1}{576}"),
        ("\\boxed{\\frac{\\sqrt{570}}{12}}", "\\sqrt{\\frac{95}{24}}"),
        ("\\boxed{2^{25}\\cdot 26!}", "2^{25} \\cdot 26!"),
        ("\\boxed{1-\\frac{2}{\\pi}}", "1-\\frac{2}{\\pi}"),
    ],
)
def test_equivalent_forms_accepted(response, gold):
    assert grade(response, gold, mode=EVALUATION).acc


def test_hmmt_two_element_answer_in_both_orders():
    gold = "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}"
    assert grade("\\boxed{\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}}", gold, mode=EVALUATION).acc
    assert grade("\\boxed{\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}}", gold, mode=EVALUATION).acc
    assert not grade("\\boxed{\\frac{-1+\\sqrt{17}}{2}}", gold, mode=EVALUATION).acc


def test_numeric_ground_truth_is_converted():
    assert grade("\\boxed{204}", 204, mode=EVALUATION).acc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed {42}", "42"),
        ("\\boxed\n{42}", "42"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{7} and a truncated \\boxed{8", "7"),
        ("\\boxed{a^{b^{c}}}", "a^{b^{c}}"),
        ("\\boxed{x \\\\{y}}", "x \\\\{y}"),  # `\\` is a line break, the brace after it is structural
        ("\\boxed{}", ""),
        ("x \\fbox{42} y", None),  # not the paper's \boxed{}
        ("so \\boxed 5.", None),  # no braces: not a balanced \boxed{} expression
        ("$\\boxed 17$", None),
        ("\\boxed{3} then \\fbox{4}", "3"),
        ("\\boxed{12", None),  # unbalanced
        ("\\boxed{\\}", None),  # the only closing brace is escaped
        ("no answer here", None),
        ("\\boxedx", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected
    assert extract_answer(text, mode=EVALUATION) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Work...\nAnswer: 42", "42"),
        ("Work...\nAnswer: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("**Final Answer:** 17\nThanks", "17"),
        ("answer: 3\nAnswer: 4", "4"),
        ("Answer: 1 \\boxed{9}", "9"),  # boxed wins over the fallback
        ("\\boxed{9} ... Answer: 1", "9"),  # wherever it is
        ("\\boxed{12\nAnswer: 12", "12"),  # unbalanced box: the fallback
        ("\\fbox{3}\nAnswer: 4", "4"),
        ("Answer:   \n", None),
    ],
)
def test_reward_mode_falls_back_to_the_answer_line(text, expected):
    assert extract_answer(text, mode=REWARD) == expected


def test_evaluation_mode_has_no_answer_line_fallback():
    assert extract_answer("Work...\nAnswer: 42", mode=EVALUATION) is None
    assert extract_answer("Work...\nAnswer: 42") is None  # the default of extract_answer is evaluation


def test_grade_result_fields():
    for mode in MODES:
        assert grade("\\boxed{5}", "5", mode=mode) == GradeResult(score=1.0, acc=True, pred="5", has_boxed=True)
        assert grade("\\boxed{6}", "5", mode=mode) == GradeResult(score=0.0, acc=False, pred="6", has_boxed=True)
        assert grade("nothing", "5", mode=mode) == GradeResult(score=0.0, acc=False, pred=None, has_boxed=False)
    assert grade("Answer: 5", "5", mode=REWARD) == GradeResult(score=1.0, acc=True, pred="5", has_boxed=False)
    # an empty box (the instruction's "within \\boxed{}" echoed) is not a boxed answer, in either mode
    for mode in (EVALUATION, REWARD):
        assert grade("To put your final answer within \\boxed{}, add 5 and 9.", "14", mode=mode) == GradeResult(
            score=0.0, acc=False, pred="", has_boxed=False)
        assert grade("\\boxed{14}. Put it within \\boxed{ }", "14", mode=mode).has_boxed is False
    assert grade("Answer: 5", "5", mode=EVALUATION) == GradeResult(score=0.0, acc=False, pred=None, has_boxed=False)


# Collapsed-checkpoint style outputs: (response, gold, correct in evaluation mode, correct in reward mode)
COLLAPSED = [
    ("... so the total is 42.\nAnswer: 42", "42", False, True),  # no box, an Answer: line
    ("The answer is \\fbox{42}", "42", False, False),
    ("The answer is \\boxed 42", "42", False, False),
    ("The answer is \\boxed 42\nAnswer: 42", "42", False, True),
    ("The answer is \\boxed{42", "42", False, False),  # unbalanced (truncated)
    ("\\boxed{4{2}", "42", False, False),
    ("\\boxed{41} no wait \\boxed{42}", "42", True, True),  # several boxes: the last one counts
    ("\\boxed{41} no wait \\boxed{42}", "41", False, False),
    ("\\boxed{42} and then a truncated \\boxed{4", "42", True, True),
    ("<think>it is \\boxed{42}</think>", "42", True, True),  # a box inside <think>
    ("<think>it is \\boxed{42} hmm, no", "42", True, True),  # inside an unclosed <think>
    ("<think>maybe \\boxed{41}</think>\nFinal: \\boxed{42}", "42", True, True),
    ("<think>maybe \\boxed{41}</think>\nFinal: \\boxed{42}", "41", False, False),
    ("Answer: 41\n\\boxed{42}", "41", False, False),  # a boxed answer beats the Answer: line
]


@pytest.mark.parametrize(("response", "gold", "evaluation", "reward"), COLLAPSED)
def test_collapsed_style_outputs(response, gold, evaluation, reward):
    assert grade(response, gold, mode=EVALUATION).acc is evaluation
    assert grade(response, gold, mode=REWARD).acc is reward


def test_answer_line_fallback_would_inflate_avg_at_8():
    # 8 samples of a collapsed checkpoint: 2 boxed and right, 4 unboxed with a right Answer: line, 2 lost
    samples = ["\\boxed{7}"] * 2 + ["...\nAnswer: 7"] * 4 + ["and so on and so on"] * 2
    avg = {mode: sum(grade(s, "7", mode=mode).acc for s in samples) / 8 for mode in MODES}
    assert avg == {EVALUATION: 0.25, REWARD: 0.75}


@pytest.mark.parametrize("mode", ["eval", "", None, "EVALUATION", ["evaluation"]])
def test_unknown_mode_is_a_clear_error(mode):
    with pytest.raises(ValueError, match="grader mode must be one of \\('evaluation', 'reward'\\)"):
        grade("\\boxed{1}", "1", mode=mode)
    with pytest.raises(ValueError, match="grader mode must be one of"):
        extract_answer("\\boxed{1}", mode=mode)


def test_mode_is_a_required_keyword():
    with pytest.raises(TypeError, match="mode"):
        grade("\\boxed{1}", "1")
    with pytest.raises(TypeError):
        grade("\\boxed{1}", "1", EVALUATION)


def test_fast_path():
    assert fast_equal("025", "25") is True
    assert fast_equal("26", "25") is False
    assert fast_equal("\\dfrac{1}{2}", "\\frac{1}{2}") is True
    assert fast_equal("\\frac{1}{2}", "0.5") is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{10^{10^{10^{10}}}}",
        "\\boxed{" + "9^{" * 30 + "9" + "}" * 30 + "}",
        "\\boxed{" + "x+" * 500_000 + "1}",
        "{" * 10_000 + "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
        "a" * 1_000_000,
        "\\boxed{" + "1" * 100_000 + "}",
        "Answer: " + "7" * 1_000_000,
        "\\boxed{" * 100_000,
    ],
)
def test_hostile_inputs_are_false_and_bounded(response):
    start = time.monotonic()
    result = grade(response, "5", mode=REWARD, timeout_s=2.0)
    elapsed = time.monotonic() - start
    assert result.acc is False
    # 2 s comparison bound + extraction on 1 MB + a possible worker restart
    assert elapsed < 8.0, elapsed


@pytest.mark.slow
def test_grading_after_a_timeout_still_works():
    grade("\\boxed{10^{10^{10^{10}}}}", "5", mode=EVALUATION, timeout_s=1.0)
    assert grade("\\boxed{\\frac{\\sqrt{570}}{12}}", "\\sqrt{\\frac{95}{24}}", mode=EVALUATION).acc


def test_grading_from_a_thread():
    results = {}

    def worker():
        results["value"] = grade("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", mode=EVALUATION)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=60)
    assert results["value"].acc


@pytest.mark.slow
def test_grading_from_a_thread_pool():
    cases = [("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True), ("\\boxed{\\sqrt{4}}", "2", True),
             ("\\boxed{\\pi}", "3.14", False), ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True)] * 3
    with ThreadPoolExecutor(max_workers=6) as pool:
        accs = list(pool.map(lambda case: grade(case[0], case[1], mode=EVALUATION).acc, cases))
    assert accs == [case[2] for case in cases]


def _grade_in_child(args):
    return grade(*args, mode=EVALUATION).acc


def test_grading_from_a_process_pool():
    with ProcessPoolExecutor(max_workers=1) as pool:
        assert list(pool.map(_grade_in_child, [("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"), ("\\boxed{3}", "4")])) == [
            True,
            False,
        ]


@pytest.mark.slow
def test_grading_from_a_daemonic_pool_worker():
    # multiprocessing.Pool workers are daemonic and may not start multiprocessing children
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.map(_grade_in_child, [("\\boxed{\\frac{6}{8}}", "\\frac{3}{4}")]) == [True]


def test_bad_timeout_rejected():
    with pytest.raises(ValueError, match="timeout_s"):
        grade("\\boxed{1}", "1", mode=EVALUATION, timeout_s=0)
