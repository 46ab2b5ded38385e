"""The ``opsd:`` block of ``recipe/opsd/config/opsd_trainer.yaml`` as validated dataclasses.

Built from the hydra config before Ray starts (``OPSDConfig.from_hydra(config.opsd)``, by the start-up
checks of every launch and ``--dry-run``), so a bad option fails in seconds with a message naming the
field and the allowed values. Each field is described once, by its yaml comment; the docstrings below
say what the validation enforces. Defaults are the paper's ("Default OPSD Configuration").

Pure: stdlib + the pure core modules; no verl or ray import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from recipe.common.chat import MODES, NATIVE
from recipe.opsd.core.monitor import MonitorConfig
from recipe.opsd.core.teacher_kinds import DEFAULT_TEACHER_KIND, TEACHER_KINDS, TeacherKind, teacher_kind


def enable_thinking(mode: str) -> bool | None:
    """The ``enable_thinking`` switch a mode renders with (``recipe.common.chat.MODES``); None = do not pass
    it (``native``: the template's own mode, single-mode models)."""
    if mode not in MODES:
        raise ValueError(f"a reasoning mode must be one of {list(MODES)}, got {mode!r}")
    return None if mode == NATIVE else mode == "think"


def _allowed_contexts() -> tuple[str, ...]:
    from recipe.common.prompts import TEACHER_CONTEXTS

    return tuple(TEACHER_CONTEXTS)


def _integer(name: str, value, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


@dataclass
class LossConfig:
    """``opsd.loss``: which objective the actor optimises and every setting of it (one axis:
    ``objective``, a name of ``recipe.opsd.core.objectives``; its own parameters in ``params``,
    validated by the objective's ``Params``). The shared settings an objective does not accept
    (``topk``, ``task_weight``, ``sft_weight``) are refused with its name."""

    objective: str = "divergence"
    params: dict = field(default_factory=dict)
    beta: float = 0.0
    clip_tau: float | None = 0.05
    student_temperature: float = 1.1
    teacher_temperature: float | None = None
    topk: int | None = None
    positions: str = "all"
    chunk_size: int = 1024
    loss_agg_mode: str = "seq-mean-token-mean"
    task_weight: float = 0.0
    sft_weight: float = 0.0
    sft_max_length: int | None = None
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2

    def __post_init__(self):
        from recipe.opsd.core.losses import LOSS_AGG_MODES, validate_loss_options
        from recipe.opsd.core.objectives import get_objective
        from recipe.opsd.core.objectives.terms import number
        from recipe.opsd.core.positions import parse_position_spec

        validate_loss_options(beta=self.beta, clip_tau=self.clip_tau, student_temperature=self.student_temperature,
                              teacher_temperature=self.teacher_temperature, topk=self.topk, chunk_size=self.chunk_size,
                              vocab_size=None, unchunked=False, prefix="opsd.loss.")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"opsd.loss.loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}")
        try:
            parse_position_spec(str(self.positions))
        except ValueError as err:
            raise ValueError(f"opsd.loss.positions: {err}") from None
        for name in ("task_weight", "sft_weight"):
            number(f"opsd.loss.{name}", getattr(self, name), low=0.0)
        cap = self.sft_max_length
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"opsd.loss.sft_max_length must be an integer >= 1 or null "
                             f"(= data.max_response_length), got {cap!r}")
        low, high = self.clip_ratio_low, self.clip_ratio_high
        if (low is None) != (high is None):
            raise ValueError("opsd.loss.clip_ratio_low and clip_ratio_high must both be numbers or both be null "
                             f"(unclipped); got {low!r} and {high!r}")
        if low is not None:
            number("opsd.loss.clip_ratio_low", low, low=0.0, allow_zero=False)
            number("opsd.loss.clip_ratio_high", high, low=0.0, allow_zero=False)
            if low >= 1:
                raise ValueError(f"opsd.loss.clip_ratio_low must be < 1 (the ratio is clipped to [1 - low, 1 + high]); "
                                 f"got {low!r}")
        if self.params is not None and not isinstance(self.params, Mapping):
            raise ValueError(f"opsd.loss.params must be a mapping, got {self.params!r}")
        self.params = dict(self.params or {})
        cls = get_objective(self.objective)
        try:
            cls.parse_params(self.params)
        except (TypeError, ValueError) as err:
            raise ValueError(f"opsd.loss.params (objective {self.objective!r}): {err}") from None
        if self.topk is not None and not cls.supports_topk:
            raise ValueError(f"opsd.loss.topk must be null with opsd.loss.objective={self.objective!r} (its target is "
                             f"not a top-k divergence), got {self.topk!r}")
        for name, supported in (("task_weight", cls.supports_task_reward), ("sft_weight", cls.supports_sft)):
            if getattr(self, name) > 0 and not supported:
                raise ValueError(f"opsd.loss.{name}={getattr(self, name)} is not supported by "
                                 f"opsd.loss.objective={self.objective!r} (it has its own target); set it to 0")

    @property
    def effective_teacher_temperature(self) -> float:
        return float(self.student_temperature if self.teacher_temperature is None else self.teacher_temperature)

    @property
    def position_kind(self) -> str:
        """``all | first | uniform | final | he | le | advt``."""
        from recipe.opsd.core.positions import parse_position_spec

        return parse_position_spec(str(self.positions)).kind

    def build_objective(self):
        """The objective instance (``recipe.opsd.core.objectives``) these settings select."""
        from recipe.opsd.core.objectives import get_objective

        return get_objective(self.objective)(self)


@dataclass
class TeacherConfig:
    """``opsd.teacher``: which weights score the rollouts under the privileged prompt (``kind``, a name of
    ``recipe.opsd.core.teacher_kinds``; ``kind_flags``: what it is). ``path`` only with a kind that
    ``loads_path``, ``ema_decay`` (in [0, 1]) only with one that ``follows_student``."""

    kind: str = DEFAULT_TEACHER_KIND
    path: str | None = None
    ema_decay: float | None = None
    allow_zero_loss: bool = False

    def __post_init__(self):
        flags = teacher_kind(self.kind)
        if flags.loads_path:
            if not isinstance(self.path, str) or not self.path.strip():
                raise ValueError(
                    f"opsd.teacher.path must be a model directory or Hub id with opsd.teacher.kind={self.kind}, "
                    f"got {self.path!r}"
                )
        elif self.path is not None:
            raise ValueError(f"opsd.teacher.path must be null unless opsd.teacher.kind={_kinds_where('loads_path')} "
                             f"(kind {self.kind!r}), got {self.path!r}")
        if flags.follows_student:
            decay = self.ema_decay
            if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= float(decay) <= 1.0:
                raise ValueError(f"opsd.teacher.ema_decay must be a number in [0, 1] with "
                                 f"opsd.teacher.kind={self.kind} (1 = frozen), got {decay!r}")
            self.ema_decay = float(decay)
        elif self.ema_decay is not None:
            raise ValueError(f"opsd.teacher.ema_decay must be null unless opsd.teacher.kind="
                             f"{_kinds_where('follows_student')} (kind {self.kind!r}), got {self.ema_decay!r}")
        _boolean("opsd.teacher.allow_zero_loss", self.allow_zero_loss)

    @property
    def kind_flags(self) -> TeacherKind:
        """The registered ``TeacherKind`` of ``kind``: the flags the glue reads."""
        return teacher_kind(self.kind)


def _kinds_where(flag: str) -> str:
    """The teacher kinds with ``flag`` set, as ``a|b`` (for messages)."""
    return "|".join(name for name, kind in TEACHER_KINDS.items() if getattr(kind, flag))


@dataclass
class DiagnosticsConfig:
    """``opsd.diagnostics``: what watches a run (none of it changes the update): the pre-flight gate
    (``recipe.opsd.core.preflight``), the non-finite guard (``recipe.opsd.core.nonfinite``), step dumps
    (``recipe.opsd.core.step_dump``) and the collapse monitor (``recipe.opsd.core.monitor.MonitorConfig``)."""

    preflight: bool = True
    preflight_positions: int = 16
    max_consecutive_nonfinite: int = 3
    dump_steps: bool = False
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def __post_init__(self):
        if self.monitor is None or isinstance(self.monitor, Mapping):
            self.monitor = _build(MonitorConfig, self.monitor or {}, prefix="opsd.diagnostics.monitor")
        _boolean("opsd.diagnostics.preflight", self.preflight)
        _integer("opsd.diagnostics.preflight_positions", self.preflight_positions, low=1)
        _integer("opsd.diagnostics.max_consecutive_nonfinite", self.max_consecutive_nonfinite, low=1)
        _boolean("opsd.diagnostics.dump_steps", self.dump_steps)


@dataclass
class OPSDConfig:
    """The ``opsd:`` block: the teacher's context and both sides' reasoning modes, the loss, the
    teacher, the diagnostics. ``teacher_max_prompt_length``: a longer rendered teacher prompt is an
    error, never truncated."""

    teacher_context: str = "full_solution"
    student_mode: str = "think"
    teacher_mode: str = "think"
    teacher_max_prompt_length: int = 1024
    loss: LossConfig = field(default_factory=LossConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def __post_init__(self):
        for name, cls in (("loss", LossConfig), ("teacher", TeacherConfig), ("diagnostics", DiagnosticsConfig)):
            value = getattr(self, name)
            if value is None or isinstance(value, Mapping):
                setattr(self, name, _build(cls, value or {}, prefix=f"opsd.{name}"))
        allowed = _allowed_contexts()
        if self.teacher_context not in allowed:
            raise ValueError(f"opsd.teacher_context must be one of {list(allowed)}, got {self.teacher_context!r}")
        for name in ("student_mode", "teacher_mode"):
            if getattr(self, name) not in MODES:
                raise ValueError(f"opsd.{name} must be one of {list(MODES)}, got {getattr(self, name)!r}")
        tmax = self.teacher_max_prompt_length
        if isinstance(tmax, bool) or int(tmax) != tmax or tmax < 1:
            raise ValueError(f"opsd.teacher_max_prompt_length must be an integer >= 1, got {tmax!r}")
        from recipe.opsd.core.objectives import get_objective

        get_objective(self.loss.objective).check(self.loss, teacher_context=self.teacher_context)

    @property
    def student_enable_thinking(self) -> bool | None:
        """``enable_thinking`` of the student's template; None = do not pass the switch (native mode)."""
        return enable_thinking(self.student_mode)

    @classmethod
    def from_hydra(cls, opsd_cfg: Any) -> "OPSDConfig":
        """Build from the ``opsd`` node of the hydra config (DictConfig or plain dict)."""
        if opsd_cfg is None:
            raise ValueError("the config has no `opsd:` block; compose it from recipe/opsd/config/opsd_trainer.yaml")
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(opsd_cfg, DictConfig):
                opsd_cfg = OmegaConf.to_container(opsd_cfg, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf ships with hydra
            pass
        return _build(cls, dict(opsd_cfg), prefix="opsd")


# settings that moved: the old name -> the new one (a config that still uses an old name is told where it went)
RENAMED = {
    "opsd.loss.variant": "opsd.loss.objective",
    "opsd.loss.variant_params": "opsd.loss.params",
    "opsd.objective": "opsd.loss (objective, task_weight, sft_weight, sft_max_length, clip_ratio_low/high; "
                      "discount: opsd.loss.params.discount of objective sampled_token)",
    "opsd.monitor": "opsd.diagnostics.monitor",
    "opsd.preflight": "opsd.diagnostics.preflight",
    "opsd.preflight_positions": "opsd.diagnostics.preflight_positions",
    "opsd.max_consecutive_nonfinite": "opsd.diagnostics.max_consecutive_nonfinite",
    "opsd.dump_steps": "opsd.diagnostics.dump_steps",
}


def _build(cls, values: Mapping, *, prefix: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        moved = [f"{prefix}.{k} is now {RENAMED[f'{prefix}.{k}']}" for k in unknown if f"{prefix}.{k}" in RENAMED]
        hint = f" ({'; '.join(moved)})" if moved else ""
        raise ValueError(f"unknown field(s) {[f'{prefix}.{k}' for k in unknown]}{hint}; allowed: {sorted(names)}")
    return cls(**dict(values))
