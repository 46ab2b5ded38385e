"""Fixtures of the data_prep tests: a tiny eval set, a character tokenizer saved to disk."""

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

import recipe.common.chat as chat

TEMPLATE = (Path(chat.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()

# Two eval items of exactly 20 words each (the n-gram tests count on it).
EVAL_A = (
    "Alice writes the numbers one through twenty on a board and erases two of them; "
    "find the largest remaining sum."
)
EVAL_B = (
    "A regular hexagon has side seven and a point P inside; compute the sum "
    "of distances from P to sides."
)


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def eval_dir(tmp_path):
    d = tmp_path / "eval"
    write_jsonl(d / "set_a.jsonl", [{"id": "a-01", "problem": EVAL_A, "answer": "207"}])
    write_jsonl(d / "set_b.jsonl", [{"id": "b-01", "problem": EVAL_B, "answer": "21\\sqrt{3}"}])
    return d


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A character-level tokenizer with the shipped Qwen3-style template, saved to disk."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<think>", "</think>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in ["\n", "\t"] + [chr(c) for c in range(0x20, 0x7F)] + ["\u2014"]:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<unk>",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = TEMPLATE
    out = tmp_path_factory.mktemp("char_tok")
    tok.save_pretrained(out)
    return out


@pytest.fixture
def eval_texts():
    """The two fixture eval problems (20 words each)."""
    return EVAL_A, EVAL_B
