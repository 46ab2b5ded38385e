"""Training-dynamics monitor: online collapse warnings for OPSD runs (pure python).

``TrainingDynamicsMonitor`` compares a recent window of step metrics with an early one, warns on the paper's
collapse signature (student entropy and gradient norm rising together), length growth and a falling boxed
rate, and may stop the run or ask the launcher for a rollback (``MonitorAction``). Signatures, defaults and
actions: docs/analysis.md, "Collapse monitor"; settings: ``MonitorConfig``; offline: scripts/monitor_run.py.

Example (inside a trainer)::

    monitor = TrainingDynamicsMonitor(MonitorConfig(stop_on=("collapse",)))
    metrics.update(monitor.update({"step": step, **metrics}))
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

logger = logging.getLogger(__name__)

# Roles the monitor tracks -> default metric names (verl + this project's `opsd/` namespace).
DEFAULT_METRIC_KEYS: dict[str, str] = {
    "entropy": "opsd/student_entropy",
    "fwd_kl": "opsd/fwd_kl",
    "loss": "opsd/loss",
    "grad_norm": "actor/grad_norm",
    "length": "response_length/mean",
    "clip_ratio": "response_length/clip_ratio",
    "boxed_rate": "opsd/rollout_boxed_rate",
}
# Column headers of the window table (the paper's tab:sft_grpo_opsd_train, plus rollout stats).
ROLE_LABELS: dict[str, str] = {
    "entropy": "H_S",
    "fwd_kl": "D_KL(T||S)",
    "grad_norm": "||grad||",
    "loss": "Loss",
    "length": "Length",
    "clip_ratio": "Capped",
    "boxed_rate": "Boxed",
}
SIGNATURES = ("collapse", "length", "boxed")
MONITOR_PREFIX = "opsd_monitor"
# What a rollback changes before the relaunch: the learning rate (scaled by rollback_value per rollback,
# applied by the trainer to the restored optimizer) or opsd.loss.clip_tau (set to rollback_value: a relaunch
# override, ROLLBACK_OVERRIDES).
ROLLBACK_SETTINGS = ("lr_scale", "clip_tau")
ROLLBACK_OVERRIDES = {"clip_tau": "opsd.loss.clip_tau"}
# The action log the trainer appends to in its checkpoint directory (one json object per line).
ACTIONS_FILE = "monitor_actions.jsonl"
# The launcher's exit code when the monitor stopped a run (2: bad input, 3: non-finite stop).
STOPPED_EXIT_CODE = 4


class TrainingCollapseError(RuntimeError):
    """Raised by ``TrainingDynamicsMonitor.update`` when ``raise_on_stop`` is set and a
    signature listed in ``MonitorConfig.stop_on`` fires."""


@dataclass
class MonitorConfig:
    """Settings of the collapse monitor (``opsd.diagnostics.monitor`` in the OPSD trainer yaml).

    Attributes:
        enabled: False turns ``update`` into a no-op that returns ``{}``.
        early_start, early_end: inclusive step range of the reference window (paper: 1-10).
        recent_window: number of most recent steps (all after ``early_end``) averaged and
            compared with the early window; no check runs before this many such steps exist.
        entropy_ratio_threshold: collapse needs mean student entropy >= this x early mean.
        grad_norm_ratio_threshold: ... and mean pre-clip grad norm >= this x early mean.
        entropy_min_increase: ... and an absolute entropy increase of at least this (nats);
            0 = ratio only. Guards against tiny early entropies.
        length_ratio_threshold: length warning when mean response length >= this x early mean.
        clip_ratio_increase: length warning when the fraction of rollouts hitting the length
            cap rose by at least this (absolute, 0-1) over the early window. Thinking models
            at a short cap are truncated from step 1, so the cap rate is judged by its rise.
        boxed_rate_ratio_threshold: boxed warning when the rollout boxed rate <= this x early.
        min_early_boxed_rate: the boxed check runs only if the early boxed rate is >= this.
        stop_on: signatures (subset of ``collapse``, ``length``, ``boxed``) that set
            ``should_stop``.
        rollback_on: signatures that roll the run back (none of ``stop_on``).
        rollback_setting: what a rollback changes: ``lr_scale`` | ``clip_tau`` (``ROLLBACK_SETTINGS``).
        rollback_value: lr_scale: the factor (> 0) the learning rate is multiplied by at each rollback;
            clip_tau: the new ``opsd.loss.clip_tau`` (> 0, or None: no clip).
        max_rollbacks: rollbacks allowed in one run; a rollback signature firing after that many stops it.
        raise_on_stop: raise ``TrainingCollapseError`` instead of only setting ``should_stop``.
        warn_every: while a signature stays active, repeat its warning every this many steps.
        metric_keys: role -> metric name overrides (roles: see ``DEFAULT_METRIC_KEYS``), e.g.
            ``{"entropy": "actor/entropy"}`` to monitor a GRPO run.
    """

    enabled: bool = True
    early_start: int = 1
    early_end: int = 10
    recent_window: int = 10
    entropy_ratio_threshold: float = 1.5
    grad_norm_ratio_threshold: float = 1.5
    entropy_min_increase: float = 0.0
    length_ratio_threshold: float = 1.5
    clip_ratio_increase: float = 0.25
    boxed_rate_ratio_threshold: float = 0.5
    min_early_boxed_rate: float = 0.05
    stop_on: tuple[str, ...] = ()
    rollback_on: tuple[str, ...] = ()
    rollback_setting: str = "lr_scale"
    rollback_value: float | None = 0.5
    max_rollbacks: int = 1
    raise_on_stop: bool = False
    warn_every: int = 10
    metric_keys: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.early_start, int) or self.early_start < 0:
            raise ValueError(f"opsd.diagnostics.monitor.early_start must be an int >= 0, got {self.early_start!r}")
        if not isinstance(self.early_end, int) or self.early_end < self.early_start:
            raise ValueError(
                f"opsd.diagnostics.monitor.early_end must be an int >= early_start={self.early_start}, got {self.early_end!r}"
            )
        for name in ("recent_window", "warn_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"opsd.diagnostics.monitor.{name} must be an int >= 1, got {value!r}")
        for name in ("entropy_ratio_threshold", "grad_norm_ratio_threshold", "length_ratio_threshold"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 1.0:
                raise ValueError(f"opsd.diagnostics.monitor.{name} must be a number > 1 (a rise), got {value!r}")
        if not _is_number(self.boxed_rate_ratio_threshold) or not 0.0 < self.boxed_rate_ratio_threshold < 1.0:
            raise ValueError(
                f"opsd.diagnostics.monitor.boxed_rate_ratio_threshold must be in (0, 1) (a drop), got {self.boxed_rate_ratio_threshold!r}"
            )
        for name in ("clip_ratio_increase", "min_early_boxed_rate"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 < value <= 1.0:
                raise ValueError(f"opsd.diagnostics.monitor.{name} must be in (0, 1], got {value!r}")
        if not _is_number(self.entropy_min_increase) or self.entropy_min_increase < 0:
            raise ValueError(f"opsd.diagnostics.monitor.entropy_min_increase must be >= 0, got {self.entropy_min_increase!r}")
        if isinstance(self.stop_on, str):
            raise ValueError(f"opsd.diagnostics.monitor.stop_on must be a list of names, got the string {self.stop_on!r}")
        self.stop_on = tuple(self.stop_on)
        unknown = [name for name in self.stop_on if name not in SIGNATURES]
        if unknown:
            raise ValueError(f"opsd.diagnostics.monitor.stop_on has unknown entries {unknown}; allowed: {list(SIGNATURES)}")
        if isinstance(self.rollback_on, str):
            raise ValueError(f"opsd.diagnostics.monitor.rollback_on must be a list of names, got the string {self.rollback_on!r}")
        self.rollback_on = tuple(self.rollback_on)
        unknown = [name for name in self.rollback_on if name not in SIGNATURES]
        if unknown:
            raise ValueError(f"opsd.diagnostics.monitor.rollback_on has unknown entries {unknown}; allowed: {list(SIGNATURES)}")
        both = sorted(set(self.rollback_on) & set(self.stop_on))
        if both:
            raise ValueError(f"opsd.diagnostics.monitor: {both} in both stop_on and rollback_on; one action per warning")
        if self.rollback_setting not in ROLLBACK_SETTINGS:
            raise ValueError(f"opsd.diagnostics.monitor.rollback_setting must be one of {list(ROLLBACK_SETTINGS)}, "
                             f"got {self.rollback_setting!r}")
        value = self.rollback_value
        if not (value is None and self.rollback_setting == "clip_tau") and (not _is_number(value) or value <= 0):
            allowed = "a number > 0 or null (no clip)" if self.rollback_setting == "clip_tau" else "a number > 0"
            raise ValueError(f"opsd.diagnostics.monitor.rollback_value must be {allowed} with rollback_setting="
                             f"{self.rollback_setting}, got {value!r}")
        if isinstance(self.max_rollbacks, bool) or not isinstance(self.max_rollbacks, int) or self.max_rollbacks < 0:
            raise ValueError(f"opsd.diagnostics.monitor.max_rollbacks must be an int >= 0, got {self.max_rollbacks!r}")
        self.metric_keys = dict(self.metric_keys)
        unknown = [role for role in self.metric_keys if role not in DEFAULT_METRIC_KEYS]
        if unknown:
            raise ValueError(
                f"opsd.diagnostics.monitor.metric_keys has unknown roles {unknown}; allowed: {list(DEFAULT_METRIC_KEYS)}"
            )

    def key(self, role: str) -> str:
        """Metric name tracked for ``role``."""
        return self.metric_keys.get(role, DEFAULT_METRIC_KEYS[role])


@dataclass(frozen=True)
class MonitorEvent:
    """One warning the monitor raised."""

    step: int
    signature: str
    message: str


@dataclass(frozen=True)
class MonitorAction:
    """What the monitor asks for at ``step`` because ``signature`` fired over ``window`` (first, last step).

    kind: ``stop`` | ``rollback``. A rollback names the change (``setting``, ``value``) and its number
    (``rollback``: 1 for the first of the run); the launcher resumes from ``rollback_target`` of the
    steps saved before ``window[0]``.
    """

    step: int
    kind: str
    signature: str
    window: tuple[int, int]
    reason: str
    setting: str | None = None
    value: float | None = None
    rollback: int = 0

    def record(self) -> dict[str, Any]:
        """The action log's line (``ACTIONS_FILE``)."""
        return {"step": self.step, "action": self.kind, "signature": self.signature, "window": list(self.window),
                "setting": self.setting, "value": self.value, "rollback": self.rollback, "reason": self.reason}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "MonitorAction":
        return cls(step=int(record["step"]), kind=str(record["action"]), signature=str(record["signature"]),
                   window=(int(record["window"][0]), int(record["window"][1])), reason=str(record.get("reason", "")),
                   setting=record.get("setting"), value=record.get("value"), rollback=int(record.get("rollback", 0)))

    def line(self) -> str:
        """The console line of the action."""
        if self.kind == "rollback":
            change = (f"learning rate x{self.value:g}" if self.setting == "lr_scale"
                      else f"{ROLLBACK_OVERRIDES.get(self.setting, self.setting)}={self.value}")
            return (f"collapse monitor action at step {self.step}: rollback {self.rollback} ({self.signature} warning over "
                    f"steps {self.window[0]}-{self.window[1]}): save, stop, resume from the last checkpoint before step "
                    f"{self.window[0]} with {change}")
        return f"collapse monitor action at step {self.step}: stop ({self.reason})"


def rollback_target(saved_steps: Iterable[int], *, window_start: int) -> int:
    """The newest saved step before the warning window (``< window_start``); 0 = the initial model."""
    before = [int(s) for s in saved_steps if 0 < int(s) < window_start]
    return max(before, default=0)


def append_action(directory: str, action: MonitorAction) -> str:
    """Append ``action``'s record to ``<directory>/ACTIONS_FILE``; returns the file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, ACTIONS_FILE)
    with open(path, "a") as handle:
        handle.write(json.dumps(action.record()) + "\n")
    return path


def read_actions(directory: str) -> list[dict[str, Any]]:
    """The records of ``<directory>/ACTIONS_FILE`` in order ([] without one)."""
    path = os.path.join(directory, ACTIONS_FILE)
    if not os.path.isfile(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def rollbacks_done(records: Iterable[Mapping[str, Any]]) -> int:
    """How many rollbacks an action log holds."""
    return sum(1 for record in records if record.get("action") == "rollback")


def learning_rate_scale(config: "MonitorConfig", rollbacks: int) -> float:
    """The learning-rate factor in force after ``rollbacks`` rollbacks (1 unless rollback_setting is lr_scale)."""
    return float(config.rollback_value) ** rollbacks if config.rollback_setting == "lr_scale" else 1.0


class TrainingDynamicsMonitor:
    """Online early-vs-recent window monitor.

    The paper ("Analysis: From Token-Level Signals to Optimization Dynamics", section "OPSD Training
    Dynamics", appendix table ``tab:sft_grpo_opsd_train``) tracks student entropy H_S, forward KL
    D_KL(pi^T || pi^S), the clipped distillation loss and the pre-clipping gradient norm, and reports one
    clear collapse signature: "student entropy and gradient norm rise together for the SFT+GRPO actor, whereas
    both remain bounded or decrease for the released Qwen3-4B." Steps 1-10 vs 91-100 of that table: the
    collapsing run goes H_S 0.41 -> 1.29 (x3.1) and ||grad|| 0.35 -> 0.86 (x2.5); the healthy run 0.24 -> 0.22
    and 0.39 -> 0.18. Collapse then shows up in the rollouts as length blow-up and a falling boxed-answer rate
    (appendix "Output Degeneration Examples").

    Fed one dict of step metrics at a time (the trainer's own metric dict, verl names), it compares the mean
    of a *recent* window of steps with the mean of a fixed *early* window (default steps 1-10) and warns
    (``logging.warning``) on

    - ``collapse``: student entropy AND pre-clip grad norm both at least ``*_ratio_threshold`` times their
      early means in the same recent window (entropy rising alone does not fire);
    - ``length``: mean response length at least ``length_ratio_threshold`` times the early mean, or the
      fraction of rollouts hitting the cap up by ``clip_ratio_increase`` (absolute) over the early window;
    - ``boxed``: rollout boxed-answer rate at most ``boxed_rate_ratio_threshold`` times its early mean (only
      when the early rate is at least ``min_early_boxed_rate``),

    returns ``opsd_monitor/...`` metrics for the logger, and acts on a signature as configured:

    - ``stop_on``: the run saves a checkpoint and stops (``should_stop``; or ``TrainingCollapseError`` with
      ``raise_on_stop``); the launcher exits with ``STOPPED_EXIT_CODE``;
    - ``rollback_on``: the run saves and stops with a rollback request (``MonitorAction``, appended to
      ``<checkpoint dir>/monitor_actions.jsonl``); the launcher relaunches from the last checkpoint before
      the warning window (``rollback_target``) with one setting changed (``rollback_setting``: the learning
      rate times ``rollback_value`` per rollback, or ``opsd.loss.clip_tau`` set to it); after
      ``max_rollbacks`` rollbacks the same warning stops the run instead.

    Every action is an ``opsd_monitor/action_*`` metric of its step and a console line.
    """

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config if config is not None else MonitorConfig()
        self.history: list[dict[str, float]] = []
        self.events: list[MonitorEvent] = []
        self.should_stop = False
        self.stop_reason: str | None = None
        self.stop_signature: str | None = None
        self._active_since: dict[str, int] = {}
        self._last_warned: dict[str, int] = {}
        # the action this run asked for (stop / rollback) and the rollbacks before it (the action log's count)
        self.action: MonitorAction | None = None
        self.rollbacks = 0
        # the learning-rate factor the trainer applied to the optimizer of this run (saved with each checkpoint)
        self.lr_scale = 1.0

    # ------------------------------------------------------------------ update
    def update(self, metrics: Mapping[str, Any], *, step: int | None = None) -> dict[str, float]:
        """Record one step's metrics and return ``opsd_monitor/...`` metrics.

        ``step`` comes from the argument or from ``metrics["step"]``; steps must increase.
        Metrics that are missing or not finite numbers are simply not tracked for that step.
        """
        if not self.config.enabled:
            return {}
        step = _resolve_step(metrics, step)
        if self.history and step <= self.history[-1]["step"]:
            raise ValueError(
                f"TrainingDynamicsMonitor.update: step {step} is not after the last recorded step "
                f"{int(self.history[-1]['step'])}; feed each step once, in order"
            )
        row: dict[str, float] = {"step": step}
        for role in DEFAULT_METRIC_KEYS:
            value = _as_float(metrics.get(self.config.key(role)))
            if value is not None:
                row[role] = value
        self.history.append(row)
        out, fired = self._check(step)
        for signature, message in fired:
            self._warn(step, signature, message)
        stop = [signature for signature, _ in fired if signature in self.config.stop_on]
        rollback = [signature for signature, _ in fired if signature in self.config.rollback_on]
        acted = None
        if not self.should_stop and (stop or rollback):
            acted = self._act(step, stop[0] if stop else rollback[0], rollback=not stop)
        out[f"{MONITOR_PREFIX}/should_stop"] = float(self.should_stop)
        out[f"{MONITOR_PREFIX}/action_stop"] = float(acted is not None and acted.kind == "stop")
        out[f"{MONITOR_PREFIX}/action_rollback"] = float(acted is not None and acted.kind == "rollback")
        out[f"{MONITOR_PREFIX}/rollbacks"] = float(self.rollbacks + (acted is not None and acted.kind == "rollback"))
        out[f"{MONITOR_PREFIX}/lr_scale"] = self.lr_scale
        if stop and self.config.raise_on_stop:
            raise TrainingCollapseError(dict(fired)[stop[0]])
        return out

    def _act(self, step: int, signature: str, *, rollback: bool) -> MonitorAction:
        """Set ``should_stop`` and ``action`` for ``signature`` (a stop, a rollback, or a stop after max_rollbacks)."""
        cfg = self.config
        recent = self.recent_rows()
        window = (int(recent[0]["step"]), int(recent[-1]["step"]))
        self.should_stop, self.stop_signature = True, signature
        if rollback and self.rollbacks < cfg.max_rollbacks:
            self.stop_reason = (f"step {step}: {signature} signature, rollback {self.rollbacks + 1} of at most "
                                f"{cfg.max_rollbacks} (MonitorConfig.rollback_on={list(cfg.rollback_on)})")
            self.action = MonitorAction(step=step, kind="rollback", signature=signature, window=window,
                                        reason=self.stop_reason, setting=cfg.rollback_setting, value=cfg.rollback_value,
                                        rollback=self.rollbacks + 1)
        else:
            self.stop_reason = (f"step {step}: {signature} signature after {self.rollbacks} rollback(s), the most "
                                f"MonitorConfig.max_rollbacks={cfg.max_rollbacks} allows" if rollback else
                                f"step {step}: {signature} signature (MonitorConfig.stop_on={list(cfg.stop_on)})")
            self.action = MonitorAction(step=step, kind="stop", signature=signature, window=window,
                                        reason=self.stop_reason, rollback=self.rollbacks)
        return self.action

    # ------------------------------------------------------------------ windows
    def early_rows(self) -> list[dict[str, float]]:
        return [r for r in self.history if self.config.early_start <= r["step"] <= self.config.early_end]

    def recent_rows(self) -> list[dict[str, float]]:
        later = [r for r in self.history if r["step"] > self.config.early_end]
        return later[-self.config.recent_window :]

    def window_means(self, start: int, end: int) -> dict[str, float]:
        """Mean of every tracked role over steps ``start..end`` (inclusive) that logged it."""
        return _role_means([r for r in self.history if start <= r["step"] <= end])

    def _check(self, step: int) -> tuple[dict[str, float], list[tuple[str, str]]]:
        cfg = self.config
        early_rows, recent_rows = self.early_rows(), self.recent_rows()
        out: dict[str, float] = {}
        if not early_rows or len(recent_rows) < cfg.recent_window:
            for signature in SIGNATURES:
                out[f"{MONITOR_PREFIX}/{signature}_warning"] = 0.0
            return out, []
        early, recent = _role_means(early_rows), _role_means(recent_rows)
        span = f"steps {int(recent_rows[0]['step'])}-{int(recent_rows[-1]['step'])}"
        base = f"steps {cfg.early_start}-{cfg.early_end}"
        ratios = {role: _ratio(recent.get(role), early.get(role)) for role in ("entropy", "grad_norm", "fwd_kl", "length", "boxed_rate")}
        for role, value in ratios.items():
            if value is not None:
                out[f"{MONITOR_PREFIX}/{role}_ratio"] = value
        active: dict[str, str] = {}

        ent_r, grad_r = ratios["entropy"], ratios["grad_norm"]
        if (
            ent_r is not None
            and grad_r is not None
            and ent_r >= cfg.entropy_ratio_threshold
            and grad_r >= cfg.grad_norm_ratio_threshold
            and recent["entropy"] - early["entropy"] >= cfg.entropy_min_increase
        ):
            active["collapse"] = (
                f"OPSD collapse signature at step {step}: student entropy ({cfg.key('entropy')}) "
                f"{recent['entropy']:.4g} over {span} vs {early['entropy']:.4g} over {base} "
                f"(x{ent_r:.2f} >= {cfg.entropy_ratio_threshold}) and pre-clip grad norm ({cfg.key('grad_norm')}) "
                f"{recent['grad_norm']:.4g} vs {early['grad_norm']:.4g} (x{grad_r:.2f} >= {cfg.grad_norm_ratio_threshold}) "
                "are rising together, the joint rise the paper reports before OPSD collapse "
                "(expect length blow-up and a falling boxed rate next)"
            )

        length_r = ratios["length"]
        clip_delta = None
        if "clip_ratio" in early and "clip_ratio" in recent:
            clip_delta = recent["clip_ratio"] - early["clip_ratio"]
            out[f"{MONITOR_PREFIX}/clip_ratio_increase"] = clip_delta
        reasons = []
        if length_r is not None and length_r >= cfg.length_ratio_threshold:
            reasons.append(
                f"mean response length ({cfg.key('length')}) {recent['length']:.1f} over {span} vs "
                f"{early['length']:.1f} over {base} (x{length_r:.2f} >= {cfg.length_ratio_threshold})"
            )
        if clip_delta is not None and clip_delta >= cfg.clip_ratio_increase:
            reasons.append(
                f"fraction of rollouts at the length cap ({cfg.key('clip_ratio')}) {recent['clip_ratio']:.2f} vs "
                f"{early['clip_ratio']:.2f} (+{clip_delta:.2f} >= {cfg.clip_ratio_increase})"
            )
        if reasons:
            active["length"] = f"rollout length blow-up at step {step}: " + " and ".join(reasons)

        boxed_r = ratios["boxed_rate"]
        if (
            boxed_r is not None
            and early["boxed_rate"] >= cfg.min_early_boxed_rate
            and boxed_r <= cfg.boxed_rate_ratio_threshold
        ):
            active["boxed"] = (
                f"boxed-answer rate collapse at step {step}: {cfg.key('boxed_rate')} {recent['boxed_rate']:.3f} "
                f"over {span} vs {early['boxed_rate']:.3f} over {base} (x{boxed_r:.2f} <= {cfg.boxed_rate_ratio_threshold})"
            )

        fired = []
        for signature in SIGNATURES:
            out[f"{MONITOR_PREFIX}/{signature}_warning"] = float(signature in active)
            if signature not in active:
                self._active_since.pop(signature, None)
                continue
            self._active_since.setdefault(signature, step)
            last = self._last_warned.get(signature)
            if last is None or self._active_since[signature] > last or step - last >= cfg.warn_every:
                fired.append((signature, active[signature]))
        return out, fired

    def _warn(self, step: int, signature: str, message: str) -> None:
        self._last_warned[signature] = step
        self.events.append(MonitorEvent(step=step, signature=signature, message=message))
        logger.warning(message)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue monitoring after a resume (history + warning state)."""
        return {
            "history": [dict(r) for r in self.history],
            "events": [(e.step, e.signature, e.message) for e in self.events],
            "should_stop": self.should_stop,
            "stop_reason": self.stop_reason,
            "stop_signature": self.stop_signature,
            "active_since": dict(self._active_since),
            "last_warned": dict(self._last_warned),
            "lr_scale": self.lr_scale,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = [dict(r) for r in state["history"]]
        self.events = [MonitorEvent(step=s, signature=g, message=m) for s, g, m in state["events"]]
        self.should_stop = bool(state["should_stop"])
        self.stop_reason = state["stop_reason"]
        self.stop_signature = state.get("stop_signature")
        self._active_since = dict(state["active_since"])
        self._last_warned = dict(state["last_warned"])
        self.lr_scale = float(state.get("lr_scale", 1.0))


# ---------------------------------------------------------------------- offline helpers
def replay(rows: Iterable[Mapping[str, Any]], *, config: MonitorConfig | None = None) -> TrainingDynamicsMonitor:
    """Feed logged step rows (each with a ``step``) through a fresh monitor, in step order.
    ``raise_on_stop`` is ignored so the whole log is read; see ``monitor.should_stop``."""
    monitor = TrainingDynamicsMonitor(config)
    raise_on_stop = monitor.config.raise_on_stop
    monitor.config.raise_on_stop = False
    try:
        for row in sorted(rows, key=lambda r: _resolve_step(r, None)):
            monitor.update(row)
    finally:
        monitor.config.raise_on_stop = raise_on_stop
    return monitor


def window_table(
    runs: Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    windows: Iterable[tuple[int, int]] = ((1, 10), (91, 100)),
    roles: Iterable[str] = ("entropy", "fwd_kl", "grad_norm", "loss"),
    metric_keys: Mapping[str, str] | None = None,
) -> str:
    """Markdown table of per-window means per run, like the paper's ``tab:sft_grpo_opsd_train``
    (steps 1-10 vs 91-100: H_S, D_KL, ||grad||, loss). Empty windows print ``-``."""
    roles = list(roles)
    keys = {**DEFAULT_METRIC_KEYS, **(metric_keys or {})}
    unknown = [r for r in roles if r not in keys]
    if unknown:
        raise ValueError(f"window_table: unknown roles {unknown}; allowed: {list(DEFAULT_METRIC_KEYS)}")
    lines = [
        "| Run | Steps | " + " | ".join(ROLE_LABELS[r] for r in roles) + " |",
        "|---|---|" + "---|" * len(roles),
    ]
    for name, rows in runs.items():
        rows = list(rows)
        for start, end in windows:
            picked = [r for r in rows if start <= _resolve_step(r, None) <= end]
            cells = []
            for role in roles:
                values = [v for v in (_as_float(r.get(keys[role])) for r in picked) if v is not None]
                cells.append(_fmt(sum(values) / len(values)) if values else "-")
            n = len(picked)
            lines.append(f"| {name} | {start}-{end} (n={n}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- small helpers
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _as_float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _resolve_step(metrics: Mapping[str, Any], step: int | None) -> int:
    raw = step if step is not None else metrics.get("step")
    value = _as_float(raw)
    if value is None or value != int(value):
        raise ValueError(f"monitor: each metrics row needs an integer `step` (got {raw!r}); pass step= or metrics['step']")
    return int(value)


def _role_means(rows: list[dict[str, float]]) -> dict[str, float]:
    means = {}
    for role in DEFAULT_METRIC_KEYS:
        values = [r[role] for r in rows if role in r]
        if values:
            means[role] = sum(values) / len(values)
    return means


def _ratio(recent: float | None, early: float | None) -> float | None:
    if recent is None or early is None or early <= 0:
        return None
    return recent / early


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
