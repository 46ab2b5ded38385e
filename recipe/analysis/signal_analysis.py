"""Frozen teacher-student signal analysis: sample rollouts once, rescore them under teacher conditions.

Spec: paper section "Analysis: From Token-Level Signals to Optimization Dynamics" and
appendix "Token-Level Analysis Protocol":

    "For each initial checkpoint, we sample 2,048 training prompts with two on-policy
    rollouts each (n=4,096) at temperature 1.1 and a 1,024-token rollout cap. The frozen
    self-teacher scores the visited response tokens under its privileged context. Reported
    forward KL is the vocabulary-summed, unclipped beta=0 divergence."

Protocol implemented here (``run_signal_analysis``):

1. Draw ``num_prompts`` rows of a verl training parquet (seeded permutation of the rows
   whose teacher prompt can be built, and fits ``teacher_max_prompt_length`` if set, under
   EVERY condition, so all conditions score the same rollouts) and sample
   ``rollouts_per_prompt`` responses each from the student prompt (the parquet ``prompt``
   column, rendered in ``student_mode``) with HF ``generate`` (CPU) or vLLM (GPU).
2. For every condition ``context:mode`` (e.g. ``full_solution:think``), build the teacher
   prompt from ``extra_info`` with ``recipe.common.prompts.build_prompt_pair``, render it in
   that mode, and splice the SAME response ids after it at the token level (no decode /
   re-encode). One forward pass of the model on [student prompt || response] and one on
   [teacher prompt || response] give the final hidden states at the response positions;
   ``recipe.opsd.core.signals.token_signals_from_hidden`` projects them through the lm_head in
   chunks (nothing of size [N, V] beyond a chunk) with the sampling temperature (1.1), as
   in training.
3. Summaries per condition with the shared signal functions: Fwd KL, D>.05 (%), |adv|,
   top-1 agreement, Enc / Disc (%), position windows (mean / SNR), HE20 shares of KL and
   |adv|, and the vocabulary items with the largest cumulative divergence mass; plus one
   feature vector per rollout for the PCA of ``fig:teacher_context_signals`` (features
   standardised within the model, PCA by ``torch.linalg.svd``).

The student mode is one per run (the rollouts depend on it); the paper's S/T mode grid is
two runs, ``--student-mode think`` and ``--student-mode no_think``, each with conditions
``full_solution:think full_solution:no_think``. A template without an enable_thinking switch
(SmolLM2, DeepSeek-R1-Distill, OLMo-3) has one mode, ``native`` (the template's own default):
``--student-mode native`` and conditions ``full_solution:native``. A prompt cap
``full_solution:think@1024`` cuts the reference solution so the teacher prompt fits 1,024 tokens
(the paper's Sol vs Sol-long control, ``TRUNCATED_FIELD``).

Model heads: the logit scale of ``recipe.common.heads.output_logit_scale`` is folded into the
lm_head weight, the trainer's policy (Falcon-H1R's ``lm_head_multiplier``); soft-capped heads are
refused; any other head whose logits are not ``h @ W.T + b`` is refused by a check on one sequence.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from recipe.analysis import generation_features
from recipe.common import chat, heads, prompts
from recipe.opsd.core import signals

logger = logging.getLogger(__name__)

# Reasoning modes of student and teacher prompts; ``native`` renders the chat template's own default
# (no enable_thinking passed), the only mode of a template without the switch (SmolLM2, DeepSeek-R1-Distill).
MODES = chat.MODES
# The privileged text a prompt cap ``context:mode@N`` truncates (token prefix) so the rendered teacher
# prompt has at most N tokens (paper, appendix "Long Full-Solution Teacher Prefixes": the short
# condition truncates C in Q + C). cot_solution: the CoT is cut, the final solution kept whole.
TRUNCATED_FIELD = {"full_solution": "solution", "cot_solution": "cot", "unrelated": "unrelated_solution"}
# Warn when rescored student log-probs differ from the sampler's by more than this (nats);
# fp32 generate with a KV cache vs one full forward agree to ~1e-5 on CPU, bf16 to ~1e-2.
SAMPLER_GAP_WARNING = 5e-2
BACKENDS = ("hf", "vllm")
# Per-rollout features of the PCA (means over the rollout's response positions).
ROLLOUT_FEATURES = ("fwd_kl", "kl_gt_rate", "abs_adv", "top1_agree", "enc", "disc", "teacher_entropy")
# Contexts whose student message differs from the default one: they cannot rescore rollouts
# sampled under the default student prompt.
_STUDENT_CHANGING_CONTEXTS = tuple(c for c in prompts.TEACHER_CONTEXTS if prompts.student_style(c) is not None)


@dataclass(frozen=True)
class Condition:
    """A teacher condition: privileged context, reasoning mode and optional prompt cap of the teacher prompt.

    ``prompt_cap`` (``context:mode@N``): the context's privileged text (``TRUNCATED_FIELD``) is cut to the
    longest token prefix whose rendered teacher prompt has at most N tokens; None = the full text.
    """

    context: str
    mode: str
    prompt_cap: int | None = None

    @property
    def name(self) -> str:
        base = f"{self.context}:{self.mode}"
        return base if self.prompt_cap is None else f"{base}@{self.prompt_cap}"

    @classmethod
    def parse(cls, spec: str) -> "Condition":
        body, at, cap = spec.partition("@")
        context, sep, mode = body.partition(":")
        if not sep:
            raise ValueError(f"condition {spec!r} must be context:mode[@cap], e.g. full_solution:think, "
                             "full_solution:native (template default) or full_solution:think@1024")
        if context not in prompts.TEACHER_CONTEXTS:
            raise ValueError(f"condition {spec!r}: context must be one of {list(prompts.TEACHER_CONTEXTS)}")
        if context in _STUDENT_CHANGING_CONTEXTS:
            raise ValueError(
                f"condition {spec!r}: this context also changes the student prompt, so it cannot rescore "
                "rollouts sampled under the default student prompt; analyse it in its own run"
            )
        if mode not in MODES:
            raise ValueError(f"condition {spec!r}: mode must be one of {list(MODES)}")
        prompt_cap = None
        if at:
            if context not in TRUNCATED_FIELD:
                raise ValueError(f"condition {spec!r}: a prompt cap @N truncates the privileged text of "
                                 f"{list(TRUNCATED_FIELD)}; {context!r} has none to truncate")
            if not cap.isdigit() or int(cap) < 1:
                raise ValueError(f"condition {spec!r}: the prompt cap after @ must be a positive integer")
            prompt_cap = int(cap)
        return cls(context=context, mode=mode, prompt_cap=prompt_cap)


@dataclass
class SignalAnalysisConfig:
    """Settings of one analysis run (defaults: the paper's protocol).

    Attributes:
        num_prompts, rollouts_per_prompt: K prompts x R rollouts (paper: 2,048 x 2).
        temperature, top_p, top_k, max_new_tokens: rollout sampling. The paper states T 1.1 and the
            1,024-token cap ("two on-policy rollouts each ... at temperature 1.1"), not top-p / top-k;
            the default is the training sampler's (opsd_trainer.yaml rollout: top-p 0.95, top-k 20,
            the paper's "Student rollouts use multinomial sampling with temperature 1.1, top-p=0.95,
            top-k=20"), so the rollouts are the ones training would score. ``top_p=1.0, top_k=-1``
            samples the untruncated distribution instead. The scored distributions are never
            truncated (the loss's full-vocabulary distributions at the scoring temperature).
        seed: prompt draw and sampling seed.
        student_mode: reasoning mode of the student prompt (``think`` / ``no_think`` / ``native``).
        conditions: teacher conditions ``context:mode`` or ``context:mode@cap`` (``Condition``).
        signal_temperature: temperature of both distributions when scoring; None = ``temperature``
            (training divides both logits by the rollout temperature).
        clip_tau: per-entry cap used only for the clip diagnostics (clip_frac, clipped mass);
            the D > .05 rate is ``signals.HIGH_KL_THRESHOLD`` on the summed unclipped KL.
        entropy_fraction: highest-student-entropy fraction of the tail shares (HE20: 0.2).
        windows: response-position windows [lo, hi) of the position table (paper: 0-128-256-
            512-1k-2k-4k-6k, ``signals.DEFAULT_WINDOWS``).
        top_tokens: number of vocabulary items listed by divergence mass.
        teacher_max_prompt_length: rows whose teacher prompt is longer (under any condition without
            its own ``@cap``) are not drawn; None = no cap.
        chunk_size: rows per lm_head chunk in the signal computation.
        sample_batch_size, score_batch_size: sequences per generate / scoring forward call.
        backend: ``hf`` (transformers generate, any device) or ``vllm`` (GPU, lazy import).
    """

    num_prompts: int = 2048
    rollouts_per_prompt: int = 2
    temperature: float = 1.1
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 1024
    seed: int = 42
    student_mode: str = "think"
    conditions: tuple[str, ...] = ("full_solution:think",)
    signal_temperature: float | None = None
    clip_tau: float = 0.05
    entropy_fraction: float = 0.2
    windows: tuple[tuple[int, int], ...] = signals.DEFAULT_WINDOWS
    top_tokens: int = 20
    teacher_max_prompt_length: int | None = None
    chunk_size: int = 1024
    sample_batch_size: int = 16
    score_batch_size: int = 8
    backend: str = "hf"

    def __post_init__(self) -> None:
        for name in ("num_prompts", "rollouts_per_prompt", "max_new_tokens", "chunk_size", "sample_batch_size",
                     "score_batch_size", "top_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SignalAnalysisConfig.{name} must be an int >= 1, got {value!r}")
        if not self.temperature > 0:
            raise ValueError(f"SignalAnalysisConfig.temperature must be > 0 (sampling), got {self.temperature!r}")
        if self.signal_temperature is not None and not self.signal_temperature > 0:
            raise ValueError(f"SignalAnalysisConfig.signal_temperature must be > 0 or None, got {self.signal_temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SignalAnalysisConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SignalAnalysisConfig.top_k must be -1/0 (off) or a positive int, got {self.top_k!r}")
        if self.student_mode not in MODES:
            raise ValueError(f"SignalAnalysisConfig.student_mode must be one of {list(MODES)}, got {self.student_mode!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"SignalAnalysisConfig.backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if not 0 < self.entropy_fraction < 1:
            raise ValueError(f"SignalAnalysisConfig.entropy_fraction must be in (0, 1), got {self.entropy_fraction!r}")
        if not self.clip_tau > 0:
            raise ValueError(f"SignalAnalysisConfig.clip_tau must be > 0, got {self.clip_tau!r}")
        if self.teacher_max_prompt_length is not None and self.teacher_max_prompt_length < 1:
            raise ValueError(
                f"SignalAnalysisConfig.teacher_max_prompt_length must be >= 1 or None, got {self.teacher_max_prompt_length!r}"
            )
        self.windows = tuple((int(lo), int(hi)) for lo, hi in self.windows)
        if not self.windows or any(not 0 <= lo < hi for lo, hi in self.windows):
            raise ValueError(f"SignalAnalysisConfig.windows must be non-empty (lo, hi) pairs with 0 <= lo < hi, got {self.windows}")
        if isinstance(self.conditions, str):
            raise ValueError("SignalAnalysisConfig.conditions must be a list of context:mode strings, not one string")
        self.conditions = tuple(self.conditions)
        if not self.conditions:
            raise ValueError("SignalAnalysisConfig.conditions is empty; give at least one context:mode")
        if self.num_prompts * self.rollouts_per_prompt * len(self.conditions) < 2:
            raise ValueError("SignalAnalysisConfig: the rollout PCA needs at least 2 rollout x condition summaries; "
                             "raise num_prompts, rollouts_per_prompt or the number of conditions")
        parsed = [Condition.parse(c).name for c in self.conditions]
        if len(set(parsed)) != len(parsed):
            raise ValueError(f"SignalAnalysisConfig.conditions has duplicates: {list(self.conditions)}")

    @property
    def scoring_temperature(self) -> float:
        return self.temperature if self.signal_temperature is None else self.signal_temperature


# ---------------------------------------------------------------------------- data
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


# ---------------------------------------------------------------------------- sampling
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


# ---------------------------------------------------------------------------- scoring
def response_hidden_states(model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """Final hidden states ``[N, H]`` that predict each response token, for a batch of
    (prompt ids, response ids) pairs; N = total response tokens, in input order.

    The sequences are right-padded (causal attention: pads after a sequence never affect it)
    and the row for response token j of a prompt of length P is position P + j - 1.
    """
    device = model.device
    lengths = [len(p) + len(r) for p, r in sequences]
    width = max(lengths)
    pad = 0
    input_ids_BT = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask_BT = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, (prompt_ids, response_ids) in enumerate(sequences):
        if not prompt_ids or not response_ids:
            raise ValueError(f"sequence {b}: prompt and response must both be non-empty")
        ids = list(prompt_ids) + list(response_ids)
        input_ids_BT[b, : len(ids)] = torch.as_tensor(ids)
        mask_BT[b, : len(ids)] = 1
    backbone = getattr(model, model.base_model_prefix)
    hidden_BTH = backbone(input_ids=input_ids_BT.to(device), attention_mask=mask_BT.to(device)).last_hidden_state
    rows = []
    for b, (prompt_ids, response_ids) in enumerate(sequences):
        start = len(prompt_ids) - 1
        rows.append(hidden_BTH[b, start : start + len(response_ids)])
    return torch.cat(rows, dim=0)


def output_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight_VH, bias_V)`` with the head's logit scale folded in: logits = h @ W.T + b.

    One policy with the trainer (``recipe.common.heads.output_logit_scale``): a linear logit scale
    (Falcon-H1's ``lm_head_multiplier``, Cohere, Granite) multiplies the weight and bias; a soft-capped
    head is refused there.
    """
    head = model.get_output_embeddings()
    scale = heads.output_logit_scale(model.config)
    weight_VH, bias_V = head.weight, getattr(head, "bias", None)
    if scale != 1.0:
        weight_VH = weight_VH * scale
        bias_V = bias_V * scale if bias_V is not None else None
    return weight_VH, bias_V


def check_head_matches_logits(model, ids: Sequence[int], weight_VH: torch.Tensor, bias_V: torch.Tensor | None) -> None:
    """Refuse a model whose logits are not ``h @ W.T + b`` with the folded head (a head the policy misses)."""
    input_ids = torch.as_tensor([list(ids)], device=model.device)
    logits = model(input_ids=input_ids).logits[0].float()
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids).last_hidden_state[0]
    rebuilt = torch.nn.functional.linear(hidden, weight_VH, bias_V).float()
    if not torch.allclose(logits, rebuilt, atol=1e-3, rtol=1e-3):
        raise ValueError(
            f"{type(model).__name__}: logits are not output_logit_scale x lm_head(last_hidden_state) (max diff "
            f"{(logits - rebuilt).abs().max().item():.3g}); this model's output head is not supported "
            "(recipe.common.heads.output_logit_scale)"
        )


def sampler_view_logp(
    student_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None, sampled_N: torch.Tensor, *,
    config: SignalAnalysisConfig,
) -> torch.Tensor:
    """log-prob of each sampled token under the distribution the sampler drew it from: the student
    logits at the sampling temperature, then top-k, then top-p (transformers' warpers, the order of
    ``recipe.cpu.hf_generate``). Compared with the sampler's own log-probs by the rescoring check."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    warpers = []
    if config.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
    if config.top_p < 1:
        warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    out = []
    for start in range(0, student_NH.shape[0], config.chunk_size):
        rows = slice(start, start + config.chunk_size)
        scores = torch.nn.functional.linear(student_NH[rows], weight_VH, bias_V).float() / config.temperature
        for warper in warpers:
            scores = warper(None, scores)
        out.append(torch.log_softmax(scores, dim=-1).gather(-1, sampled_N[rows].unsqueeze(-1)).squeeze(-1))
    return torch.cat(out) if out else student_NH.new_zeros(0)


@torch.no_grad()
def score_rollouts(
    model, items: Sequence[PromptItem], rollouts: Sequence[Rollout], *, config: SignalAnalysisConfig
) -> dict[str, dict[str, torch.Tensor]]:
    """Token signals of every rollout under every condition.

    Returns ``{condition: {signal: Tensor[N]}}`` (the keys of ``signals.token_signals_from_hidden``
    plus ``sampled_id``, ``rollout``, ``position``: token id, rollout index and 0-based response
    position of each row, and ``sampler_view_logp`` (``sampler_view_logp``); rows are the response
    tokens of all rollouts in order)
    and ``mass_V``: the float64 [V] divergence mass sum_i d_{i,v} per vocabulary id.
    """
    weight_VH, bias_V = output_head(model)
    conditions = [Condition.parse(c) for c in config.conditions]
    temperature = config.scoring_temperature
    check_head_matches_logits(model, (items[0].student_ids + rollouts[0].response_ids)[:64], weight_VH, bias_V)
    parts: dict[str, list[dict[str, torch.Tensor]]] = {c.name: [] for c in conditions}
    mass = {c.name: None for c in conditions}
    for start in range(0, len(rollouts), config.score_batch_size):
        batch = list(range(start, min(start + config.score_batch_size, len(rollouts))))
        responses = [rollouts[i].response_ids for i in batch]
        sampled_N = torch.as_tensor([t for r in responses for t in r], dtype=torch.long, device=model.device)
        index = {
            "sampled_id": sampled_N.cpu(),
            "rollout": torch.as_tensor([i for i, r in zip(batch, responses) for _ in r], dtype=torch.long),
            "position": torch.as_tensor([j for r in responses for j in range(len(r))], dtype=torch.long),
        }
        student_NH = response_hidden_states(model, [(items[rollouts[i].prompt].student_ids, rollouts[i].response_ids) for i in batch])
        index["sampler_view_logp"] = sampler_view_logp(student_NH, weight_VH, bias_V, sampled_N, config=config).cpu()
        for cond in conditions:
            teacher_NH = response_hidden_states(
                model, [(items[rollouts[i].prompt].teacher_ids[cond.name], rollouts[i].response_ids) for i in batch]
            )
            head_args = dict(student_bias=bias_V, teacher_bias=bias_V, student_temperature=temperature,
                             teacher_temperature=temperature, chunk_size=config.chunk_size)
            out = signals.token_signals_from_hidden(
                student_NH, weight_VH, teacher_NH, weight_VH, sampled_N, clip_tau=config.clip_tau, **head_args
            )
            parts[cond.name].append({**{k: v.detach().cpu() for k, v in out.items()}, **index})
            mass[cond.name] = signals.divergence_mass_by_token_from_hidden(
                student_NH, weight_VH, teacher_NH, weight_VH, mass_V=mass[cond.name], **head_args
            )
    return {
        name: {**{k: torch.cat([p[k] for p in chunks]) for k in chunks[0]}, "mass_V": mass[name].cpu()}
        for name, chunks in parts.items()
    }


# ---------------------------------------------------------------------------- summaries
def sampler_logp_gap(rollouts: Sequence[Rollout], token_signals: Mapping[str, torch.Tensor]) -> float | None:
    """Max |rescored log-prob - sampler log-prob| of the sampled tokens, both under the sampling
    distribution (``sampler_view_logp``: sampling temperature, top-k, top-p): a check that the
    rescoring sees the rollouts exactly as they were sampled (prompt, alignment, template, dtype).
    None when the sampler reported no log-probs (vLLM backend).
    """
    if any(r.logprobs is None for r in rollouts):
        return None
    sampled = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=torch.float64)
    return float((token_signals["sampler_view_logp"].double() - sampled).abs().max())


def rollout_features(token_signals: Mapping[str, torch.Tensor], *, num_rollouts: int) -> torch.Tensor:
    """``[num_rollouts, len(ROLLOUT_FEATURES)]`` per-rollout means over response positions:
    forward KL, D > .05 rate, |adv|, top-1 agreement, Enc (a > 0), Disc (a < 0), teacher entropy."""
    adv = token_signals["adv"].double()
    columns = {
        "fwd_kl": token_signals["fwd_kl"].double(),
        "kl_gt_rate": (token_signals["fwd_kl"] > signals.HIGH_KL_THRESHOLD).double(),
        "abs_adv": adv.abs(),
        "top1_agree": token_signals["top1_agree"].double(),
        "enc": (adv > 0).double(),
        "disc": (adv < 0).double(),
        "teacher_entropy": token_signals["teacher_entropy"].double(),
    }
    index = token_signals["rollout"]
    counts = torch.zeros(num_rollouts, dtype=torch.float64).index_add_(0, index, torch.ones_like(adv))
    out = torch.stack(
        [torch.zeros(num_rollouts, dtype=torch.float64).index_add_(0, index, columns[f]) for f in ROLLOUT_FEATURES], dim=1
    )
    return out / counts.clamp_min(1).unsqueeze(1)


def standardize(features_MF: torch.Tensor) -> torch.Tensor:
    """Z-score every column (population std); constant columns become 0."""
    x = features_MF.double()
    std = x.std(dim=0, unbiased=False)
    return (x - x.mean(dim=0)) / torch.where(std > 0, std, torch.ones_like(std))


@dataclass
class PCAResult:
    coords_MC: torch.Tensor  # projections of the rows
    components_CF: torch.Tensor  # unit principal directions
    explained_variance_ratio_C: torch.Tensor
    mean_F: torch.Tensor


def pca(features_MF: torch.Tensor, *, n_components: int = 2) -> PCAResult:
    """PCA by SVD of the centred matrix. Each component's sign is fixed so that its
    largest-magnitude loading is positive (deterministic output)."""
    x = features_MF.double()
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"pca: need a [M >= 2, F] matrix, got shape {tuple(x.shape)}")
    if not 1 <= n_components <= min(x.shape):
        raise ValueError(f"pca: n_components must be in [1, {min(x.shape)}], got {n_components}")
    mean_F = x.mean(dim=0)
    centred = x - mean_F
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    components = vh[:n_components]
    signs = torch.sign(components.gather(1, components.abs().argmax(dim=1, keepdim=True)))
    components = components * signs
    total = (s**2).sum()
    ratio = (s[:n_components] ** 2) / total if total > 0 else torch.zeros(n_components, dtype=x.dtype)
    return PCAResult(coords_MC=centred @ components.T, components_CF=components, explained_variance_ratio_C=ratio, mean_F=mean_F)


def entropy_strata(fwd_kl_N: torch.Tensor, entropy_N: torch.Tensor, *, fraction: float) -> dict[str, float]:
    """Mean forward KL and D > .05 rate (%) of the highest- and the lowest-student-entropy ``fraction``
    of the pooled positions (paper ``tab:token_entropy_signal_app``, "Highest 20%" / "Lowest 20%").

    Selection as ``signals.entropy_tail_shares``: ceil(fraction x N) positions, stable sort, ties
    broken by index. Keys ``highest_kl``, ``highest_d_gt_005``, ``lowest_kl``, ``lowest_d_gt_005``.
    """
    n = fwd_kl_N.numel()
    keep = math.ceil(n * fraction - 1e-9)
    kl = fwd_kl_N.double()
    out = {}
    for name, descending in (("highest", True), ("lowest", False)):
        chosen = kl[torch.sort(entropy_N.double(), descending=descending, stable=True).indices[:keep]]
        out[f"{name}_kl"] = float(chosen.mean()) if keep else math.nan
        out[f"{name}_d_gt_005"] = 100.0 * float((chosen > signals.HIGH_KL_THRESHOLD).double().mean()) if keep else math.nan
    return out


def condition_report(
    token_signals: Mapping[str, torch.Tensor], tokenizer, *, config: SignalAnalysisConfig, num_rollouts: int
) -> dict[str, Any]:
    """Tables of one condition, from the shared signal functions (``recipe.opsd.core.signals``)."""
    sig = {k: token_signals[k] for k in signals.SIGNAL_KEYS}
    summary = signals.summarize_signals(sig)
    tails = signals.entropy_tail_shares(
        sig["fwd_kl"], sig["adv"].abs(), sig["student_entropy"], fraction=config.entropy_fraction
    )
    windows = signals.position_windows(sig["fwd_kl"], token_signals["position"], windows=config.windows)
    for window in windows:
        window["window"] = _window_label(window["lo"], window["hi"])
    mass_V = token_signals["mass_V"]
    total = float(mass_V.sum())
    # Per-entry terms are signed (d_v < 0 where pT(v) < pS(v)); list the largest positive masses.
    top_ids = [t for t in torch.argsort(mass_V, descending=True, stable=True)[: config.top_tokens].tolist() if mass_V[t] > 0]
    top = [
        {
            "token_id": int(t),
            "token": tokenizer.decode([int(t)]),
            "mass": float(mass_V[t]),
            "share": 100.0 * float(mass_V[t]) / total if total > 0 else math.nan,
        }
        for t in top_ids
    ]
    return {
        "summary": summary,
        "entropy_tails": {"fraction": config.entropy_fraction, **tails,
                          **entropy_strata(sig["fwd_kl"], sig["student_entropy"], fraction=config.entropy_fraction)},
        "position_windows": windows,
        "top_tokens": top,
        "rollout_features": rollout_features(token_signals, num_rollouts=num_rollouts).tolist(),
    }


def _window_label(lo: int, hi: int) -> str:
    def k(x: int) -> str:
        return f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)

    return f"[{k(lo)},{k(hi)})"


# ---------------------------------------------------------------------------- driver
def run_signal_analysis(
    model, tokenizer, rows: Sequence[Mapping[str, Any]], *, config: SignalAnalysisConfig, model_name: str = "model",
    data_label: str = "data", rollouts: Sequence[Rollout] | None = None, items: Sequence[PromptItem] | None = None,
) -> dict[str, Any]:
    """Sample (unless ``rollouts`` + ``items`` are given), score, summarise. Returns the result dict.

    ``model_name`` and ``data_label`` (the dataset, e.g. ``openthoughts``) name the run in multi-run
    tables and the joint PCA, where conditions of different datasets are kept apart.
    """
    skipped: dict[str, int] = {}
    if items is None:
        items, skipped = build_prompt_items(rows, tokenizer, config=config)
    if rollouts is None:
        rollouts = sample_rollouts(model, tokenizer, items, config=config)
    token_signals = score_rollouts(model, items, rollouts, config=config)
    conditions = {
        name: condition_report(sig, tokenizer, config=config, num_rollouts=len(rollouts)) for name, sig in token_signals.items()
    }
    names = list(conditions)
    stacked = torch.cat([torch.tensor(conditions[n]["rollout_features"], dtype=torch.float64) for n in names])
    result_pca = pca(standardize(stacked), n_components=2)
    coords = result_pca.coords_MC.split(len(rollouts))
    for name, xy in zip(names, coords):
        conditions[name]["pca"] = xy.tolist()
    lengths = [len(r.response_ids) for r in rollouts]
    gap = sampler_logp_gap(rollouts, next(iter(token_signals.values())))
    if gap is not None and gap > SAMPLER_GAP_WARNING:
        logger.warning(
            "rescored student log-probs differ from the sampler's by up to %.3g (> %g): the rescoring does not see "
            "the rollouts as sampled (prompt, template or dtype mismatch?)", gap, SAMPLER_GAP_WARNING,
        )
    texts = [tokenizer.decode(r.response_ids, skip_special_tokens=True) for r in rollouts]
    style = generation_features.feature_rates([{"text": t, "num_tokens": n} for t, n in zip(texts, lengths)])
    prompt_truncated = {name: sum(name in item.truncated for item in items) for name in names if "@" in name}
    return {
        "sampler_logp_max_abs_diff": gap,
        "model": model_name,
        "data_label": data_label,
        "config": asdict(config),
        "num_prompts": len(items),
        "num_rollouts": len(rollouts),
        "num_tokens": sum(lengths),
        "mean_response_length": sum(lengths) / len(lengths),
        "truncated_rate": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
        "skipped_rows": skipped,
        "prompt_truncated_rows": prompt_truncated,
        "rollout_style": style,
        "rollout_features": list(ROLLOUT_FEATURES),
        "pca": {
            "features": list(ROLLOUT_FEATURES),
            "components": result_pca.components_CF.tolist(),
            "explained_variance_ratio": result_pca.explained_variance_ratio_C.tolist(),
        },
        "conditions": conditions,
    }


def _eos_ids(generation_config, tokenizer) -> list[int]:
    ids = generation_config.eos_token_id if generation_config is not None else None
    ids = ids if ids is not None else tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if not ids:
        raise ValueError("the model's generation_config and the tokenizer define no eos token")
    return ids


def _pad_id(tokenizer, eos_ids: Sequence[int]) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]


# ---------------------------------------------------------------------------- output
def markdown_report(result: Mapping[str, Any]) -> str:
    """The paper's signal tables for one analysis result, as Markdown."""
    conds = result["conditions"]
    cfg = result["config"]
    lines = [
        f"# Token-level signals: {result['model']}",
        "",
        f"{result['num_prompts']} prompts x {cfg['rollouts_per_prompt']} rollouts = {result['num_rollouts']} rollouts, "
        f"{result['num_tokens']} response tokens (mean length {result['mean_response_length']:.1f}, "
        f"{100 * result['truncated_rate']:.1f}% hit the {cfg['max_new_tokens']}-token cap); student mode "
        f"`{cfg['student_mode']}`, data `{result.get('data_label', '-')}`, sampling T={cfg['temperature']} "
        f"top-p={cfg['top_p']} top-k={cfg['top_k'] if cfg['top_k'] > 0 else 'off'}, "
        f"scoring T={cfg['signal_temperature'] or cfg['temperature']} (full vocabulary).",
        f"Rescoring check: max |student log-prob - sampler log-prob| = {_f(result.get('sampler_logp_max_abs_diff'), 6)}.",
    ]
    if result.get("prompt_truncated_rows"):
        cut = ", ".join(f"{name}: {n} of {result['num_prompts']}" for name, n in result["prompt_truncated_rows"].items())
        lines.append(f"Rows whose privileged text was cut to the prompt cap: {cut}.")
    lines += [
        "",
        "## Signal summary",
        "",
        "Fwd KL: mean vocabulary-summed unclipped forward KL; D>.05: % positions with Fwd KL > 0.05; "
        "|adv|: mean |log pT(y) - log pS(y)|; Agree: % top-1 agreement; Enc/Disc: % positions with adv > 0 / < 0; "
        f"H_S/H_T: mean entropies; Clip: mean % vocabulary entries with d > tau={cfg['clip_tau']}.",
        "",
        "| Condition | Fwd KL | D>.05 (%) | abs adv | Agree (%) | Enc (%) | Disc (%) | H_S | H_T | Clip (%) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rep in conds.items():
        s = rep["summary"]
        lines.append(
            f"| {name} | {_f(s['fwd_kl'], 3)} | {_f(s['d_gt_005'], 1)} | {_f(s['abs_adv'], 3)} | {_f(s['agree'], 1)} | "
            f"{_f(s['enc'], 1)} | {_f(s['disc'], 1)} | {_f(s['student_entropy'], 3)} | {_f(s['teacher_entropy'], 3)} | "
            f"{_f(100 * s['clip_frac'], 3)} |"
        )
    first = next(iter(conds.values()))
    frac = round(100 * first["entropy_tails"]["fraction"])
    lines += [
        "",
        f"## Highest-entropy {frac}% shares (HE{frac})",
        "",
        f"Mean forward KL and D>.05 (%) within the {frac}% positions of highest / lowest student entropy; share (%) "
        f"of total forward KL and of total |adv| carried by the highest {frac}% (pooled positions).",
        "",
        f"| Condition | Highest {frac}% KL | Highest {frac}% D>.05 (%) | Lowest {frac}% KL | Lowest {frac}% D>.05 (%) "
        f"| HE{frac} KL (%) | HE{frac} abs adv (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rep in conds.items():
        t = rep["entropy_tails"]
        lines.append(f"| {name} | {_f(t['highest_kl'], 3)} | {_f(t['highest_d_gt_005'], 1)} | {_f(t['lowest_kl'], 3)} | "
                     f"{_f(t['lowest_d_gt_005'], 1)} | {_f(t['kl_share'], 1)} | {_f(t['abs_adv_share'], 1)} |")
    labels = [w["window"] for w in first["position_windows"]]
    lines += [
        "",
        "## Forward KL by response-position window (mean / SNR, SNR = mean / token std)",
        "",
        "| Condition | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for name, rep in conds.items():
        cells = [
            f"{_f(w['mean'], 3)} / {_f(w['snr'], 3)}" if w["count"] else "-" for w in rep["position_windows"]
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Vocabulary items with the largest divergence mass (sum over positions of d_v)", ""]
    for name, rep in conds.items():
        lines += [f"**{name}**", "", "| Rank | Token | Mass | Share (%) |", "|---|---|---|---|"]
        for rank, item in enumerate(rep["top_tokens"], start=1):
            lines.append(f"| {rank} | `{_token_text(item['token'])}` | {_f(item['mass'], 4)} | {_f(item['share'], 1)} |")
        lines.append("")
    style = result["rollout_style"]
    lines += [
        "## Rollout text features (% of rollouts; recipe/analysis/generation_features.py)",
        "",
        '| "wait" | Self-correction | <think> |',
        "|---|---|---|",
        f"| {_f(style['wait'], 1)} | {_f(style['self_correction'], 1)} | {_f(style['think_tag'], 1)} |",
        "",
    ]
    pca_info = result["pca"]
    ratios = ", ".join(f"{100 * r:.1f}%" for r in pca_info["explained_variance_ratio"])
    lines += [
        "## Rollout-level PCA (features standardised within the model)",
        "",
        f"Explained variance of PC1, PC2: {ratios}. Features: {', '.join(pca_info['features'])}.",
        "",
        "| Condition | PC1 centroid | PC2 centroid |",
        "|---|---|---|",
    ]
    for name, rep in conds.items():
        xy = rep["pca"]
        lines.append(f"| {name} | {_f(sum(p[0] for p in xy) / len(xy), 3)} | {_f(sum(p[1] for p in xy) / len(xy), 3)} |")
    return "\n".join(lines) + "\n"


def to_jsonable(value: Any) -> Any:
    """NaN / inf -> None (strict JSON), tuples -> lists, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def sampling_settings(config: SignalAnalysisConfig) -> dict[str, Any]:
    """The config fields that determine the rollouts (stored with them, checked on reuse)."""
    keys = ("num_prompts", "rollouts_per_prompt", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "student_mode")
    return {k: getattr(config, k) for k in keys}


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


OUTPUT_FILES = ("signals.json", "signals.md", "pca.png", "position_windows.png")


def write_outputs(result: Mapping[str, Any], out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """``signals.json``, ``signals.md``, ``pca.png`` and ``position_windows.png`` in ``out_dir``."""
    from recipe.analysis import plots

    out_dir = Path(out_dir)
    paths = {name: out_dir / name for name in OUTPUT_FILES}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"refusing to overwrite {existing}; pass overwrite=True (--overwrite) or another out dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths["signals.json"].write_text(json.dumps(to_jsonable(result), indent=1))
    paths["signals.md"].write_text(markdown_report(result))
    conds = result["conditions"]
    ratios = result["pca"]["explained_variance_ratio"]
    plots.plot_pca_scatter(
        {name: rep["pca"] for name, rep in conds.items()}, paths["pca.png"], explained=ratios,
        title=f"{result['model']}: rollout-level signals (student {result['config']['student_mode']})", overwrite=True,
    )
    plots.plot_position_windows(
        {name: to_jsonable(rep["position_windows"]) for name, rep in conds.items()}, paths["position_windows.png"], overwrite=True
    )
    return paths


def _f(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if 0 < abs(value) < 10 ** (-digits):  # would print as 0.000
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def _token_text(token: str) -> str:
    return token.replace("\n", "\\n").replace("\t", "\\t").replace("|", "\\|").replace("`", "'") or " "


def _setting(result: Mapping[str, Any]) -> tuple[str, str]:
    """The model--mode setting of a result: (model name, student mode)."""
    return str(result["model"]), str(result["config"]["student_mode"])


def joint_pca(results: Sequence[Mapping[str, Any]], *, n_components: int = 2) -> tuple[dict[str, list[list[float]]], list[float]]:
    """One PCA over the rollout features of several analysis results (models, student modes, datasets).

    The paper (``fig:teacher_context_pca_by_model``): "large markers are centroids for the seven
    dataset--context conditions ... Features are standardized within each model--mode setting
    before the joint PCA fit". So the results of one (model, student mode) setting (e.g. three runs on
    OpenThoughts, OpenMathReasoning and DAPO) are stacked and standardised together, then one PCA is
    fitted on all settings. A point's label is its condition, prefixed with the run's ``data_label``
    when the results span several datasets (``OMR/answer_only:think`` and ``DAPO/answer_only:think``
    stay apart); points with the same label from different settings are pooled (a per-condition
    cloud over models). Returns ``({label: [[pc1, pc2], ...]}, explained_variance_ratio)``.
    """
    by_data = len({r.get("data_label", "data") for r in results}) > 1
    settings: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for result in results:
        if list(result["rollout_features"]) != list(ROLLOUT_FEATURES):
            raise ValueError(f"{result.get('model')}: rollout features {result['rollout_features']} != {list(ROLLOUT_FEATURES)}")
        settings.setdefault(_setting(result), []).append(result)
    blocks, labels = [], []
    for group in settings.values():
        feats = []
        for result in group:
            prefix = f"{result.get('data_label', 'data')}/" if by_data else ""
            for name, rep in result["conditions"].items():
                feats.append(torch.tensor(rep["rollout_features"], dtype=torch.float64))
                labels += [prefix + name] * len(rep["rollout_features"])
        blocks.append(standardize(torch.cat(feats)))
    fit = pca(torch.cat(blocks), n_components=n_components)
    points: dict[str, list[list[float]]] = {}
    for label, xy in zip(labels, fit.coords_MC.tolist()):
        points.setdefault(label, []).append(xy)
    return points, fit.explained_variance_ratio_C.tolist()


def combined_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown table over several analyses (models, student modes, datasets), in the layout of the
    paper's ``tab:token_context_signal_app`` / ``tab:token_signal_summary``: Model, Data, S, T, Context,
    Fwd KL, D>.05, abs adv, Agree, Enc, Disc; one row per run and condition (a condition of two runs
    never collides). For each (student mode, dataset, condition) that every model analysed in that
    student mode has (two or more models), a macro-average row gives each model equal weight (a model
    with several runs of it counts once, with the mean of its runs)."""
    cols = (("fwd_kl", 3), ("d_gt_005", 1), ("abs_adv", 3), ("agree", 1), ("enc", 1), ("disc", 1))
    lines = [
        "| Model | Data | S | T | Context | Fwd KL | D>.05 (%) | abs adv | Agree (%) | Enc (%) | Disc (%) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], dict[str, list[Mapping[str, float]]]] = {}
    models_by_mode: dict[str, set[str]] = {}
    for result in results:
        model, student = _setting(result)
        data = str(result.get("data_label", "data"))
        models_by_mode.setdefault(student, set()).add(model)
        for name, rep in result["conditions"].items():
            cond = Condition.parse(name)
            s = rep["summary"]
            groups.setdefault((student, data, name), {}).setdefault(model, []).append(s)
            context = cond.context if cond.prompt_cap is None else f"{cond.context}@{cond.prompt_cap}"
            cells = " | ".join(_f(s[key], digits) for key, digits in cols)
            lines.append(f"| {model} | {data} | {student} | {cond.mode} | {context} | {cells} |")
    for (student, data, name), by_model in groups.items():
        if len(models_by_mode[student]) < 2 or set(by_model) != models_by_mode[student]:
            continue
        cond = Condition.parse(name)
        context = cond.context if cond.prompt_cap is None else f"{cond.context}@{cond.prompt_cap}"
        per_model = [{key: sum(_nan_none(s[key]) for s in runs) / len(runs) for key, _ in cols} for runs in by_model.values()]
        cells = " | ".join(_f(sum(m[key] for m in per_model) / len(per_model), digits) for key, digits in cols)
        lines.append(f"| Macro average | {data} | {student} | {cond.mode} | {context} | {cells} |")
    return "\n".join(lines) + "\n"


def _nan_none(value: Any) -> float:
    return math.nan if value is None else float(value)
