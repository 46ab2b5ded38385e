"""Batched sampling with Hugging Face ``generate`` (pure torch + transformers, no verl).

``sample_batch`` samples a whole batch of prompts of different lengths (left-padded) in one call and
returns, per sequence, the response ids, the log-probability of each sampled token (vLLM's
``processed_logprobs``) and a finish reason. Used by the CPU rollout server (``recipe.cpu.rollout``),
the evaluation and the analysis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# Sampling filters a model's generation config may set that sample_batch does not apply
# (vLLM SamplingParams semantics: only temperature, top-k and top-p).
_UNSUPPORTED_WARPERS = ("min_p", "top_h")


@dataclass
class SampleParams:
    """Sampling options of one ``sample_batch`` call (vLLM conventions).

    Attributes:
        max_new_tokens: maximum number of response tokens per sequence (>= 1).
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus mass in (0, 1]; 1.0 disables it.
        top_k: keep the k most likely tokens; -1 or 0 disables it.
        ignore_eos: every sequence runs to ``max_new_tokens`` (vLLM's ``ignore_eos``: benchmarks of a fixed length).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False

    def __post_init__(self):
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k}")


@dataclass
class BatchSample:
    """Result of ``sample_batch``: one entry per prompt, in input order."""

    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]


def left_pad(prompt_ids: Sequence[Sequence[int]], *, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``input_ids_BP`` and ``attention_mask_BP`` (long tensors)."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty")
    for row, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt_ids[{row}] is empty; every prompt needs at least one token")
    width = max(len(ids) for ids in prompt_ids)
    input_ids_BP = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention_mask_BP = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids_BP[row, width - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask_BP[row, width - len(ids) :] = 1
    return input_ids_BP, attention_mask_BP


class _SampledLogprobRecorder(LogitsProcessor):
    """Last logits processor: records log p(sampled token) of each step, O(B x V) memory.

    ``generate`` calls processors with the ids generated so far, before sampling. So call
    t sees the token sampled at step t-1 as ``input_ids[:, -1]``: it gathers that token's
    log-probability from the previous step's processed scores and keeps only the current
    step's scores. ``finish`` resolves the last step from the final sequences. Holding one
    step instead of ``output_scores`` (all steps, ``[B, R, V]``) is what keeps long
    rollouts with a 150k vocabulary in memory.
    """

    def __init__(self):
        self._pending_BV: torch.Tensor | None = None
        self._logprobs: list[torch.Tensor] = []

    def _resolve(self, sampled_ids_B: torch.Tensor) -> None:
        if self._pending_BV is not None:
            logprobs_BV = torch.log_softmax(self._pending_BV.float(), dim=-1)
            picked_B = logprobs_BV.gather(-1, sampled_ids_B.to(logprobs_BV.device).unsqueeze(-1)).squeeze(-1)
            self._logprobs.append(picked_B.cpu())
            self._pending_BV = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._resolve(input_ids[:, -1])
        self._pending_BV = scores
        return scores

    def finish(self, sequences_BS: torch.Tensor) -> torch.Tensor:
        """``logprobs_BR`` of the R generated columns (the last R columns of ``sequences_BS``)."""
        self._resolve(sequences_BS[:, -1])
        if not self._logprobs:
            return torch.zeros((sequences_BS.shape[0], 0), dtype=torch.float32)
        return torch.stack(self._logprobs, dim=1)


def _refuse_model_level_warpers(model: PreTrainedModel) -> None:
    config = getattr(model, "generation_config", None)
    for name in _UNSUPPORTED_WARPERS:
        value = getattr(config, name, None) if config is not None else None
        if value is not None:
            raise ValueError(
                f"the model's generation_config sets {name}={value!r}; sample_batch applies only temperature, "
                f"top_k and top_p (vLLM semantics). Unset generation_config.{name} to sample with this model."
            )


@torch.no_grad()
def sample_batch(
    model: PreTrainedModel,
    prompt_ids: Sequence[Sequence[int]],
    *,
    params: SampleParams,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    seed: int | None = None,
) -> BatchSample:
    """Sample one response per prompt with ``model.generate`` on a left-padded batch.

    Args:
        model: a causal LM (any device; inputs follow ``model.device``).
        prompt_ids: token ids of each prompt (no padding), lengths may differ.
        params: temperature / top-p / top-k / max_new_tokens.
        eos_token_ids: ids that end a sequence (kept as the last response token).
        pad_token_id: id used for left padding of the prompts.
        seed: if given, sampling draws from a CPU RNG seeded with it (the global RNG state
            is restored afterwards), so the same inputs and seed give the same outputs.

    Returns:
        Response ids that stop at, and include, the first end-of-sequence token (as vLLM's
        ``token_ids``; ``finish_reason`` ``"stop"``, else ``"length"``). Log-probs follow vLLM's
        default ``logprobs_mode=processed_logprobs`` (the mode of verl 0.9.1's rollout config,
        ``verl/trainer/config/rollout/rollout.yaml:93``): the sampled token under the distribution it
        was sampled from, after temperature and top-k / top-p filtering (renormalised). With
        ``top_k=-1, top_p=1.0`` this is ``log_softmax(logits / temperature)``, what verl's actor
        recomputes as ``old_log_prob``; greedy decoding (``temperature=0``) reports ``log_softmax(logits)``.
    """
    if len(eos_token_ids) == 0:
        raise ValueError("eos_token_ids is empty; pass the tokenizer's end-of-sequence id(s)")
    input_ids_BP, attention_mask_BP = left_pad(prompt_ids, pad_token_id=pad_token_id)
    device = model.device
    greedy = params.temperature == 0
    _refuse_model_level_warpers(model)
    # The warpers are passed explicitly (temperature, then top-k, then top-p: transformers'
    # own order) so that the recorder runs after them and sees the distribution each token
    # is sampled from. transformers appends user processors after its default ones but
    # BEFORE the warpers it builds from the generation config, so the config leaves those
    # off: temperature 1.0, top_k 0, top_p 1.0. Every field is explicit; a None would be
    # filled from the model's generation config or transformers' defaults (top_k=50).
    recorder = _SampledLogprobRecorder()
    processors = LogitsProcessorList()
    if not greedy:
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(float(params.temperature)))
        if params.top_k > 0:
            processors.append(TopKLogitsWarper(top_k=int(params.top_k), min_tokens_to_keep=1))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=float(params.top_p), min_tokens_to_keep=1))
    processors.append(recorder)
    generation_config = GenerationConfig(
        do_sample=not greedy,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        max_new_tokens=int(params.max_new_tokens),
        # ignore_eos: an id past the vocabulary, which no step samples (None would let transformers fill in the
        # model's own end of sequence from its generation config)
        eos_token_id=[model.get_output_embeddings().weight.shape[0]] if params.ignore_eos else list(eos_token_ids),
        pad_token_id=pad_token_id,
        bos_token_id=None,
        return_dict_in_generate=True,
    )
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(
            input_ids=input_ids_BP.to(device),
            attention_mask=attention_mask_BP.to(device),
            generation_config=generation_config,
            logits_processor=processors,
        )
    prompt_width = input_ids_BP.shape[1]
    sequences_BS = out.sequences.cpu()
    new_ids_BR = sequences_BS[:, prompt_width:]
    logprobs_BR = recorder.finish(sequences_BS)
    if logprobs_BR.shape != new_ids_BR.shape:
        raise RuntimeError(
            f"sample_batch: recorded log-probs {tuple(logprobs_BR.shape)} do not match the sampled tokens "
            f"{tuple(new_ids_BR.shape)}; transformers' generate loop changed (re-check _SampledLogprobRecorder)"
        )

    eos_set = set() if params.ignore_eos else set(int(i) for i in eos_token_ids)
    response_ids, logprobs, finish_reasons = [], [], []
    for row in range(new_ids_BR.shape[0]):
        ids = new_ids_BR[row].tolist()
        end = next((t + 1 for t, tok in enumerate(ids) if tok in eos_set), None)
        finish_reasons.append("stop" if end is not None else "length")
        end = len(ids) if end is None else end
        response_ids.append(ids[:end])
        logprobs.append(logprobs_BR[row, :end].tolist())
    return BatchSample(response_ids=response_ids, logprobs=logprobs, finish_reasons=finish_reasons)
