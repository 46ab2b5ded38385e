"""The SFT term's rows (``recipe.opsd.core.inputs``) and the trainer step that sends them.

Behaviour: each row is the student prompt the rollouts were generated from followed by the reference
solution's ids and EOS, laid out like verl's prompt | response batch; a solution above the cap is cut
and reported, never silently; a row without a solution is an error naming the row and the field;
with ``sft_weight`` 0 the trainer builds and sends nothing.
"""

import numpy as np
import pytest
import torch
from verl import DataProto

from recipe.common.chat import render_ids
from recipe.common.prompts import build_prompt_pair
from recipe.models.tiny import build_char_tokenizer
from recipe.opsd.actor_loss import SFT_INPUT_FIELDS, SFT_INPUT_PREFIX
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer
from recipe.opsd.core.inputs import SFTInputs
from recipe.opsd.core.inputs import TeacherInputs

ROWS = [
    {"id": "a", "index": 0, "problem": "What is 2 + 3?", "solution": "2+3=5, \\boxed{5}", "answer": "5"},
    {"id": "b", "index": 1, "problem": "What is 1 + 1?", "solution": "\\boxed{2}", "answer": "2"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _sft(tokenizer, *, max_length=64, **opsd):
    teacher_inputs = TeacherInputs.from_config(OPSDConfig(**opsd), tokenizer)
    return SFTInputs(student_prompt_ids=teacher_inputs.student_prompt_ids, tokenizer=tokenizer, max_length=max_length)


def _student_prompt(tokenizer, row, context="full_solution", mode="think"):
    return render_ids(build_prompt_pair(context, row)[0], tokenizer, mode)


@pytest.mark.parametrize("context, mode", [("full_solution", "think"), ("concise_to_detailed", "no_think")])
def test_each_row_is_the_rollout_prompt_then_the_solution_and_eos(tokenizer, context, mode):
    out = _sft(tokenizer, teacher_context=context, student_mode=mode).spliced(ROWS)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    solutions = [tokenizer(r["solution"], add_special_tokens=False)["input_ids"] + [eos] for r in ROWS]
    prompts = [_student_prompt(tokenizer, r, context, mode) for r in ROWS]
    width_s, width_p = max(map(len, solutions)), max(map(len, prompts))
    assert out["responses_BS"].shape == (2, width_s) and out["input_ids_BT"].shape == (2, width_p + width_s)
    for row, (prompt, solution) in enumerate(zip(prompts, solutions)):
        ids, mask = out["input_ids_BT"][row], out["attention_mask_BT"][row].bool()
        assert ids[mask].tolist() == prompt + solution
        assert ids[: width_p - len(prompt)].tolist() == [pad] * (width_p - len(prompt))  # left-padded prompt
        assert out["responses_BS"][row, : len(solution)].tolist() == solution  # the last S columns: the target
        assert out["response_mask_BS"][row].sum() == len(solution)
        assert out["position_ids_BT"][row][mask].tolist() == list(range(len(prompt) + len(solution)))
    assert not out["truncated_B"].any()


def test_the_prompt_is_the_one_the_rollout_check_accepts(tokenizer):
    teacher_inputs = TeacherInputs.from_config(OPSDConfig(), tokenizer)
    prompt = teacher_inputs.student_prompt_ids(ROWS[0])
    teacher_inputs.check_student_prompts([prompt], [ROWS[0]])  # no error: the rollouts' own prompt
    assert prompt == _student_prompt(tokenizer, ROWS[0])


def test_a_solution_above_the_cap_is_cut_and_reported(tokenizer):
    sft = _sft(tokenizer, max_length=5)
    out = sft.spliced(ROWS)
    first = tokenizer(ROWS[0]["solution"], add_special_tokens=False)["input_ids"]
    assert out["truncated_B"].tolist() == [True, True]  # "\\boxed{2}" + EOS is 10 tokens
    assert out["responses_BS"][0].tolist() == first[:5]  # the first 5 tokens, no EOS: it did not end there
    assert tokenizer.eos_token_id not in out["responses_BS"][0].tolist()
    fits = _sft(tokenizer, max_length=10).spliced(ROWS[1:])
    assert fits["truncated_B"].tolist() == [False] and fits["responses_BS"][0, -1] == tokenizer.eos_token_id


@pytest.mark.parametrize("solution", [None, "", "   "])
def test_a_row_without_a_solution_is_named(tokenizer, solution):
    row = dict(ROWS[1], solution=solution)
    if solution is None:
        del row["solution"]
    with pytest.raises(ValueError, match=r"row id='b' \(index 1\).*extra_info.solution.*sft_weight=0"):
        _sft(tokenizer, teacher_context="none").spliced([ROWS[0], row])


# --- the trainer step
class _Trainer:
    tokenizer = build_char_tokenizer()
    _sft_inputs = RayOPSDTrainer._sft_inputs
    _add_sft_inputs = RayOPSDTrainer._add_sft_inputs

    def __init__(self, **objective):
        from omegaconf import OmegaConf

        self.opsd = OPSDConfig(loss=objective)
        self.config = OmegaConf.create({"data": {"max_response_length": 7}})
        self.teacher_inputs = TeacherInputs.from_config(self.opsd, self.tokenizer)
        self.sft_inputs = self._sft_inputs()


def test_weight_zero_builds_nothing_and_a_weight_sends_the_rows(tokenizer):
    assert _Trainer().sft_inputs is None and _Trainer(sft_weight=0.0).sft_inputs is None
    trainer = _Trainer(sft_weight=0.1)
    assert trainer.sft_inputs.max_length == 7  # null cap = data.max_response_length
    assert _Trainer(sft_weight=0.1, sft_max_length=50).sft_inputs.max_length == 50
    batch = DataProto.from_dict(tensors={"responses": torch.zeros(2, 3, dtype=torch.long)},
                                non_tensors={"extra_info": np.array(ROWS, dtype=object)})
    metrics = trainer._add_sft_inputs(batch)
    expected = trainer.sft_inputs.spliced(ROWS)
    for field in SFT_INPUT_FIELDS:
        key = f"{field}_{'BS' if field.startswith('response') else 'BT'}"
        assert torch.equal(batch.batch[SFT_INPUT_PREFIX + field], expected[key])
    assert metrics == {"opsd/sft_truncated_frac": 1.0}  # both solutions are longer than 7 tokens


def test_a_train_file_with_a_row_without_a_solution_is_refused_before_ray(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recipe.common.cli import InputError
    from recipe.opsd.startup import check_sft_solutions

    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"extra_info": row} for row in ROWS]), good)
    pq.write_table(pa.Table.from_pylist([{"extra_info": ROWS[0]}, {"extra_info": dict(ROWS[1], solution="")}]), bad)
    with_sft = OPSDConfig(loss={"sft_weight": 0.1})
    check_sft_solutions(with_sft, train_files=[str(good)])
    check_sft_solutions(OPSDConfig(), train_files=[str(bad)])  # no SFT term: solutions are not needed
    with pytest.raises(InputError, match=r"row 1 has no non-empty extra_info.solution") as err:
        check_sft_solutions(with_sft, train_files=[str(good), str(bad)])
    assert str(err.value).startswith(f"{bad}:row 'b': ")  # the file and the row id
