"""Toy-world files: RL parquet (verl schema), SFT parquet (the SFT mix) and the held-out JSONL.

- ``rl_rows(records)``: verl parquet rows (``data_prep.common.make_row``); the student prompt is
  ``recipe.common.prompts.student_messages`` and the teacher prompt is built at run time by the
  OPSD trainer from ``extra_info``.
- ``sft_rows(records, mix=..., seed=...)``: one SFT conversation per training problem. The user
  turn is drawn from the SFT mix: the student prompt alone (``problem``), the evaluation prompt
  alone (``eval``: ``eval_messages``, the prompt the held-out evaluation uses), or a teacher
  prompt of ``build_prompt_pair`` (``full_solution`` / ``answer_only``), so the student learns
  to read the privileged context it will later be distilled from. The assistant turn is
  ``data_prep.sft.sft_messages``'s (the reference solution), rendered without reasoning: in the
  Qwen3 template an assistant turn with no reasoning carries the empty ``<think>`` block, the
  same tokens as the no-think generation prompt, so the SFT model answers in no-think mode.
- ``conversation_length(messages, tokenizer, ...)``: tokens of one SFT conversation (the caps check
  of the demos, ``recipe.toy.demo.check_demo_rows``).
- ``heldout_jsonl_rows(records)``: ``{id, problem, answer}`` rows for ``recipe.evaluation.harness``.
- ``prompt_phrases()``: the fixed texts of every toy prompt (the paper's wording between the
  record fields), which the toy tokenizer holds as single tokens.

Pure stdlib + the project's prompt builders (no verl import).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from data_prep.common import make_row
from data_prep.sft import sft_messages
from recipe.common.prompts import build_prompt_pair, eval_messages, student_messages, teacher_messages
from recipe.toy.task import DATA_SOURCE

# User-turn kinds of the SFT mix and their shares (50% problem-only, 35% full
# solution, 15% answer only); the problem-only half is split between the training and the
# evaluation wording of the student prompt.
SFT_KINDS = ("problem", "eval", "full_solution", "answer_only")
DEFAULT_SFT_MIX = {"problem": 0.25, "eval": 0.25, "full_solution": 0.35, "answer_only": 0.15}


def rl_rows(records: Sequence[Mapping]) -> list[dict]:
    """verl parquet rows (student prompt + extra_info) of toy records."""
    return [
        make_row(record, data_source=DATA_SOURCE, split=record["split"], prompt=student_messages(record["problem"]))
        for record in records
    ]


def check_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """Validated SFT mix (shares of ``SFT_KINDS`` summing to 1)."""
    unknown = sorted(set(mix) - set(SFT_KINDS))
    if unknown:
        raise ValueError(f"SFT mix: unknown kinds {unknown}; allowed {list(SFT_KINDS)}")
    if any(share < 0 for share in mix.values()) or abs(sum(mix.values()) - 1.0) > 1e-9:
        raise ValueError(f"SFT mix: shares must be >= 0 and sum to 1, got {dict(mix)}")
    return {kind: float(mix.get(kind, 0.0)) for kind in SFT_KINDS}


def sft_user_turn(kind: str, record: Mapping) -> list[dict[str, str]]:
    """The user turn of one SFT conversation of ``kind``."""
    if kind == "problem":
        return student_messages(record["problem"])
    if kind == "eval":
        return eval_messages(record["problem"])
    if kind in ("full_solution", "answer_only"):
        return build_prompt_pair(kind, record)[1]
    raise ValueError(f"SFT kind {kind!r} is not one of {list(SFT_KINDS)}")


def sft_rows(records: Sequence[Mapping], *, mix: Mapping[str, float] = DEFAULT_SFT_MIX, seed: int = 0) -> list[dict]:
    """One SFT row (``messages`` + ``extra_info`` + ``sft_kind``) per record; kinds drawn with ``seed``."""
    shares = check_mix(mix)
    rng = random.Random(seed)
    kinds, weights = list(shares), list(shares.values())
    rows = []
    for record in records:
        kind = rng.choices(kinds, weights=weights)[0]
        assistant = sft_messages({**record, "cot": ""}, user_prompt="raw")[1]
        rows.append(
            {
                "messages": sft_user_turn(kind, record) + [{"role": "assistant", "content": assistant["content"]}],
                "sft_kind": kind,
                "extra_info": dict(record),
            }
        )
    return rows


def conversation_length(messages: Sequence[Mapping], tokenizer, *, enable_thinking: bool | None) -> int:
    """Tokens of a whole SFT conversation as verl's SFT dataset counts them (the chat template without a
    generation prompt; ``enable_thinking`` None: the template's default)."""
    kwargs = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=False,
                                         **kwargs)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def heldout_jsonl_rows(records: Sequence[Mapping]) -> list[dict[str, str]]:
    """Benchmark rows ``{id, problem, answer}`` for ``recipe.evaluation.harness``."""
    return [{"id": record["id"], "problem": record["problem"], "answer": record["answer"]} for record in records]


# Teacher contexts whose prompts the toy world uses (training, SFT mix, signal experiments).
PHRASE_CONTEXTS = ("full_solution", "answer_only", "unrelated", "none")
_FIELD = "\x00"


def prompt_phrases(contexts: Sequence[str] = PHRASE_CONTEXTS) -> list[str]:
    """The literal texts between the record fields of the student, evaluation and teacher prompts.

    Rendered with a sentinel in every field and split at the sentinels, so the texts are the prompt
    builders' own, character for character (e.g. ``"Problem: "`` and ``"\\n\\n" +`` the boxed
    instruction). Pieces without a letter (bare newlines) stay characters. Longest first, unique.
    """
    fields = dict.fromkeys(("problem", "solution", "answer", "cot", "unrelated_problem", "unrelated_solution"),
                           _FIELD)
    contents = [student_messages(_FIELD)[0]["content"], eval_messages(_FIELD)[0]["content"]]
    contents += [teacher_messages(context, **fields)[0]["content"] for context in contexts]
    pieces = {piece for content in contents for piece in content.split(_FIELD) if any(c.isalpha() for c in piece)}
    return sorted(pieces, key=lambda piece: (-len(piece), piece))
