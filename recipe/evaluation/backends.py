"""Sampling backends of the evaluation: vLLM / SGLang on GPU, batched HF ``generate`` on CPU.

Every backend takes token-id prompts (rendered once with ``recipe.common.chat.render_ids``,
so all backends see the same tokens) and returns, per prompt, ``count`` ``Generation``s.
Token counts include the end-of-sequence token when there is one (vLLM ``token_ids``
convention); ``finish_reason`` is ``"stop"`` (EOS / stop token) or ``"length"`` (cap hit).
Text is decoded with ``skip_special_tokens=True``, as verl's reward manager decodes.

The GPU engines are imported lazily and kept thin; the paper's runs used vLLM 0.8.5 and
SGLang 0.5.4 / 0.5.10 with tensor parallelism 1 and seed 42.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from recipe.evaluation.decoding_presets import DecodingPreset

BACKENDS = ("vllm", "sglang", "hf")


@dataclass(frozen=True)
class Generation:
    """One sampled completion."""

    text: str
    num_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class PromptRequest:
    """A prompt and how many samples to draw for it; ``key`` seeds the HF backend."""

    key: str
    prompt_ids: list[int]
    count: int


def request_seed(seed: int, key: str) -> int:
    """Per-prompt seed of the HF backend: stable across runs and resumptions."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**31 - 1)


def vllm_sampling_kwargs(preset: DecodingPreset, *, prompt_tokens: int, count: int) -> dict:
    """``vllm.SamplingParams`` keyword arguments for one prompt (top_k -1 = off)."""
    return {
        "n": count,
        "temperature": preset.temperature,
        "top_p": preset.top_p,
        "top_k": -1 if preset.top_k is None else preset.top_k,
        "presence_penalty": preset.presence_penalty,
        "max_tokens": preset.effective_max_new_tokens(prompt_tokens),
    }


def sglang_sampling_params(preset: DecodingPreset, *, prompt_tokens: int) -> dict:
    """SGLang ``sampling_params`` dict for one sample of one prompt (top_k -1 = off)."""
    return {
        "temperature": preset.temperature,
        "top_p": preset.top_p,
        "top_k": -1 if preset.top_k is None else preset.top_k,
        "presence_penalty": preset.presence_penalty,
        "max_new_tokens": preset.effective_max_new_tokens(prompt_tokens),
    }


class HFBackend:
    """CPU sampling with ``recipe.cpu.hf_generate.sample_batch`` (one batch per prompt)."""

    def __init__(self, model_path: str, *, preset: DecodingPreset, seed: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if preset.presence_penalty != 0:
            raise ValueError(
                f"presence_penalty={preset.presence_penalty}: the HF backend has no presence penalty; "
                "use --backend vllm/sglang or --presence-penalty 0"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.preset = preset
        self.seed = seed
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        if not eos:
            raise ValueError(f"{model_path}: neither the generation config nor the tokenizer defines an EOS token")
        self.eos_token_ids = eos
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else eos[0]

    def generate(self, requests: list[PromptRequest]) -> list[list[Generation]]:
        from recipe.cpu.hf_generate import SampleParams, sample_batch

        results = []
        for request in requests:
            params = SampleParams(
                max_new_tokens=self.preset.effective_max_new_tokens(len(request.prompt_ids)),
                temperature=self.preset.temperature,
                top_p=self.preset.top_p,
                top_k=-1 if self.preset.top_k is None else self.preset.top_k,
            )
            batch = sample_batch(
                self.model,
                [request.prompt_ids] * request.count,
                params=params,
                eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                seed=request_seed(self.seed, request.key),
            )
            results.append(
                [
                    Generation(
                        text=self.tokenizer.decode(ids, skip_special_tokens=True),
                        num_tokens=len(ids),
                        finish_reason=reason,
                    )
                    for ids, reason in zip(batch.response_ids, batch.finish_reasons, strict=True)
                ]
            )
        return results


class VLLMBackend:
    """``vllm.LLM`` offline engine, one ``SamplingParams(n=count)`` per prompt."""

    def __init__(self, model_path: str, *, preset: DecodingPreset, seed: int):
        from vllm import LLM

        self.llm = LLM(model=model_path, seed=seed, max_model_len=preset.context, tensor_parallel_size=1)
        self.tokenizer = self.llm.get_tokenizer()
        self.preset = preset

    def generate(self, requests: list[PromptRequest]) -> list[list[Generation]]:
        from vllm import SamplingParams

        params = [
            SamplingParams(**vllm_sampling_kwargs(self.preset, prompt_tokens=len(r.prompt_ids), count=r.count))
            for r in requests
        ]
        outputs = self.llm.generate([{"prompt_token_ids": r.prompt_ids} for r in requests], params)
        return [
            [
                Generation(text=o.text, num_tokens=len(o.token_ids), finish_reason=o.finish_reason or "length")
                for o in output.outputs
            ]
            for output in outputs
        ]


class SGLangBackend:
    """``sglang.Engine`` offline engine; each prompt repeated ``count`` times."""

    def __init__(self, model_path: str, *, preset: DecodingPreset, seed: int):
        import sglang
        from transformers import AutoTokenizer

        self.engine = sglang.Engine(model_path=model_path, random_seed=seed, context_length=preset.context, tp_size=1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.preset = preset

    def generate(self, requests: list[PromptRequest]) -> list[list[Generation]]:
        input_ids, sampling = [], []
        for r in requests:
            input_ids += [r.prompt_ids] * r.count
            sampling += [sglang_sampling_params(self.preset, prompt_tokens=len(r.prompt_ids))] * r.count
        outputs = self.engine.generate(input_ids=input_ids, sampling_params=sampling)
        flat = [
            Generation(
                text=o["text"],
                num_tokens=int(o["meta_info"]["completion_tokens"]),
                finish_reason="length" if o["meta_info"]["finish_reason"]["type"] == "length" else "stop",
            )
            for o in outputs
        ]
        results, start = [], 0
        for r in requests:
            results.append(flat[start : start + r.count])
            start += r.count
        return results


def make_backend(name: str, model_path: str, *, preset: DecodingPreset, seed: int):
    """Instantiate the named backend (``vllm`` | ``sglang`` | ``hf``)."""
    classes = {"vllm": VLLMBackend, "sglang": SGLangBackend, "hf": HFBackend}
    if name not in classes:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    return classes[name](model_path, preset=preset, seed=seed)
