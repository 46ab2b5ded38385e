"""recipe.analysis.replay on the tiny model: hand-checkable cases of a re-scored step."""

import math

import pytest

from recipe.analysis.replay import rescore_step

LOSS = {"student_temperature": 1.1, "teacher_temperature": None, "clip_tau": 0.05, "chunk_size": 7}


def _dump(prompts, responses, teacher_prompts, loss_mask=None):
    return {"step": 1, "loss_config": LOSS, "rows": {
        "prompt_ids": prompts, "response_ids": responses, "teacher_prompt_ids": teacher_prompts,
        "loss_mask": loss_mask or [[True] * len(r) for r in responses],
    }}


def test_same_prompt_for_student_and_teacher_scores_zero_divergence(tiny):
    model, tokenizer, *_ = tiny
    prompt = tokenizer("12+34=", add_special_tokens=False)["input_ids"]
    response = tokenizer("46", add_special_tokens=False)["input_ids"]
    out = rescore_step(_dump([prompt], [response], [prompt]), student=model, teacher=model)
    assert out["opsd/fwd_kl"] == pytest.approx(0.0, abs=1e-6) and out["opsd/top1_agree"] == 1.0
    assert out["opsd/enc_frac"] == out["opsd/disc_frac"] == 0.0 and out["opsd/clip_frac"] == 0.0
    assert out["opsd/student_entropy"] == pytest.approx(out["opsd/teacher_entropy"])


def test_token_means_over_rows_and_loss_positions(tiny):
    model, tokenizer, *_ = tiny
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts, responses, teachers = [enc("1+2="), enc("33+4=")], [enc("3"), enc("37")], [enc("Sol: 3. 1+2="), enc("37 33+4=")]
    both = rescore_step(_dump(prompts, responses, teachers), student=model, teacher=model, batch_size=1)
    singles = [rescore_step(_dump([p], [r], [t]), student=model, teacher=model) for p, r, t in zip(prompts, responses, teachers)]
    n = [len(r) for r in responses]
    # token means (not row means) over every response token of the step
    assert both["opsd/fwd_kl"] == pytest.approx(sum(s["opsd/fwd_kl"] * k for s, k in zip(singles, n)) / sum(n))
    assert both["opsd/fwd_kl"] > 0 and math.isfinite(both["opsd/student_entropy"])
    # enc / disc over the loss positions only: none selected -> 0
    none = rescore_step(_dump(prompts, responses, teachers, [[False] * k for k in n]), student=model, teacher=model)
    assert none["opsd/enc_frac"] == none["opsd/disc_frac"] == 0.0 and none["opsd/fwd_kl"] == pytest.approx(both["opsd/fwd_kl"], rel=1e-4)
