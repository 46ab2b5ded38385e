"""Tiny Qwen3-architecture causal LM and a local character-level tokenizer (no download).

``build_char_tokenizer()``: one token per character (every digit a single token) plus the Qwen3 chat
specials and optional single-token ``phrases``, with the project's Qwen3-style template
(``recipe/common/chat_templates/qwen3.jinja``, which has the ``enable_thinking`` switch).
``build_tiny_model(out_dir, ...)``: a random ``Qwen3ForCausalLM`` (untied lm_head: the OPSD teacher keeps
a frozen copy of it), the tokenizer and a generation config, deterministic given ``seed``. Used by the
tests, the CPU demos (``recipe.toy.demo``) and the toy student (``recipe.toy.student``); CLI:
``python -m recipe.toy.demo --out-dir tiny`` (the model, and the tiny CPU demo's data).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer, decoders, models

from recipe.common.cli import InputError, OutputExistsError, refuse_overwrite

if TYPE_CHECKING:  # torch and the model classes load only to build a model (a launch's planning reads the tokenizer)
    from transformers import PreTrainedTokenizerFast, Qwen3Config

CHAT_TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "common" / "chat_templates" / "qwen3.jinja"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
PAD = "<|pad|>"
UNK = "<|unk|>"
# Control tokens: dropped by decode(skip_special_tokens=True).
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD, UNK)
# Like Qwen3, <think> / </think> are added tokens that survive skip_special_tokens.
THINK_TOKENS = (THINK_OPEN, THINK_CLOSE)

# Symbols beyond ASCII that show up in math text; LaTeX itself is plain ASCII.
EXTRA_CHARS = "—–…×÷±≤≥≠≈−·°√∞πθαβγδλμσΣΔ∑∫∈∉∪∩⊂⊆→⇒⇔∀∃’‘“”"


def char_vocabulary() -> list[str]:
    """Every single-character token, in id order (after the special tokens)."""
    chars = ["\n", "\t"] + [chr(c) for c in range(0x20, 0x7F)] + list(EXTRA_CHARS)
    if len(set(chars)) != len(chars):
        raise ValueError("char_vocabulary: duplicate characters in EXTRA_CHARS")
    return chars


def load_chat_template(path: str | os.PathLike | None = None) -> str:
    """Contents of the project's Qwen3-style chat template."""
    template_path = Path(path) if path is not None else CHAT_TEMPLATE_PATH
    if not template_path.is_file():
        raise FileNotFoundError(
            f"chat template not found: {template_path} (expected recipe/common/chat_templates/qwen3.jinja)"
        )
    return template_path.read_text()


def build_char_tokenizer(
    *, chat_template: str | None = None, model_max_length: int = 4096, phrases: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with Qwen3 chat specials, built without any download.

    Ids: the special tokens first (``<|endoftext|>`` = 0, ``<|im_start|>`` = 1,
    ``<|im_end|>`` = 2, ``<|pad|>`` = 3, ``<|unk|>`` = 4, ``<think>`` = 5,
    ``</think>`` = 6), then one id per character of ``char_vocabulary()``. Characters
    outside the vocabulary map to ``<|unk|>``. eos = ``<|im_end|>``, pad = ``<|pad|>``.

    Args:
        chat_template: jinja chat template; ``None`` loads ``chat_templates/qwen3.jinja``.
        model_max_length: stored as the tokenizer's ``model_max_length``.
        phrases: texts that each become one (non-special) added token after ``</think>``, in
            order (fixed prompt texts: boilerplate then costs no hundreds of positions); the tokenizer
            matches them before splitting the rest into characters (leftmost-longest). Each must be at
            least 2 characters and unique.
    """
    from transformers import PreTrainedTokenizerFast

    if len(set(phrases)) != len(phrases) or any(len(phrase) < 2 for phrase in phrases):
        raise ValueError("build_char_tokenizer: phrases must be unique texts of at least 2 characters")
    added = list(SPECIAL_TOKENS) + list(THINK_TOKENS)
    vocab = {token: idx for idx, token in enumerate(added)}
    for char in char_vocabulary():
        vocab[char] = len(vocab)
    # A BPE model without merges splits the text into single characters; no pre-tokenizer,
    # so spaces and newlines are ordinary tokens, and Fuse() decodes by concatenation.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=None,
        additional_special_tokens=[ENDOFTEXT, IM_START],
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(THINK_TOKENS), special_tokens=False)
    if phrases:
        tokenizer.add_tokens([AddedToken(phrase, normalized=False, special=False) for phrase in phrases])
    tokenizer.chat_template = chat_template if chat_template is not None else load_chat_template()
    return tokenizer


def tiny_qwen3_config(
    *,
    vocab_size: int,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Qwen3Config:
    """Qwen3Config for the tiny model; head_dim = hidden_size / num_heads must be >= 32 (vLLM CPU kernels)."""
    from transformers import Qwen3Config

    if hidden_size % num_heads != 0:
        raise InputError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    head_dim = hidden_size // num_heads
    if head_dim < 32:
        raise InputError(f"head_dim = hidden_size / num_heads = {head_dim}; must be >= 32 (vLLM CPU attention)")
    if num_heads % num_kv_heads != 0:
        raise InputError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        max_window_layers=num_layers,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    chat_template: str | None = None,
    phrases: Sequence[str] = (),
    overwrite: bool = False,
) -> Path:
    """Save a random tiny Qwen3ForCausalLM + character tokenizer to ``out_dir``; return the path.

    Deterministic given ``seed``. Refuses to write into a non-empty directory unless
    ``overwrite=True``.
    """
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    out_path = Path(out_dir)
    if out_path.exists() and any(out_path.iterdir()) and not overwrite:
        raise OutputExistsError("is not empty", file=out_path,
                                hint="pass --overwrite (overwrite=True) to replace the tiny model there, or another --out-dir")
    tokenizer = build_char_tokenizer(chat_template=chat_template, phrases=phrases)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    endoftext_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = tiny_qwen3_config(
        vocab_size=len(tokenizer),
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, endoftext_id], pad_token_id=pad_id, bos_token_id=None, do_sample=True
    )
    out_path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_path)
    tokenizer.save_pretrained(out_path)
    return out_path
