"""What one signal analysis measures: its teacher conditions and settings (``SignalAnalysisConfig``).

A condition ``context:mode[@cap]`` names the privileged context of the teacher prompt
(``recipe.common.prompts.TEACHER_CONTEXTS``), its reasoning mode (think | no_think | native: the
template's own default, the only mode of a template without an ``enable_thinking`` switch) and an
optional prompt cap: ``full_solution:think@1024`` cuts the reference solution so the teacher prompt
fits 1,024 tokens (the paper's Sol vs Sol-long control, ``TRUNCATED_FIELD``). The protocol:
``recipe.analysis.signal_analysis``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipe.common import chat, prompts
from recipe.opsd.core import signals

# Reasoning modes of student and teacher prompts; ``native`` renders the chat template's own default
# (no enable_thinking passed), the only mode of a template without the switch (SmolLM2, DeepSeek-R1-Distill).
MODES = chat.MODES
# The privileged text a prompt cap ``context:mode@N`` truncates (token prefix) so the rendered teacher
# prompt has at most N tokens (paper, appendix "Long Full-Solution Teacher Prefixes": the short
# condition truncates C in Q + C). cot_solution: the CoT is cut, the final solution kept whole.
TRUNCATED_FIELD = {"full_solution": "solution", "cot_solution": "cot", "unrelated": "unrelated_solution"}
BACKENDS = ("hf", "vllm")
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


def sampling_settings(config: SignalAnalysisConfig) -> dict[str, Any]:
    """The config fields that determine the rollouts (stored with them, checked on reuse)."""
    keys = ("num_prompts", "rollouts_per_prompt", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "student_mode")
    return {k: getattr(config, k) for k in keys}
