"""Chat rendering in both reasoning modes with the shipped Qwen3-style template, and the
token-level teacher splice. The tokenizer is a character-level one built here (no download)."""

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

import recipe.common.chat as chat
from recipe.common.chat import render, render_ids, splice_teacher_inputs
from recipe.common.prompts import build_prompt_pair

TEMPLATE = (Path(chat.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<think>", "</think>"]
# A plain ChatML template with no enable_thinking switch.
PLAIN_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_tokenizer(template: str = TEMPLATE) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in ["\n", "\t"] + [chr(c) for c in range(0x20, 0x7F)] + ["\u2014", "<unk>"]:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<unk>",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


USER = [{"role": "user", "content": "Hi"}]


def test_render_modes_exact_strings(tok):
    assert render(USER, tok, "think") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(USER, tok, "no_think") == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # template default (nothing passed) is thinking on
    assert render(USER, tok, "native") == render(USER, tok, "think")
    system = [{"role": "system", "content": "S"}] + USER
    assert render(system, tok, "think") == "<|im_start|>system\nS<|im_end|>\n" + render(USER, tok, "think")


def test_render_student_and_teacher_in_independent_modes(tok):
    student, teacher = build_prompt_pair("full_solution", {"problem": "1+1?", "solution": "2"})
    s_text = render(student, tok, "no_think")
    t_text = render(teacher, tok, "think")
    assert s_text.endswith("\\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert t_text.endswith("\\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    assert "=== Reference Solution Begin ===\n2\n" in t_text and "Reference" not in s_text


def test_render_ids_is_tokenized_render_and_specials_are_single_tokens(tok):
    for mode in ("think", "no_think", "native"):
        ids = render_ids(USER, tok, mode)
        assert ids == tok(render(USER, tok, mode), add_special_tokens=False)["input_ids"]
    ids = render_ids(USER, tok, "no_think")
    think, end_think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    newline = tok.convert_tokens_to_ids("\n")
    assert ids[-6:] == [think, newline, newline, end_think, newline, newline]


def test_render_ids_matches_verl_agent_loop_prompt_ids(tok):
    from verl.utils.tokenizer import normalize_token_ids
    from verl.utils.tokenizer.chat_template import apply_chat_template

    messages = build_prompt_pair("answer_only", {"problem": "2+2?", "answer": "4"})[0]
    for flag, mode in ((True, "think"), (False, "no_think")):
        verl_ids = normalize_token_ids(
            apply_chat_template(tok, messages, tokenize=True, add_generation_prompt=True, enable_thinking=flag)
        )
        assert render_ids(messages, tok, mode) == verl_ids


def test_error_when_mode_asked_and_template_has_no_switch():
    plain = make_tokenizer(PLAIN_CHATML)
    assert render(USER, plain, "native") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    for mode in ("think", "no_think"):
        with pytest.raises(ValueError, match="no enable_thinking switch"):
            render(USER, plain, mode)
        with pytest.raises(ValueError, match="no enable_thinking switch"):
            render_ids(USER, plain, mode)
    with pytest.raises(ValueError, match="not one of"):
        render(USER, make_tokenizer(), "thinking")


def test_template_training_turns(tok):
    conv = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nold\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "r2"},
    ]
    text = tok.apply_chat_template(conv, tokenize=False)
    assert text == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"
    )
    # reasoning given inline in content renders the same as via reasoning_content
    inline = conv[:3] + [{"role": "assistant", "content": "<think>\nr2\n</think>\n\nA2"}]
    assert tok.apply_chat_template(inline, tokenize=False) == text
    # a final turn without reasoning gets the empty block (= no_think generation prompt)
    no_reason = conv[:3] + [{"role": "assistant", "content": "A2"}]
    assert tok.apply_chat_template(no_reason, tokenize=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n"
    )
    # the training prefix is the think-mode generation prompt of the conversation so far
    prefix = render(conv[:3], tok, "think")
    assert text.startswith(prefix)
    # assistant token mask covers the final turn's reasoning + answer + <|im_end|>
    out = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    kept = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.decode(kept) == "A1<|im_end|><think>\nr2\n</think>\n\nA2<|im_end|>"


PAD = 99


def _splice_case():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    response_ids = torch.tensor([[10, 11, 12, PAD], [13, PAD, PAD, PAD], [14, 15, 16, 17]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    return prompts, response_ids, response_mask


def test_splice_exact_layout():
    prompts, response_ids, response_mask = _splice_case()
    out = splice_teacher_inputs(prompts, response_ids, response_mask, pad_token_id=PAD)
    assert out["input_ids_BT"].tolist() == [
        [PAD, PAD, 1, 2, 3, 10, 11, 12, PAD],
        [4, 5, 6, 7, 8, 13, PAD, PAD, PAD],
        [PAD, PAD, PAD, PAD, 9, 14, 15, 16, 17],
    ]
    assert out["attention_mask_BT"].tolist() == [
        [0, 0, 1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1, 1],
    ]
    assert out["position_ids_BT"].tolist() == [
        [0, 0, 0, 1, 2, 3, 4, 5, 5],
        [0, 1, 2, 3, 4, 5, 5, 5, 5],
        [0, 0, 0, 0, 0, 1, 2, 3, 4],
    ]
    assert all(t.dtype == torch.long for t in out.values())


def test_splice_invariants_random():
    gen = torch.Generator().manual_seed(0)
    batch, resp_len = 6, 7
    prompts = [torch.randint(0, 50, (int(n),), generator=gen).tolist() for n in torch.randint(1, 9, (batch,), generator=gen)]
    lengths = torch.randint(0, resp_len + 1, (batch,), generator=gen)
    response_mask = (torch.arange(resp_len)[None, :] < lengths[:, None]).long()
    response_ids = torch.where(response_mask.bool(), torch.randint(0, 50, (batch, resp_len), generator=gen), PAD)
    out = splice_teacher_inputs(prompts, response_ids, response_mask, pad_token_id=PAD)
    ids, mask, pos = out["input_ids_BT"], out["attention_mask_BT"], out["position_ids_BT"]
    width = ids.shape[1] - resp_len
    assert width == max(len(p) for p in prompts)
    # response columns identical to the student's, at the same (last R) columns
    assert torch.equal(ids[:, width:], response_ids)
    assert torch.equal(mask[:, width:], response_mask)
    for b, p in enumerate(prompts):
        real = ids[b][mask[b].bool()].tolist()
        # prompt then response with nothing in between
        assert real == p + response_ids[b, : int(lengths[b])].tolist()
        # attention is one contiguous block, positions run 0..n-1 over it
        on = mask[b].nonzero().flatten()
        assert torch.equal(on, torch.arange(int(on[0]), int(on[-1]) + 1))
        assert pos[b][mask[b].bool()].tolist() == list(range(len(real)))


def test_splice_rejects_bad_inputs():
    prompts, response_ids, response_mask = _splice_case()
    holey = response_mask.clone()
    holey[0] = torch.tensor([1, 0, 1, 0])
    with pytest.raises(ValueError, match="not right-padded in rows \\[0\\]"):
        splice_teacher_inputs(prompts, response_ids, holey, pad_token_id=PAD)
    with pytest.raises(ValueError, match="teacher prompts"):
        splice_teacher_inputs(prompts[:2], response_ids, response_mask, pad_token_id=PAD)
    with pytest.raises(ValueError, match="empty teacher prompt"):
        splice_teacher_inputs([[1], [], [2]], response_ids, response_mask, pad_token_id=PAD)
    with pytest.raises(ValueError, match="same"):
        splice_teacher_inputs(prompts, response_ids, response_mask[:, :2], pad_token_id=PAD)
