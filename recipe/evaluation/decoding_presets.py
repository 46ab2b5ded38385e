"""Model-specific decoding presets: the paper's inference table (``tab:evaluation_config``, appendix
"Evaluation Protocol and Inference Settings") as ``PRESETS``, one ``DecodingPreset`` per model and mode,
plus ``tiny_cpu`` and ``smollm2_cpu`` for CPU runs. ``get_preset`` serves ``scripts/evaluate.py --preset``,
the sweep and the CPU demos; which preset evaluates which model: docs/evaluation.md#protocol.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from recipe.common.chat import MODES

ENGINES = ("vllm", "sglang", "hf")


@dataclass(frozen=True)
class DecodingPreset:
    """Sampling settings of one evaluation run.

    Attributes:
        name: preset name.
        engine: inference engine the paper used (``vllm`` | ``sglang`` | ``hf``); the
            ``--backend`` flag of the evaluation can override it.
        mode: reasoning mode of the chat template (``think`` | ``no_think`` | ``native``).
        temperature: sampling temperature (> 0).
        top_p: nucleus mass in (0, 1].
        top_k: top-k cutoff; None = off.
        presence_penalty: additive presence penalty (vLLM/SGLang semantics), >= 0.
        max_new_tokens: cap on generated tokens.
        context: context window; the effective cap is
            ``min(max_new_tokens, context - prompt_tokens - 1)``.
        system_message: a system message prepended to the evaluation prompt (MiMo: ""),
            None = no system message.
    """

    name: str
    engine: str
    mode: str
    temperature: float
    top_p: float
    top_k: int | None
    presence_penalty: float
    max_new_tokens: int
    context: int
    system_message: str | None = None

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.mode is None:  # the spelling of configs written before "native"
            object.__setattr__(self, "mode", "native")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (sampled evaluation), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be None (off) or >= 1, got {self.top_k}")
        if self.presence_penalty < 0:
            raise ValueError(f"presence_penalty must be >= 0, got {self.presence_penalty}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.context <= 1:
            raise ValueError(f"context must be > 1, got {self.context}")

    def effective_max_new_tokens(self, prompt_tokens: int) -> int:
        """Token cap for a prompt of ``prompt_tokens`` tokens (context minus prompt and one guard)."""
        room = self.context - prompt_tokens - 1
        if room < 1:
            raise ValueError(
                f"prompt of {prompt_tokens} tokens leaves no room in context={self.context} (preset {self.name})"
            )
        return min(self.max_new_tokens, room)

    def with_overrides(self, **overrides) -> DecodingPreset:
        """A copy with exactly the given fields replaced (``top_k=None`` turns top-k off); validated again."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown decoding preset field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **overrides)


def _preset(name, engine, mode, max_new, context, temperature, top_p, top_k, presence, system=None):
    return DecodingPreset(
        name=name,
        engine=engine,
        mode=mode,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        presence_penalty=presence,
        max_new_tokens=max_new,
        context=context,
        system_message=system,
    )


# The paper's table, one row per model and eval mode (the model in the comment). Every preset caps a
# generation at min(max_new_tokens, context - prompt_tokens - 1): the paper's rule for MiMo-7B-RL ("32,768 is
# the nominal cap. The effective cap is the context window minus the rendered prompt length and one guard
# token"), applied to all; for every other preset the context leaves room for any evaluation prompt.
PRESETS: dict[str, DecodingPreset] = {
    p.name: p
    for p in (
        #       name, engine, mode, max new tokens, context, T, top-p, top-k, presence penalty
        _preset("qwen3_think", "vllm", "think", 38_912, 40_960, 0.6, 0.95, 20, 0.0),  # Qwen3-0.6/1.7/4/8B, think
        _preset("qwen3_no_think", "vllm", "no_think", 32_768, 40_960, 0.7, 0.80, 20, 0.0),  # Qwen3-1.7/4/8B
        _preset("qwen3_4b_instruct", "vllm", "native", 32_768, 40_960, 0.7, 0.80, 20, 0.0),  # Qwen3-4B-Instruct
        _preset("qwen3_4b_thinking", "vllm", "native", 81_920, 90_112, 0.6, 0.95, 20, 0.0),  # Qwen3-4B-Thinking
        _preset("qwen35_4b", "sglang", "think", 81_920, 131_072, 1.0, 0.95, 20, 1.5),  # Qwen3.5-4B, either mode
        _preset("deepseek_r1_distill", "vllm", "native", 32_768, 40_960, 0.6, 0.95, None, 0.0),  # R1-Distill-Qwen-1.5B
        _preset("olmo3_think", "sglang", "native", 32_768, 40_960, 0.6, 0.95, None, 0.0),  # OLMo-3-7B-Think
        _preset("olmo3_instruct", "sglang", "native", 32_768, 40_960, 0.6, 0.95, None, 0.0),  # OLMo-3-7B-Instruct
        _preset("falcon_h1r", "sglang", "native", 65_536, 73_728, 0.6, 0.95, None, 0.0),  # Falcon-H1R-7B
        _preset("mimo_7b_rl", "sglang", "native", 32_768, 32_768, 0.6, 0.95, None, 0.0, system=""),  # MiMo-7B-RL
        # CPU tests with the tiny local model
        _preset("tiny_cpu", "hf", "think", 48, 4_096, 1.0, 1.0, None, 0.0),
        # SmolLM2-135M-Instruct (recipe.models.smollm2; not a paper model): the paper's setting for every model
        # without a vendor-specific one (T 0.6, top-p 0.95, top-k off), its native ChatML template, its
        # 8,192-token context, and the training / analysis rollout cap (longer does not fit a CPU budget)
        _preset("smollm2_cpu", "hf", "native", 1_024, 8_192, 0.6, 0.95, None, 0.0),
    )
}


def get_preset(name: str) -> DecodingPreset:
    """The named preset; ValueError listing the known names otherwise."""
    if name not in PRESETS:
        raise ValueError(f"unknown decoding preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name]
