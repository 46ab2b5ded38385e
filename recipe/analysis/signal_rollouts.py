"""The rollouts of a signal analysis: drawn prompts, sampled responses, their file, the model loaders.

``build_prompt_items`` draws ``num_prompts`` rows of a verl training parquet (seeded) whose teacher
prompt builds (and fits) under every condition, so all conditions score the same rollouts;
``sample_rollouts`` samples ``rollouts_per_prompt`` responses each from the student prompt with HF
``generate`` (``recipe.cpu.hf_generate``, any device) or vLLM (GPU); ``save_rollouts`` /
``load_rollouts`` keep them to rescore under other conditions.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from recipe.analysis.signal_conditions import TRUNCATED_FIELD, Condition, SignalAnalysisConfig, sampling_settings
from recipe.common import chat, prompts

logger = logging.getLogger(__name__)

@dataclass
class PromptItem:
    """One drawn parquet row with its rendered student and teacher prompt ids."""

    row: int
    student_ids: list[int]
    teacher_ids: dict[str, list[int]]
    # conditions whose privileged text was cut to fit their prompt cap
    truncated: list[str] = field(default_factory=list)


@dataclass
class Rollout:
    """One sampled response of a prompt item."""

    prompt: int  # index into the PromptItem list
    response_ids: list[int]
    finish_reason: str
    # log-prob of each sampled token as reported by the sampler (None if it gave none)
    logprobs: list[float] | None = None


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a verl training parquet as dicts (``prompt`` chat list + ``extra_info``)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training parquet not found: {path}")
    frame = pd.read_parquet(path)
    missing = [c for c in ("prompt", "extra_info") if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected the verl schema of docs/ARCHITECTURE.md")
    rows = []
    for i, rec in enumerate(frame.to_dict("records")):
        messages = rec["prompt"]
        messages = [dict(m) for m in (messages.tolist() if hasattr(messages, "tolist") else messages)]
        extra = rec["extra_info"]
        if not isinstance(extra, Mapping):
            raise ValueError(f"{path}: row {i}: extra_info must be a struct/dict, got {type(extra).__name__}")
        rows.append({"prompt": messages, "extra_info": dict(extra)})
    return rows


class _Unusable(ValueError):
    """A row that cannot be scored under a condition (the message is the skip reason)."""


def teacher_prompt_ids(extra_info: Mapping[str, Any], cond: Condition, tokenizer) -> tuple[list[int], bool]:
    """Rendered teacher prompt ids of one row under ``cond``, and whether its privileged text was cut.

    Without a prompt cap: the full prompt. With ``cond.prompt_cap``: the full prompt if it fits, else the
    privileged text ``TRUNCATED_FIELD[context]`` is cut to its longest token prefix (tokenized without
    special tokens, decoded back, prompt re-rendered) whose prompt has at most ``prompt_cap`` tokens
    (binary search over the prefix length). Raises ``_Unusable`` (a ``ValueError``) naming the reason
    when a field is missing or not even a one-token prefix fits.
    """
    mode = cond.mode

    def render(extra: Mapping[str, Any]) -> list[int]:
        try:
            _, teacher_msgs = prompts.build_prompt_pair(cond.context, extra)
        except ValueError:
            raise _Unusable(f"missing field for {cond.context}") from None
        return list(chat.render_ids(teacher_msgs, tokenizer, mode))

    ids = render(extra_info)
    if cond.prompt_cap is None or len(ids) <= cond.prompt_cap:
        return ids, False
    field_name = TRUNCATED_FIELD[cond.context]
    text_ids = tokenizer(extra_info[field_name], add_special_tokens=False)["input_ids"]

    def fitting(k: int) -> list[int] | None:
        try:
            cut = render({**extra_info, field_name: tokenizer.decode(text_ids[:k])})
        except _Unusable:  # a whitespace-only prefix
            return None
        return cut if len(cut) <= cond.prompt_cap else None

    lo, hi = 0, len(text_ids) - 1  # the largest k in [1, hi] whose prompt fits (0: none does)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fitting(mid) is not None:
            lo = mid
        else:
            hi = mid - 1
    best = fitting(lo) if lo > 0 else None
    if best is None:
        raise _Unusable(f"teacher prompt > {cond.prompt_cap} tokens with {field_name} cut ({cond.name})")
    return best, True


def check_modes(tokenizer, config: SignalAnalysisConfig) -> None:
    """Refuse think / no_think up front when the chat template has no enable_thinking switch."""
    asked = sorted(({config.student_mode} | {Condition.parse(c).mode for c in config.conditions}) - {"native"})
    if asked and not chat.has_thinking_switch(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"mode(s) {asked} asked for, but the chat template of {name!r} has no enable_thinking switch; "
            "use --student-mode native and conditions context:native (the template's own default)"
        )


def build_prompt_items(
    rows: Sequence[Mapping[str, Any]], tokenizer, *, config: SignalAnalysisConfig
) -> tuple[list[PromptItem], dict[str, int]]:
    """Draw ``num_prompts`` rows (seeded) whose teacher prompts build (and fit) under every condition.

    Returns the items and counts of skipped rows by reason.
    """
    check_modes(tokenizer, config)
    conditions = [Condition.parse(c) for c in config.conditions]
    order = list(range(len(rows)))
    random.Random(config.seed).shuffle(order)
    items, skipped = [], {}
    for row in order:
        if len(items) == config.num_prompts:
            break
        record = rows[row]
        teacher_ids, truncated, reason = {}, [], None
        for cond in conditions:
            try:
                ids, cut = teacher_prompt_ids(record["extra_info"], cond, tokenizer)
            except _Unusable as err:
                reason = str(err)
                break
            limit = config.teacher_max_prompt_length
            if cond.prompt_cap is None and limit is not None and len(ids) > limit:
                reason = f"teacher prompt > {limit} tokens ({cond.name})"
                break
            teacher_ids[cond.name] = ids
            truncated += [cond.name] if cut else []
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        student_ids = list(chat.render_ids(record["prompt"], tokenizer, config.student_mode))
        items.append(PromptItem(row=row, student_ids=student_ids, teacher_ids=teacher_ids, truncated=truncated))
    if not items:
        raise ValueError(f"no parquet row can be scored under {list(config.conditions)}; skipped: {skipped}")
    if len(items) < config.num_prompts:
        logger.warning("only %d of the requested %d prompts are usable (skipped: %s)", len(items), config.num_prompts, skipped)
    return items, skipped


def sample_rollouts(model, tokenizer, items: Sequence[PromptItem], *, config: SignalAnalysisConfig) -> list[Rollout]:
    """``rollouts_per_prompt`` sampled responses per item (response ids end with eos if finished).

    ``model`` is the loaded HF model for ``backend="hf"`` and the model directory for
    ``backend="vllm"`` (sample before loading the HF model on the same GPU).
    """
    if config.backend == "vllm":
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(model)
        except OSError:
            generation_config = None
        return _sample_vllm(model, items, eos_ids=_eos_ids(generation_config, tokenizer), config=config)
    eos_ids = _eos_ids(model.generation_config, tokenizer)
    from recipe.cpu.hf_generate import SampleParams, sample_batch

    params = SampleParams(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k
    )
    jobs = [(p, r) for p in range(len(items)) for r in range(config.rollouts_per_prompt)]
    rollouts = []
    for start in range(0, len(jobs), config.sample_batch_size):
        batch = jobs[start : start + config.sample_batch_size]
        out = sample_batch(
            model,
            [items[p].student_ids for p, _ in batch],
            params=params,
            eos_token_ids=eos_ids,
            pad_token_id=_pad_id(tokenizer, eos_ids),
            seed=config.seed + start,
        )
        for (p, _), ids, logps, reason in zip(batch, out.response_ids, out.logprobs, out.finish_reasons):
            rollouts.append(Rollout(prompt=p, response_ids=list(ids), finish_reason=reason, logprobs=list(logps)))
    return rollouts


def _sample_vllm(model_path, items, *, eos_ids, config):  # GPU only; not exercised by the CPU tests
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError as err:
        raise ImportError("backend='vllm' needs vLLM (pip install -e '.[vllm]'); use backend='hf' on CPU") from err
    llm = LLM(model=str(model_path), seed=config.seed)
    params = SamplingParams(
        n=config.rollouts_per_prompt,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k if config.top_k > 0 else -1,
        max_tokens=config.max_new_tokens,
        stop_token_ids=list(eos_ids),
    )  # no per-request seed: it would give every prompt the same random stream
    outputs = llm.generate([TokensPrompt(prompt_token_ids=item.student_ids) for item in items], params)
    rollouts = []
    for p, out in enumerate(outputs):
        for completion in out.outputs:
            ids = list(completion.token_ids)
            reason = "stop" if completion.finish_reason == "stop" else "length"
            rollouts.append(Rollout(prompt=p, response_ids=ids, finish_reason=reason))
    del llm
    return rollouts


def _eos_ids(generation_config, tokenizer) -> list[int]:
    ids = generation_config.eos_token_id if generation_config is not None else None
    ids = ids if ids is not None else tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if not ids:
        raise ValueError("the model's generation_config and the tokenizer define no eos token")
    return ids


def _pad_id(tokenizer, eos_ids: Sequence[int]) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]


def save_rollouts(path: str | Path, items: Sequence[PromptItem], rollouts: Sequence[Rollout], *, meta: Mapping[str, Any]) -> None:
    """Write the drawn rows, student prompt ids and sampled responses (JSON), to rescore later."""
    payload = {
        "meta": dict(meta),
        "items": [{"row": it.row, "student_ids": it.student_ids} for it in items],
        "rollouts": [asdict(r) for r in rollouts],
    }
    Path(path).write_text(json.dumps(payload))


def load_rollouts(
    path: str | Path, rows: Sequence[Mapping[str, Any]], tokenizer, *, config: SignalAnalysisConfig
) -> tuple[list[PromptItem], list[Rollout], dict[str, Any]]:
    """Rollouts saved by ``save_rollouts``, with teacher prompts rebuilt for ``config.conditions``.

    The student prompt ids are re-rendered and must equal the saved ones (same parquet,
    tokenizer, template and student mode); every saved row must build under every condition.
    """
    path = Path(path)
    payload = json.loads(path.read_text())
    saved = payload["meta"].get("sampling", {})
    current = sampling_settings(config)
    differ = {k: (saved[k], current[k]) for k in current if k in saved and saved[k] != current[k]}
    if differ:
        raise ValueError(f"{path}: rollouts were sampled with different settings (saved, requested): {differ}")
    check_modes(tokenizer, config)
    conditions = [Condition.parse(c) for c in config.conditions]
    items = []
    for k, saved in enumerate(payload["items"]):
        row = saved["row"]
        if not 0 <= row < len(rows):
            raise ValueError(f"{path}: item {k} refers to parquet row {row}, but the parquet has {len(rows)} rows")
        student_ids = chat.render_ids(rows[row]["prompt"], tokenizer, config.student_mode)
        if list(student_ids) != saved["student_ids"]:
            raise ValueError(
                f"{path}: item {k} (row {row}): the student prompt ids differ from the saved ones; "
                "different parquet, tokenizer, chat template or student mode?"
            )
        teacher_ids, truncated = {}, []
        for cond in conditions:
            try:
                teacher_ids[cond.name], cut = teacher_prompt_ids(rows[row]["extra_info"], cond, tokenizer)
            except _Unusable as err:
                raise ValueError(f"{path}: item {k} (row {row}) cannot be scored under {cond.name}: {err}") from None
            truncated += [cond.name] if cut else []
        items.append(PromptItem(row=row, student_ids=list(student_ids), teacher_ids=teacher_ids, truncated=truncated))
    rollouts = [Rollout(**r) for r in payload["rollouts"]]
    return items, rollouts, payload["meta"]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(path: str | Path):
    """Tokenizer of an HF model directory (no download)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json); merge FSDP checkpoints first")
    return AutoTokenizer.from_pretrained(path)


def load_model(path: str | Path, *, device: str = "cpu", dtype: str = "float32"):
    """The causal LM of an HF model directory, in eval mode, without any download."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return AutoModelForCausalLM.from_pretrained(Path(path), dtype=DTYPES[dtype]).to(device).eval()
