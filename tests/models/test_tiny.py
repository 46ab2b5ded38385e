"""recipe.models.tiny: local tokenizer + tiny Qwen3 model, deterministic, template modes."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from recipe.models.tiny import (
    build_char_tokenizer,
    build_tiny_model,
    char_vocabulary,
    tiny_qwen3_config,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_char_tokenizer_ids_and_roundtrip():
    tokenizer = build_char_tokenizer()
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]) == [0, 1, 2, 3]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|pad|>"
    assert len(tokenizer) == 7 + len(char_vocabulary())
    text = "x = \\frac{12}{7}, so \\boxed{3}\n"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.decode(ids) == text
    digits = tokenizer("0123456789", add_special_tokens=False).input_ids
    assert len(set(digits)) == 10
    # <think> is an added (non-special) token: kept by skip_special_tokens, like Qwen3.
    with_think = tokenizer("<think>a</think><|im_end|>", add_special_tokens=False).input_ids
    assert len(with_think) == 4
    assert tokenizer.decode(with_think, skip_special_tokens=True) == "<think>a</think>"
    assert tokenizer.decode(tokenizer("é", add_special_tokens=False).input_ids) == "<|unk|>"


def test_saved_model_loads_with_untied_head_and_generation_config(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert model.config.head_dim == 32 and model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == [2, 0] and model.generation_config.pad_token_id == 3
    logits = model(torch.tensor([[1, 10, 11]])).logits
    assert logits.shape == (1, 3, len(tokenizer)) and torch.isfinite(logits).all()


def test_chat_template_renders_both_thinking_modes(tiny_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "user", "content": "What is 1 + 2?"}]
    think = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert think == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert no_think == think + "<think>\n\n</think>\n\n"
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, enable_thinking=False)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tokenizer.decode(ids) == no_think


def test_build_is_deterministic_given_seed(tmp_path):
    first = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3)).state_dict()
    again = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3)).state_dict()
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4)).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["lm_head.weight"], other["lm_head.weight"])


def test_refuses_to_overwrite_and_rejects_small_heads(tmp_path, tiny_dir):
    with pytest.raises(FileExistsError, match="overwrite=True"):
        build_tiny_model(tiny_dir)
    with pytest.raises(ValueError, match="head_dim"):
        tiny_qwen3_config(vocab_size=100, hidden_size=64, num_heads=4)
