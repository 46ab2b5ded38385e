"""OPSD options (the ``opsd:`` block of ``config/opsd_trainer.yaml``) as validated dataclasses.

Built from the hydra config at trainer start (``OPSDConfig.from_hydra(config.opsd)``), before Ray
starts any worker, so a bad option fails in seconds with a message naming the field. Defaults are
the paper's ("Default OPSD Configuration": beta 0, tau_clip 0.05, temperature 1.1, full-solution
teacher context, think/think modes, 1,024-token prompt caps).

Pure: stdlib + the pure prompt / position / monitor modules; no verl or ray import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from recipe.opsd.monitor import MonitorConfig

# None = the model's native (only) mode: the prompt is rendered without the enable_thinking switch
MODES = ("think", "no_think", None)
VARIANTS = ("opsd", "purified", "beta_opsd")


def _allowed_contexts() -> tuple[str, ...]:
    from recipe.common.prompts import TEACHER_CONTEXTS

    return tuple(TEACHER_CONTEXTS)


@dataclass
class OPSDLossConfig:
    """Options of the distillation loss (``opsd.loss``).

    beta: 0 = forward KL(pT || pS), 1 = reverse KL, in (0, 1) generalized JSD.
    clip_tau: cap on every vocabulary entry's contribution before the vocabulary sum; None = off.
    student_temperature / teacher_temperature: logits are divided by these before log-softmax;
        teacher_temperature None = student_temperature.
    topk: vocabulary support restricted to the teacher's top-k (renormalised); None = full vocabulary.
    positions: loss positions, ``all | first:N | uniform:N | final:N | he:Q | le:Q | advt:K``.
    chunk_size: tokens per chunk of the fused lm_head + divergence (memory O(chunk_size x V)).
    variant: ``opsd`` (the paper's target) or a follow-up variant (``purified``, ``beta_opsd``).
        ``beta_opsd`` has its own target: ``beta`` and ``clip_tau`` do not enter its loss (they still
        set the clip diagnostics). Neither variant supports ``topk``.
    variant_params: the variant's parameters (``recipe.opsd.variants.variant_params``): empty for
        ``opsd``; ``pmi_strength`` / ``pmi_clip`` for ``purified``; ``teacher_weight_start`` /
        ``teacher_weight_end`` / ``discount`` for ``beta_opsd`` (missing keys take the paper's values).
    loss_agg_mode: how positions and rollouts are averaged into the mini-batch loss, with verl's
        ``agg_loss`` names (``recipe.opsd.losses.LOSS_AGG_MODES``); ``seq-mean-token-mean`` (default)
        is the paper's eq. "opd_obj" / "opsd_clipped": 1/N over each rollout's loss positions, then
        the mean over rollouts; ``token-mean`` weighs every position of the mini-batch equally.
    """

    beta: float = 0.0
    clip_tau: float | None = 0.05
    student_temperature: float = 1.1
    teacher_temperature: float | None = None
    topk: int | None = None
    positions: str = "all"
    chunk_size: int = 1024
    variant: str = "opsd"
    variant_params: dict = field(default_factory=dict)
    loss_agg_mode: str = "seq-mean-token-mean"

    def __post_init__(self):
        if not 0.0 <= float(self.beta) <= 1.0:
            raise ValueError(f"opsd.loss.beta must be in [0, 1] (0 = forward KL, 1 = reverse KL), got {self.beta!r}")
        if self.clip_tau is not None and not float(self.clip_tau) > 0.0:
            raise ValueError(f"opsd.loss.clip_tau must be > 0 or null (no clip), got {self.clip_tau!r}")
        if not float(self.student_temperature) > 0.0:
            raise ValueError(f"opsd.loss.student_temperature must be > 0, got {self.student_temperature!r}")
        if self.teacher_temperature is not None and not float(self.teacher_temperature) > 0.0:
            raise ValueError(
                f"opsd.loss.teacher_temperature must be > 0 or null (= student_temperature), "
                f"got {self.teacher_temperature!r}"
            )
        if self.topk is not None and (isinstance(self.topk, bool) or int(self.topk) != self.topk or self.topk < 1):
            raise ValueError(f"opsd.loss.topk must be an integer >= 1 or null (full vocabulary), got {self.topk!r}")
        if isinstance(self.chunk_size, bool) or int(self.chunk_size) != self.chunk_size or self.chunk_size < 1:
            raise ValueError(f"opsd.loss.chunk_size must be an integer >= 1, got {self.chunk_size!r}")
        from recipe.opsd.losses import LOSS_AGG_MODES

        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"opsd.loss.loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"opsd.loss.variant must be one of {list(VARIANTS)}, got {self.variant!r}")
        if self.variant_params is not None and not isinstance(self.variant_params, Mapping):
            raise ValueError(f"opsd.loss.variant_params must be a mapping, got {self.variant_params!r}")
        self.variant_params = dict(self.variant_params or {})
        from recipe.opsd.variants import variant_params

        try:
            variant_params(self.variant, self.variant_params)
        except (TypeError, ValueError) as err:
            raise ValueError(f"opsd.loss.variant_params (variant {self.variant!r}): {err}") from None
        if self.variant != "opsd" and self.topk is not None:
            raise ValueError(
                f"opsd.loss.topk must be null with opsd.loss.variant={self.variant!r} (the variant's target is "
                f"full-vocabulary), got {self.topk!r}"
            )
        from recipe.opsd.positions import parse_position_spec

        try:
            parse_position_spec(str(self.positions))
        except ValueError as err:
            raise ValueError(f"opsd.loss.positions: {err}") from None

    @property
    def effective_teacher_temperature(self) -> float:
        return float(self.student_temperature if self.teacher_temperature is None else self.teacher_temperature)

    @property
    def params(self):
        """The validated variant parameters (``PurifiedParams`` / ``BetaOPSDParams``; None for opsd)."""
        from recipe.opsd.variants import variant_params

        return variant_params(self.variant, self.variant_params)

    @property
    def position_kind(self) -> str:
        """``all | first | uniform | final | he | le | advt``."""
        from recipe.opsd.positions import parse_position_spec

        return parse_position_spec(str(self.positions)).kind


# --- objectives (issue 22 item 2): recipe.opsd.objectives
@dataclass
class OPSDObjectiveConfig:
    """Which objective the actor optimises (``opsd.objective``; defaults: the paper's divergence alone).

    kind: ``full_vocabulary`` (the ``opsd.loss`` divergence, the paper) or ``sampled_token`` (teacher -
        student log-prob of the sampled token as a per-token advantage through verl's PPO surrogate;
        ``opsd.loss`` then sets temperatures, positions and aggregation, not beta / clip_tau / topk).
    task_weight: weight of the grader's GRPO group advantage (the task reward) added to the
        distillation signal; > 0 needs ``actor_rollout_ref.rollout.n`` > 1 (groups of rollouts per prompt).
    clip_ratio_low / clip_ratio_high: the surrogate's PPO clip (verl's 0.2 / 0.2); both null = unclipped.
    discount: discount of the sampled-token advantage over later tokens (0 = per token).
    sft_weight: weight of the SFT term: the student's NLL of each row's reference solution
        (``extra_info.solution`` + EOS) given its student prompt, at temperature 1 (the official code's
        ``sft_loss_weight``); 0 = none (no second student forward, nothing sent to the workers).
    sft_max_length: cap on the solution tokens of the SFT term (EOS included); a longer solution is cut
        to its first ``sft_max_length`` tokens (no EOS) and counted in ``opsd/sft_truncated_frac``;
        None = ``data.max_response_length`` (the student's own response budget).
    """

    kind: str = "full_vocabulary"
    task_weight: float = 0.0
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    discount: float = 0.0
    sft_weight: float = 0.0
    sft_max_length: int | None = None

    def __post_init__(self):
        from recipe.opsd.objectives import OBJECTIVES

        if self.kind not in OBJECTIVES:
            raise ValueError(f"opsd.objective.kind must be one of {list(OBJECTIVES)}, got {self.kind!r}")
        try:
            self.weights  # noqa: B018 - validates the numbers
        except ValueError as err:
            raise ValueError(f"opsd.objective.{err}") from None
        cap = self.sft_max_length
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"opsd.objective.sft_max_length must be an integer >= 1 or null "
                             f"(= data.max_response_length), got {cap!r}")

    @property
    def weights(self):
        """The pure ``objectives.ObjectiveWeights``."""
        from recipe.opsd.objectives import ObjectiveWeights

        return ObjectiveWeights(objective=self.kind, task_weight=self.task_weight, sft_weight=self.sft_weight,
                                clip_ratio_low=self.clip_ratio_low, clip_ratio_high=self.clip_ratio_high,
                                discount=self.discount)


# ----------------------------------------------------------------- teacher kinds (opsd.teacher)
@dataclass
class OPSDTeacherConfig:
    """Which weights score the rollouts under the privileged prompt (``opsd.teacher``;
    ``recipe.opsd.teacher_kinds``).

    kind: ``frozen_initial`` (the paper's frozen copy of the initial student) | ``checkpoint`` (the
        model at ``path``, same tokenizer, frozen) | ``ema`` (starts as the initial student, then
        ``d * teacher + (1 - d) * student`` after every optimizer step) | ``live`` (the current
        student's weights, no second copy).
    path: kind ``checkpoint`` only: a model directory or a Hub id (its lm_head is the teacher head).
    ema_decay: kind ``ema`` only: d in [0, 1] (1 = ``frozen_initial``).
    allow_zero_loss: start even when teacher weights, prompt, mode and temperature all equal the
        student's (the loss is then identically zero; refused at start otherwise).
    """

    kind: str = "frozen_initial"
    path: str | None = None
    ema_decay: float | None = None
    allow_zero_loss: bool = False

    def __post_init__(self):
        from recipe.opsd.teacher_kinds import TEACHER_KINDS

        if self.kind not in TEACHER_KINDS:
            raise ValueError(f"opsd.teacher.kind must be one of {list(TEACHER_KINDS)}, got {self.kind!r}")
        if self.kind == "checkpoint":
            if not isinstance(self.path, str) or not self.path.strip():
                raise ValueError(
                    f"opsd.teacher.path must be a model directory or Hub id with opsd.teacher.kind=checkpoint, "
                    f"got {self.path!r}"
                )
        elif self.path is not None:
            raise ValueError(
                f"opsd.teacher.path must be null unless opsd.teacher.kind=checkpoint (kind {self.kind!r}), got {self.path!r}"
            )
        if self.kind == "ema":
            decay = self.ema_decay
            if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= float(decay) <= 1.0:
                raise ValueError(
                    f"opsd.teacher.ema_decay must be a number in [0, 1] with opsd.teacher.kind=ema (1 = frozen), got {decay!r}"
                )
            self.ema_decay = float(decay)
        elif self.ema_decay is not None:
            raise ValueError(
                f"opsd.teacher.ema_decay must be null unless opsd.teacher.kind=ema (kind {self.kind!r}), got {self.ema_decay!r}"
            )
        if not isinstance(self.allow_zero_loss, bool):
            raise ValueError(f"opsd.teacher.allow_zero_loss must be true or false, got {self.allow_zero_loss!r}")


@dataclass
class OPSDConfig:
    """The ``opsd:`` block.

    teacher_context: which privileged context the teacher sees (recipe.common.prompts.TEACHER_CONTEXTS).
    student_mode / teacher_mode: chat-template reasoning mode of each side (``think`` | ``no_think``
        | None); the student's mode also sets ``data.apply_chat_template_kwargs.enable_thinking``.
        None = the model's native (only) mode: the template is rendered without the
        ``enable_thinking`` switch (single-mode models: OLMo-3, DeepSeek-R1-Distill, ...).
    teacher_max_prompt_length: cap on the rendered teacher prompt in tokens (the paper: 1,024;
        8,192 for the CoT + solution context). A longer teacher prompt is an error, never truncated.
    monitor: the collapse monitor's options (``recipe.opsd.monitor.MonitorConfig``).
    objective: the objective (``OPSDObjectiveConfig``): the divergence (default), the sampled-token
        form, a task-reward weight, an SFT weight.
    preflight: run the pre-flight gate before Ray starts (``recipe.opsd.preflight``: student and
        teacher renderings of the first training rows agree on EOS and reasoning-mode tokens, the
        ``none`` control gives the student's exact input) and, on the workers before the first
        rollout, the divergence of the first response positions (``preflight_positions``); False
        skips both.
    preflight_positions: K, the response positions (the reference solution's first K tokens,
        teacher-forced) whose divergence the pre-flight gate reports on the workers; integer >= 1.
    teacher: which weights score the rollouts (``OPSDTeacherConfig``; default the frozen initial student).
    max_consecutive_nonfinite: steps in a row with a non-finite loss or gradient norm (each one's
        update skipped, ``recipe.opsd.nonfinite``) after which the run saves a checkpoint and stops.
    dump_steps: write every step's rollout ids, teacher inputs, loss positions and RNG state to
        ``<trainer.default_local_dir>/step_dumps/step_<s>.pt`` (``recipe.opsd.step_dump``; re-scored
        by ``recipe.analysis.replay``).
    """

    teacher_context: str = "full_solution"
    student_mode: str = "think"
    teacher_mode: str = "think"
    teacher_max_prompt_length: int = 1024
    loss: OPSDLossConfig = field(default_factory=OPSDLossConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    # --- objectives (issue 22 item 2)
    objective: OPSDObjectiveConfig = field(default_factory=OPSDObjectiveConfig)
    # --- pre-flight gate (issue 22 item 3)
    preflight: bool = True
    preflight_positions: int = 16
    teacher: OPSDTeacherConfig = field(default_factory=OPSDTeacherConfig)
    max_consecutive_nonfinite: int = 3
    dump_steps: bool = False

    def __post_init__(self):
        if isinstance(self.loss, Mapping):
            self.loss = _build(OPSDLossConfig, self.loss, prefix="opsd.loss")
        if self.teacher is None or isinstance(self.teacher, Mapping):
            self.teacher = _build(OPSDTeacherConfig, self.teacher or {}, prefix="opsd.teacher")
        if self.monitor is None or isinstance(self.monitor, Mapping):
            self.monitor = _build(MonitorConfig, self.monitor or {}, prefix="opsd.monitor")
        allowed = _allowed_contexts()
        if self.teacher_context not in allowed:
            raise ValueError(f"opsd.teacher_context must be one of {list(allowed)}, got {self.teacher_context!r}")
        for name in ("student_mode", "teacher_mode"):
            if getattr(self, name) not in MODES:
                raise ValueError(f"opsd.{name} must be one of {list(MODES)}, got {getattr(self, name)!r}")
        if self.loss.variant == "purified":
            from recipe.common.prompts import REFERENCE_CONTEXTS

            if self.teacher_context not in REFERENCE_CONTEXTS:
                raise ValueError(
                    f"opsd.teacher_context must be one of {list(REFERENCE_CONTEXTS)} with opsd.loss.variant=purified "
                    f"(its reference-only teacher needs a reference), got {self.teacher_context!r}"
                )
        if self.objective is None or isinstance(self.objective, Mapping):
            self.objective = _build(OPSDObjectiveConfig, self.objective or {}, prefix="opsd.objective")
        if self.objective.weights.needs_policy_gradient and self.loss.variant != "opsd":
            raise ValueError(
                f"opsd.objective (kind {self.objective.kind!r}, task_weight {self.objective.task_weight}) needs "
                f"opsd.loss.variant=opsd; {self.loss.variant!r} has its own target"
            )
        if self.objective.sft_weight > 0 and self.loss.variant != "opsd":
            raise ValueError(
                f"opsd.objective.sft_weight={self.objective.sft_weight} needs opsd.loss.variant=opsd; "
                f"{self.loss.variant!r} has its own target"
            )
        if self.objective.kind == "sampled_token" and self.loss.topk is not None:
            raise ValueError(f"opsd.loss.topk must be null with opsd.objective.kind=sampled_token (it scores the "
                             f"sampled token only, no vocabulary support), got {self.loss.topk!r}")
        if not isinstance(self.preflight, bool):
            raise ValueError(f"opsd.preflight must be true or false, got {self.preflight!r}")
        k = self.preflight_positions
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"opsd.preflight_positions must be an integer >= 1 (response positions the pre-flight "
                             f"gate scores), got {k!r}")
        tmax = self.teacher_max_prompt_length
        if isinstance(tmax, bool) or int(tmax) != tmax or tmax < 1:
            raise ValueError(f"opsd.teacher_max_prompt_length must be an integer >= 1, got {tmax!r}")
        k = self.max_consecutive_nonfinite
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"opsd.max_consecutive_nonfinite must be an integer >= 1, got {k!r}")
        if not isinstance(self.dump_steps, bool):
            raise ValueError(f"opsd.dump_steps must be true or false, got {self.dump_steps!r}")

    @property
    def student_enable_thinking(self) -> bool | None:
        """``enable_thinking`` of the student's template; None = do not pass the switch (native mode)."""
        return None if self.student_mode is None else self.student_mode == "think"

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


def _build(cls, values: Mapping, *, prefix: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown field(s) {[f'{prefix}.{k}' for k in unknown]}; allowed: {sorted(names)}")
    return cls(**dict(values))
