"""Chat rendering with an explicit reasoning mode, and token-level teacher splicing.

``render`` / ``render_ids`` render a chat with the generation prompt in a mode of ``MODES`` (``think`` /
``no_think`` set ``enable_thinking``; ``native`` passes nothing), ``render_ids`` exactly as verl's agent
loop tokenizes the rollout prompt; ``splice_teacher_inputs`` puts the student's response ids after the
left-padded teacher prompts, column-aligned with verl's ``prompt | response`` batch. Used by the trainer,
the analysis, the evaluation and data_prep; the rules: docs/prompts.md#chat-rendering-and-reasoning-modes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# the reasoning modes of the whole project (yaml, CLIs, presets, metrics): native = the template's own mode
MODES = ("think", "no_think", "native")
NATIVE = "native"

# chat template source -> whether it reacts to enable_thinking
_SWITCH_CACHE: dict[str, bool] = {}


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {list(MODES)}")


def template_kwargs(mode: str) -> dict[str, bool]:
    """The chat-template kwargs of ``mode``: ``enable_thinking`` for think / no_think, nothing for native."""
    _check_mode(mode)
    return {} if mode == NATIVE else {"enable_thinking": mode == "think"}


def has_thinking_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders differently for enable_thinking True/False."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat_template to render with")
    if template not in _SWITCH_CACHE:
        probe = [{"role": "user", "content": "x"}]
        rendered = {
            flag: tokenizer.apply_chat_template(
                probe, tokenize=False, add_generation_prompt=True, enable_thinking=flag
            )
            for flag in (True, False)
        }
        _SWITCH_CACHE[template] = rendered[True] != rendered[False]
    return _SWITCH_CACHE[template]


def _check_switch(tokenizer, mode: str) -> None:
    if mode != NATIVE and not has_thinking_switch(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"mode={mode!r} was asked for, but the chat template of tokenizer {name!r} has no "
            "enable_thinking switch (it renders the same prompt for enable_thinking=True and False); "
            "use mode native to render the template's default, or use a template with the switch"
        )


def render(messages: Sequence[dict], tokenizer, mode: str) -> str:
    """Prompt text for ``messages`` with the generation prompt, in reasoning ``mode``."""
    _check_mode(mode)
    _check_switch(tokenizer, mode)
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True, **template_kwargs(mode)
    )


def _as_id_list(tokenized) -> list[int]:
    """Flat ``list[int]`` from ``apply_chat_template(tokenize=True)`` (list or BatchEncoding)."""
    ids = tokenized["input_ids"] if hasattr(tokenized, "keys") else tokenized
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return [int(token_id) for token_id in ids]


def render_ids(messages: Sequence[dict], tokenizer, mode: str) -> list[int]:
    """Prompt token ids, identical to verl's agent-loop prompt ids for the same kwargs."""
    _check_mode(mode)
    _check_switch(tokenizer, mode)
    tokenized = tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=True, **template_kwargs(mode)
    )
    return _as_id_list(tokenized)


def splice_teacher_inputs(
    teacher_prompt_ids: Sequence[Sequence[int]],
    response_ids_BR: torch.Tensor,
    response_mask_BR: torch.Tensor,
    *,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """Teacher inputs: left-padded teacher prompts followed by the student's response tokens.

    Row ``b`` is ``[pad] * (P - len(p_b)) + p_b + response_ids_BR[b]`` with
    ``P = max_b len(p_b)``: the response occupies the last ``R`` columns exactly as in verl's
    ``prompt | response`` batch, so teacher and student logits at response column ``r`` score
    the same token. The response ids are copied, never decoded/re-encoded.

    Args:
        teacher_prompt_ids: B non-empty lists of prompt token ids (unpadded).
        response_ids_BR: [B, R] integer tensor of response ids, right-padded.
        response_mask_BR: [B, R] 0/1 (or bool) tensor, 1 on real response tokens; must be
            right-padded (ones then zeros) so no pad sits between prompt and response.
        pad_token_id: id written into the left padding.

    Returns:
        ``input_ids_BT`` (long), ``attention_mask_BT`` (long: 0 on left pad, 1 on the prompt,
        ``response_mask_BR`` on the response) and ``position_ids_BT`` (long:
        ``clip(cumsum(attention_mask) - 1, min=0)``, verl's convention), with T = P + R.
    """
    if response_ids_BR.dim() != 2 or response_mask_BR.shape != response_ids_BR.shape:
        raise ValueError(
            f"response_ids_BR {tuple(response_ids_BR.shape)} and response_mask_BR "
            f"{tuple(response_mask_BR.shape)} must be the same [B, R] shape"
        )
    if response_ids_BR.dtype.is_floating_point:
        raise ValueError(f"response_ids_BR must hold integer token ids, got dtype {response_ids_BR.dtype}")
    batch_size, response_len = response_ids_BR.shape
    if len(teacher_prompt_ids) != batch_size:
        raise ValueError(f"{len(teacher_prompt_ids)} teacher prompts for a batch of {batch_size} responses")
    mask_BR = response_mask_BR.to(torch.long)
    if ((mask_BR != 0) & (mask_BR != 1)).any():
        raise ValueError("response_mask_BR must be 0/1")
    # right-padded: the mask never goes 0 -> 1 along a row
    if response_len > 1 and (mask_BR[:, 1:] > mask_BR[:, :-1]).any():
        bad_rows = torch.nonzero((mask_BR[:, 1:] > mask_BR[:, :-1]).any(dim=1)).flatten().tolist()
        raise ValueError(
            f"response_mask_BR is not right-padded in rows {bad_rows}: a pad would sit between the "
            "teacher prompt and the response"
        )
    lengths = [len(ids) for ids in teacher_prompt_ids]
    if any(length == 0 for length in lengths):
        raise ValueError(f"empty teacher prompt in rows {[row for row, length in enumerate(lengths) if length == 0]}")
    prompt_len = max(lengths) if lengths else 0
    device = response_ids_BR.device
    prompt_ids_BP = torch.full((batch_size, prompt_len), int(pad_token_id), dtype=torch.long, device=device)
    prompt_mask_BP = torch.zeros((batch_size, prompt_len), dtype=torch.long, device=device)
    for row, ids in enumerate(teacher_prompt_ids):
        if ids:
            prompt_ids_BP[row, prompt_len - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.long, device=device)
            prompt_mask_BP[row, prompt_len - len(ids) :] = 1
    input_ids_BT = torch.cat([prompt_ids_BP, response_ids_BR.to(torch.long)], dim=1)
    attention_mask_BT = torch.cat([prompt_mask_BP, mask_BR], dim=1)
    position_ids_BT = torch.clamp(torch.cumsum(attention_mask_BT, dim=1) - 1, min=0)
    return {
        "input_ids_BT": input_ids_BT,
        "attention_mask_BT": attention_mask_BT,
        "position_ids_BT": position_ids_BT,
    }
