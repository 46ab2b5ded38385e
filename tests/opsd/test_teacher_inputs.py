"""TeacherInputs: the teacher's token-level inputs and the check of the student's rollout prompts.

Behaviour only: the rollout prompt ids must be the student message of the configured teacher
context (an instruction-only context changes it) rendered in the student's mode, or the run stops
with an error naming the row; the teacher's input is its own prompt followed by the student's
response ids; a teacher prompt above the cap is an error, never truncated.
"""

import pytest
import torch

from recipe.common.chat import render_ids
from recipe.common.prompts import build_prompt_pair
from recipe.models.tiny import build_char_tokenizer
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.core.inputs import TeacherInputs

RECORD = {"id": "row-7", "index": 7, "problem": "What is 2 + 3?", "solution": "2+3=5\n\\boxed{5}", "answer": "5"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _inputs(tokenizer, context="full_solution", **kwargs):
    return TeacherInputs.from_config(OPSDConfig(teacher_context=context, **kwargs), tokenizer)


def _student_ids(tokenizer, context="full_solution", mode="think"):
    student, _ = build_prompt_pair(context, RECORD)
    return render_ids(student, tokenizer, mode)


def test_the_default_student_prompt_passes(tokenizer):
    _inputs(tokenizer).check_student_prompts([_student_ids(tokenizer)], [RECORD])


def test_a_parquet_built_for_another_context_is_refused(tokenizer):
    # concise_to_detailed asks the student for a concise solution: the default prompt is not its student message
    with pytest.raises(ValueError, match="row id='row-7'.*concise_to_detailed.*rebuild the parquet"):
        _inputs(tokenizer, "concise_to_detailed").check_student_prompts([_student_ids(tokenizer)], [RECORD])
    # ...and the parquet built for it passes
    built = _student_ids(tokenizer, "concise_to_detailed")
    _inputs(tokenizer, "concise_to_detailed").check_student_prompts([built], [RECORD])


def test_the_prompt_rendered_in_the_other_mode_is_refused(tokenizer):
    no_think = _student_ids(tokenizer, mode="no_think")
    with pytest.raises(ValueError, match="opsd.student_mode='think'"):
        _inputs(tokenizer).check_student_prompts([no_think], [RECORD])
    _inputs(tokenizer, student_mode="no_think").check_student_prompts([no_think], [RECORD])


def test_teacher_input_is_its_prompt_then_the_response_ids(tokenizer):
    inputs = _inputs(tokenizer, teacher_mode="no_think")
    _, teacher = build_prompt_pair("full_solution", RECORD)
    prompt = render_ids(teacher, tokenizer, "no_think")
    responses = torch.tensor([[11, 12, 13, 0], [21, 0, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    other = dict(RECORD, id="row-8", solution="5")
    out = inputs.spliced([RECORD, other], responses, attention)
    other_prompt = render_ids(build_prompt_pair("full_solution", other)[1], tokenizer, "no_think")
    for row, (p, n) in enumerate([(prompt, 3), (other_prompt, 1)]):
        ids = out["input_ids_BT"][row][out["attention_mask_BT"][row].bool()].tolist()
        assert ids == list(p) + responses[row, :n].tolist()


def test_a_teacher_prompt_over_the_cap_is_an_error(tokenizer):
    inputs = _inputs(tokenizer, teacher_max_prompt_length=20)
    with pytest.raises(ValueError, match="row id='row-7'.*opsd.teacher_max_prompt_length=20"):
        inputs.teacher_prompt_ids(RECORD)
