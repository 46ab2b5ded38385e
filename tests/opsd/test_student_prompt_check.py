"""RayOPSDTrainer._check_student_prompts: the rollout's prompt ids must be the student message of
the configured teacher context (an instruction-only context changes it), rendered in the student's
mode; a parquet built for another context stops the run with an error naming the row."""

import numpy as np
import pytest
import torch

from recipe.common.chat import render_ids
from recipe.common.prompts import build_prompt_pair
from recipe.models.tiny import build_char_tokenizer
from recipe.opsd.config import OPSDConfig

RECORD = {"id": "row-7", "index": 7, "problem": "What is 2 + 3?", "solution": "2+3=5\n\\boxed{5}", "answer": "5"}


def _trainer(context: str, tokenizer):
    from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer

    trainer = RayOPSDTrainer.__new__(RayOPSDTrainer)  # only the attributes the check reads
    trainer.opsd = OPSDConfig(teacher_context=context, student_mode="think", teacher_mode="think")
    trainer.tokenizer = tokenizer
    trainer._checked_student_prompts = set()
    return trainer


def _batch(prompt_ids: list[int], pad_id: int, width: int = 400):
    from verl import DataProto

    prompts = torch.full((1, width), pad_id)
    prompts[0, width - len(prompt_ids):] = torch.tensor(prompt_ids)
    attention = torch.zeros(1, width + 3, dtype=torch.long)
    attention[0, width - len(prompt_ids):] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompts, "attention_mask": attention},
        non_tensors={"extra_info": np.array([RECORD], dtype=object)},
    )


def test_default_prompt_passes_and_a_mismatched_context_is_refused():
    tokenizer = build_char_tokenizer()
    default_student, _ = build_prompt_pair("full_solution", RECORD)
    ids = render_ids(default_student, tokenizer, "think")
    batch = _batch(ids, tokenizer.pad_token_id)

    trainer = _trainer("full_solution", tokenizer)
    trainer._check_student_prompts(batch)
    assert trainer._checked_student_prompts == {("row-7", 7, RECORD["problem"])}

    # concise_to_detailed asks the student for a concise solution: the default prompt is wrong
    with pytest.raises(ValueError, match="row id='row-7'.*concise_to_detailed"):
        _trainer("concise_to_detailed", tokenizer)._check_student_prompts(batch)
    # ...and the same prompt rendered in the other reasoning mode is wrong too
    no_think = _batch(render_ids(default_student, tokenizer, "no_think"), tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="opsd.student_mode='think'"):
        _trainer("full_solution", tokenizer)._check_student_prompts(no_think)
