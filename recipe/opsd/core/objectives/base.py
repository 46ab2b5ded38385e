"""The objective registry: what an objective is, what it asks of the glue, how it is found by name.

An objective turns one micro-batch of hidden states (student with grad, teacher frozen) into its
share of the mini-batch loss. It is an ``Objective`` subclass registered under its name
(``opsd.loss.objective``) by ``@register_objective``, with its own parameters (``opsd.loss.params``,
validated by its ``Params`` dataclass) and class attributes that tell the glue what it needs
(described once, in ``Objective``'s docstring); the glue reads those attributes and never branches
on a name. The package's modules are imported by discovery (``import_objective_modules``), so a new
objective is one module with a decorated class plus one experiment preset.

Pure: torch and stdlib only (no verl / ray).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import torch

from recipe.opsd.core.objectives.terms import (
    LOG_RATIO_CLAMP,
    policy_gradient_terms,
    sampled_token_log_probs_from_hidden,
    weighted_sum,
)

__all__ = [
    "Objective",
    "ObjectiveBatch",
    "ObjectiveLoss",
    "register_objective",
    "get_objective",
    "objective_names",
    "import_objective_modules",
    "scatter_rows",
    "needs_behaviour_log_probs",
]

_REGISTRY: dict[str, type["Objective"]] = {}
# the modules of an objectives package that register no objective (``import_objective_modules`` skips them)
HELPER_MODULES = ("base", "terms")


@dataclass
class ObjectiveBatch:
    """One micro-batch as an objective sees it.

    ``*_bRH`` / ``*_bR``: [b, R, ...] over the micro-batch's rollouts and response columns;
    ``*_NH`` / ``*_N``: the response rows (``response_mask_bR`` true, row-major). ``weight_bR`` is
    each loss position's weight in the mini-batch loss (0 elsewhere; the aggregation of
    ``opsd.loss.loss_agg_mode`` x dp_size), so ``sum(weight_bR * per-position loss)`` is this
    micro-batch's share. ``signals``: the no-grad token diagnostics over the response rows (None when
    the objective computes them in its own pass). ``task_advantages_b``: each rollout's GRPO
    advantage (``opsd.loss.task_weight`` > 0). ``step_values``: the trainer's ``step_values``.
    ``old_log_probs_bR``: log pS_old(y_t) of the behaviour policy, the rollout's own log-probs of its
    sampled tokens (0 off the response); None = the update's own forward, detached (fresh samples, one
    update per batch: that forward is the behaviour policy).
    """

    student_hidden_bRH: torch.Tensor
    student_weight_VH: torch.Tensor
    student_bias_V: torch.Tensor | None
    teacher_hidden_bRH: torch.Tensor
    teacher_weight_VH: torch.Tensor
    teacher_bias_V: torch.Tensor | None
    student_NH: torch.Tensor
    teacher_NH: torch.Tensor
    sampled_N: torch.Tensor
    response_mask_bR: torch.Tensor
    loss_mask_bR: torch.Tensor
    weight_bR: torch.Tensor
    signals: dict[str, torch.Tensor] | None = None
    reference_hidden_bRH: torch.Tensor | None = None
    task_advantages_b: torch.Tensor | None = None
    step_values: dict[str, float] = field(default_factory=dict)
    old_log_probs_bR: torch.Tensor | None = None


@dataclass
class ObjectiveLoss:
    """An objective's result on one micro-batch.

    ``loss``: the micro-batch's share of the mini-batch loss (with grad). ``per_token_N``: the
    per-position loss at the loss positions (logged as their token mean). ``signals``: the token
    diagnostics over the response rows. ``metrics_N``: more per-response-row values logged as token
    means (e.g. ``opsd/pg_advantage``); ``metrics``: scalars summed over micro-batches.
    """

    loss: torch.Tensor
    per_token_N: torch.Tensor
    signals: dict[str, torch.Tensor]
    metrics_N: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class Objective:
    """Base class of the registered objectives. ``loss_config`` is the validated
    ``recipe.opsd.core.config.LossConfig``; ``self.params`` its ``params`` as this objective's
    ``Params`` (None when the objective takes none). What a subclass declares for the glue:

    - ``name``: its value of ``opsd.loss.objective``; ``order``: its place in ``objective_names()``
      (then by name; the paper's objective first, a new one after the shipped ones by default);
    - ``needs_reference_forward``: a second teacher forward on the reference-only prompt (Purified
      OPSD), handed over as ``ObjectiveBatch.reference_hidden_bRH``;
    - ``signals_in_loss_pass()``: its own vocabulary pass also yields the token diagnostics
      (``recipe.opsd.core.signals``); otherwise the glue runs a no-grad diagnostics pass first and
      hands the signals over (``ObjectiveBatch.signals``: e.g. ``teacher_logp``);
    - ``step_value_names`` / ``step_values(step, total_steps, updates_per_step)``: per-step numbers the
      trainer computes and sends with the batch (beta-OPSD's teacher weight, RLSD's lambda), logged as
      ``opsd/<name>``;
    - ``supports_topk`` / ``supports_task_reward`` / ``supports_sft``: which shared settings
      (``opsd.loss.topk``, ``task_weight``, ``sft_weight``) it accepts, checked when the config is built;
    - ``needs_task_reward``: the grader's GRPO advantage is part of the objective itself (RLSD), so the
      glue grades the rollouts and hands ``ObjectiveBatch.task_advantages_b`` over at any task weight
      (``uses_task_reward()``: this, or a task weight > 0);
    - ``uses_policy_gradient`` / ``uses_surrogate()``: the loss goes through the PPO surrogate, whose
      pS_old must be the behaviour policy's: with stale samples or several updates per batch the glue
      hands the rollout's log-probs over (``ObjectiveBatch.old_log_probs_bR``, ``needs_behaviour_log_probs``).

    A new objective::

        @register_objective
        class MyObjective(Objective):
            name = "my_objective"
            Params = MyParams                  # a frozen dataclass validating opsd.loss.params
            def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss: ...
    """

    name: ClassVar[str] = ""
    order: ClassVar[int] = 100
    Params: ClassVar[type | None] = None
    needs_reference_forward: ClassVar[bool] = False
    supports_topk: ClassVar[bool] = False
    supports_task_reward: ClassVar[bool] = False
    supports_sft: ClassVar[bool] = False
    uses_policy_gradient: ClassVar[bool] = False
    needs_task_reward: ClassVar[bool] = False
    step_value_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, loss_config):
        self.loss_config = loss_config
        self.params = self.parse_params(loss_config.params)

    @classmethod
    def parse_params(cls, params: Mapping[str, Any] | None):
        """``opsd.loss.params`` as this objective's ``Params`` (missing keys: its defaults)."""
        params = dict(params or {})
        if cls.Params is None:
            if params:
                raise ValueError(f"opsd.loss.params must be empty for objective {cls.name!r}; got {sorted(params)}")
            return None
        allowed = {f.name for f in dataclasses.fields(cls.Params)}
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ValueError(f"unknown opsd.loss.params {unknown} for objective {cls.name!r}; allowed: {sorted(allowed)}")
        return cls.Params(**params)

    @classmethod
    def check(cls, loss_config, *, teacher_context: str) -> None:
        """Settings this objective cannot run with (beyond its ``supports_*`` attributes); raise ValueError."""

    def uses_task_reward(self) -> bool:
        """Whether the glue grades the rollouts and sends each one's GRPO advantage (``needs_task_reward``
        or ``opsd.loss.task_weight`` > 0)."""
        return self.needs_task_reward or self.loss_config.task_weight > 0

    def signals_in_loss_pass(self) -> bool:
        """Whether :meth:`loss` computes the token diagnostics in its own vocabulary pass."""
        return False

    def uses_surrogate(self) -> bool:
        """Whether the loss goes through the PPO surrogate (``surrogate``): a policy-gradient objective, or
        a task weight > 0 (the task term)."""
        return self.uses_policy_gradient or self.loss_config.task_weight > 0

    def step_values(self, *, step: int, total_steps: int, updates_per_step: int = 1) -> dict[str, float]:
        """The numbers named by ``step_value_names`` at training step ``step`` (0-based) of ``total_steps``,
        each step taking ``updates_per_step`` optimizer steps (so ``step * updates_per_step`` were taken before it)."""
        return {}

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        raise NotImplementedError

    # --- helpers the policy-gradient objectives share
    def student_log_probs_bR(self, batch: ObjectiveBatch) -> torch.Tensor:
        """log pS_theta(y_t) of the sampled tokens at the student temperature, [b, R] (0 off the
        response), with grad; chunked and checkpointed."""
        cfg = self.loss_config
        return scatter_rows(batch.response_mask_bR, sampled_token_log_probs_from_hidden(
            batch.student_NH, batch.student_weight_VH, batch.sampled_N, bias=batch.student_bias_V,
            temperature=cfg.student_temperature, chunk_size=cfg.chunk_size,
        ))

    @staticmethod
    def old_log_probs_bR(batch: ObjectiveBatch, student_log_probs_bR: torch.Tensor) -> torch.Tensor:
        """log pS_old(y_t) [b, R], no grad: the behaviour policy's (``batch.old_log_probs_bR``) when the glue
        sends them, else the update's own forward detached."""
        if batch.old_log_probs_bR is None:
            return student_log_probs_bR.detach()
        return batch.old_log_probs_bR.detach().to(student_log_probs_bR.dtype)

    def surrogate(self, batch: ObjectiveBatch, advantages_bR, student_log_probs_bR):
        """(the policy-gradient surrogate's weighted sum, its per-token terms [b, R], its metrics over the
        response rows) against pS_old = ``old_log_probs_bR``: ``opsd/pg_ratio`` (pS_theta / pS_old) and
        ``opsd/pg_clip_frac`` (positions whose term is the clipped one, PPO or dual clip)."""
        cfg = self.loss_config
        old_bR = self.old_log_probs_bR(batch, student_log_probs_bR)
        terms_bR = policy_gradient_terms(
            log_probs_BT=student_log_probs_bR, old_log_probs_BT=old_bR,
            advantages_BT=advantages_bR, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
        )
        mask_bR = batch.response_mask_bR
        with torch.no_grad():
            ratio_bR = torch.exp((student_log_probs_bR.detach() - old_bR).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            clipped_bR = terms_bR.detach() != -advantages_bR.detach() * ratio_bR
        metrics_N = {"opsd/pg_ratio": ratio_bR[mask_bR], "opsd/pg_clip_frac": clipped_bR[mask_bR].to(ratio_bR.dtype)}
        return weighted_sum(terms_bR, weights=batch.weight_bR.to(terms_bR.dtype)), terms_bR, metrics_N


def scatter_rows(mask_bR: torch.Tensor, values_N: torch.Tensor) -> torch.Tensor:
    """[b, R] tensor with ``values_N`` at the true entries of ``mask_bR`` (row-major), 0 elsewhere."""
    out = torch.zeros(mask_bR.shape, dtype=values_N.dtype, device=values_N.device)
    return out.masked_scatter(mask_bR, values_N)


def needs_behaviour_log_probs(objective: Objective, *, stale_samples: bool, updates_per_batch: int) -> bool:
    """Whether the surrogate's pS_old must come from the rollout (the behaviour policy's log-probs): the
    objective uses the surrogate and the update's own forward is not the policy that sampled -- the samples
    are stale (verl's one-step-off and fully-async trainers) or the batch takes several optimizer steps
    (``ppo_epochs`` > 1 or mini-batches smaller than the batch: every update after the first)."""
    return objective.uses_surrogate() and (stale_samples or updates_per_batch > 1)


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Class decorator: make ``cls`` selectable as ``opsd.loss.objective=<cls.name>``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"objective {cls.name!r} is registered twice ({_REGISTRY[cls.name].__name__}, {cls.__name__})")
    _REGISTRY[cls.name] = cls
    return cls


def get_objective(name: str) -> type[Objective]:
    if name not in _REGISTRY:
        raise ValueError(f"opsd.loss.objective must be one of {objective_names()}, got {name!r}")
    return _REGISTRY[name]


def objective_names() -> list[str]:
    """The registered objectives by their declared ``order``, then by name."""
    return sorted(_REGISTRY, key=lambda name: (_REGISTRY[name].order, name))


def import_objective_modules(*, package: str, path) -> list[str]:
    """Import every module of the package named ``package`` (its ``__path__``: ``path``) but the private
    ones (``_``-prefixed) and ``HELPER_MODULES``, so that each registers its objective; returns their
    names, sorted."""
    import importlib
    import pkgutil

    names = sorted(module.name for module in pkgutil.iter_modules(path)
                   if not module.name.startswith("_") and module.name not in HELPER_MODULES)
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
