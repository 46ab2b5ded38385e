"""Toy-world files: RL parquet (verl schema), SFT parquet (the SFT mix) and the held-out JSONL.

Built by ``recipe.toy.student`` and the demos (``recipe.toy.demo``): ``rl_rows`` (verl rows; the OPSD
trainer builds the teacher prompt from ``extra_info`` at run time), ``sft_rows`` (one SFT conversation per
training problem, its user turn drawn from the SFT mix), ``conversation_length`` (the demos' caps check),
``heldout_jsonl_rows`` (rows for ``recipe.evaluation.harness``) and ``prompt_phrases`` (the fixed prompt
texts the toy tokenizer holds as single tokens). Pure stdlib + the project's prompt builders (no verl).
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
    """verl parquet rows (``data_prep.common.make_row``) of toy records: the student prompt
    (``student_messages``) + ``extra_info``, from which the OPSD trainer builds the teacher prompt at run time."""
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
    """One SFT row (``messages`` + ``extra_info`` + ``sft_kind``) per record; kinds drawn with ``seed``.

    The user turn is the student prompt alone (``problem``), the evaluation prompt alone (``eval``: the
    prompt the held-out evaluation uses) or a teacher prompt of ``build_prompt_pair`` (``full_solution`` /
    ``answer_only``), so the student learns to read the privileged context it will later be distilled from.
    The assistant turn is ``data_prep.sft.sft_messages``'s (the reference solution) without reasoning: in
    the Qwen3 template such a turn carries the empty ``<think>`` block, the same tokens as the no-think
    generation prompt, so the SFT model answers in no-think mode.
    """
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
