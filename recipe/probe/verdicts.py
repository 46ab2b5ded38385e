"""The compatibility probe's verdicts: from a cell's frozen signals and its first K monitored steps to one of
the paper's regimes (``recipe.opsd.core.regimes``), with every indicator, threshold and the source of each
threshold (pure python).

The paper: "OPSD improves reasoning only in narrow compatibility regimes. Otherwise, it produces ineffective
length growth, stable degradation, or behavioral collapse"; "Initial forward KL does not predict the signed
effect"; "the joint entropy--gradient rise is a useful online warning of collapse, but no single trace reliably
predicts final performance". The verdicts therefore come from the K steps first (``step_indicators``); of the
frozen signals two mechanisms predict a degradation the K steps may be too short to show, the rest are shown.
``classify`` applies rules 1-6 (``THRESHOLDS``: each value and its source); ``recommend`` picks a cell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from recipe.opsd.core.monitor import MonitorConfig, replay
from recipe.opsd.core.regimes import REGIMES

VERDICTS = REGIMES  # the paper's regimes, as the full runs are labelled (recipe.opsd.core.regimes)
REWARD_KEY = "opsd/rollout_score"
KL_KEY = "opsd/fwd_kl"
_MONITOR = MonitorConfig()


@dataclass(frozen=True)
class Threshold:
    value: float
    rule: str
    source: str


THRESHOLDS: dict[str, Threshold] = {
    "entropy_ratio": Threshold(
        _MONITOR.entropy_ratio_threshold, "late / early student entropy >= value (with grad_ratio: collapse)",
        "the collapse monitor's default; paper tab:sft_grpo_opsd_train, steps 1-10 vs 91-100: the collapsing "
        "SFT+GRPO actor x3.1, released Qwen3-4B x0.9"),
    "grad_ratio": Threshold(
        _MONITOR.grad_norm_ratio_threshold, "late / early pre-clip grad norm >= value (with entropy_ratio: collapse)",
        "the collapse monitor's default; paper tab:sft_grpo_opsd_train: x2.5 collapsing, x0.46 healthy"),
    "length_ratio": Threshold(
        _MONITOR.length_ratio_threshold, "late / early mean rollout length >= value: length growth",
        "the collapse monitor's default; this project's SmolLM2 runs grew to the 128-token cap in 16 steps "
        "(docs/results/real_model.md)"),
    "capped_increase": Threshold(
        _MONITOR.clip_ratio_increase, "late - early fraction of rollouts at the cap >= value: length growth",
        "the collapse monitor's default; this project's SmolLM2 runs: capped 0 -> 25-81%"),
    "boxed_ratio": Threshold(
        _MONITOR.boxed_rate_ratio_threshold, "late / early boxed rate <= value (early >= 5%): format loss",
        "the collapse monitor's default; paper: 'loss of boxed-answer formatting' in collapse; this project's "
        "SmolLM2 runs: boxed 75-88% -> 6-19%"),
    "reward_z": Threshold(
        2.0, "|late - early on-policy reward| / its standard error >= value: a significant change",
        "two binomial standard errors (about 95%); statistical, not fitted to any run"),
    "kl_rise": Threshold(
        1.5, "late / early unclipped forward KL >= value without a reward rise: the divergence the loss "
        "minimises grows (stable degradation)",
        "the collapse monitor's rise ratio (1.5); the mechanism: with tau_clip the kept terms push the teacher's "
        "favoured logits down (docs/core_math.md), this project's toy runs with tau_clip 0.05: fwd KL 0.30 -> 0.34, "
        "-7.7 points; the paper's tab:token_downstream shows KL rising in gains too (Qwen3-1.7B): weak on real models"),
    "kl_fall": Threshold(
        0.8, "late / early unclipped forward KL <= value, no warning, no reward drop: predicted gain",
        "this project's toy runs without the clip: fwd KL 0.14 -> 0.009 with +79 points; the paper: 'Initial "
        "forward KL does not predict the signed effect' (a prediction, checked in docs/results/probe.md)"),
    "zero_kl": Threshold(
        1e-6, "frozen forward KL < value: no signal (teacher = student)",
        "the none control's loss is exactly 0 (docs/toy_world.md)"),
    "teacher_lift_z": Threshold(
        2.0, "(teacher - student) accuracy on the training problems, each sampling its own prompt, / its standard "
        "error <= -value: the teacher answers worse than the student (predicted stable degradation)",
        "two binomial standard errors, as reward_z; why: distillation moves the student towards the teacher's "
        "answers (the paper's related work: OPD 'requires ... a teacher with genuinely new capabilities')"),
    "clip_reversal": Threshold(
        50.0, "% of the decisive positions (teacher top token != student's) where a descent step on the clipped "
        "loss lowers pS(teacher top) while the unclipped step raises it >= value (predicted stable degradation)",
        "a majority; the mechanism: the per-entry clip zeroes the gradient of the entries it caps, and the kept "
        "terms push the capped entries' logits down (docs/core_math.md, recipe.opsd.core.signals.top_push_summary)"),
    "eos_ratio": Threshold(
        0.5, "teacher / student p(<eos>) at the student's turn ends <= value: length-growth risk (shown only)",
        "this project's SmolLM2 analysis: the teachers put 0.36-0.42 where the student puts 0.89-0.91, and its "
        "rollouts then grew to the cap (docs/results/real_model.md)"),
}


@dataclass
class Reason:
    rule: str
    indicator: str
    value: float | None
    threshold: str
    source: str


@dataclass
class Verdict:
    verdict: str
    basis: str  # observed (reward) | predicted (KL) | warning | frozen | none
    reasons: list[Reason] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "basis": self.basis, "reasons": [asdict(r) for r in self.reasons]}


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _ratio(late: float | None, early: float | None) -> float | None:
    return None if late is None or early is None or early <= 0 else late / early


def windows(num_steps: int) -> tuple[int, int]:
    """(early, late) window lengths: a third of the K steps each, at least 2 (K >= 4)."""
    if num_steps < 4:
        raise ValueError(f"the probe needs at least 4 monitored steps, got {num_steps}")
    size = max(2, num_steps // 3)
    return size, size


def proportion_z(p1: float, n1: int, p2: float, n2: int) -> float:
    """z = (p2 - p1) / sqrt(p1 q1 / n1 + p2 q2 / n2) of two proportions; a zero standard error gives 0 for equal
    proportions, +-inf otherwise."""
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    if se == 0:
        return 0.0 if p1 == p2 else math.copysign(math.inf, p2 - p1)
    return (p2 - p1) / se


def reward_z(early: Sequence[float], late: Sequence[float], *, rollouts_per_step: int) -> tuple[float | None, float | None, float | None]:
    """(early mean, late mean, z) of the 0/1 reward: ``proportion_z`` with n = steps x rollouts per step."""
    p1, p2 = _mean(early), _mean(late)
    if p1 is None or p2 is None:
        return p1, p2, None
    return p1, p2, proportion_z(p1, len(early) * rollouts_per_step, p2, len(late) * rollouts_per_step)


def step_indicators(rows: Sequence[Mapping[str, Any]], *, rollouts_per_step: int) -> dict[str, Any]:
    """Early / late window indicators of K logged steps (each row a step's metrics with ``step``).

    Means of an early window (the first third of the K steps, at least two) and a late window (the last third)
    of the logged metrics -- entropy, grad norm, length, capped fraction and boxed rate as the collapse monitor
    compares them (``recipe.opsd.core.monitor``: its window means, its default thresholds), the unclipped
    forward KL, and the on-policy task reward on the training problems (``opsd/rollout_score``: the grader's
    0/1 reward) as a z statistic of late - early (two binomial proportions).
    """
    rows = sorted(rows, key=lambda r: r["step"])
    k = len(rows)
    early_n, late_n = windows(k)
    first, last = int(rows[0]["step"]), int(rows[-1]["step"])
    monitor = replay(rows, config=MonitorConfig(early_start=first, early_end=first + early_n - 1, recent_window=late_n,
                                                warn_every=k))
    early = monitor.window_means(first, first + early_n - 1)
    late = monitor.window_means(last - late_n + 1, last)

    def series(key):
        return [float(r[key]) for r in rows if r.get(key) is not None]

    rewards = [r.get(REWARD_KEY) for r in rows]
    r_early, r_late, z = reward_z([v for v in rewards[:early_n] if v is not None],
                                  [v for v in rewards[-late_n:] if v is not None], rollouts_per_step=rollouts_per_step)
    kl = series(KL_KEY)
    out = {
        "steps": k, "early_steps": [first, first + early_n - 1], "late_steps": [last - late_n + 1, last],
        "reward_early": r_early, "reward_late": r_late, "reward_z": z,
        "kl_early": _mean(kl[:early_n]), "kl_late": _mean(kl[-late_n:]),
        "warnings": sorted({e.signature for e in monitor.events}),
    }
    out["kl_ratio"] = _ratio(out["kl_late"], out["kl_early"])
    for role in ("entropy", "grad_norm", "length", "boxed_rate"):
        out[f"{role}_early"], out[f"{role}_late"] = early.get(role), late.get(role)
        out[f"{role}_ratio"] = _ratio(late.get(role), early.get(role))
    capped_early, capped_late = early.get("clip_ratio"), late.get("clip_ratio")
    out["capped_early"], out["capped_late"] = capped_early, capped_late
    out["capped_increase"] = None if capped_early is None or capped_late is None else capped_late - capped_early
    return out


def _reason(rule: str, indicator: str, value, threshold: str) -> Reason:
    t = THRESHOLDS[threshold]
    return Reason(rule=rule, indicator=indicator, value=value, threshold=f"{t.rule} (value {t.value:g})", source=t.source)


def classify(indicators: Mapping[str, Any], frozen: Mapping[str, Any] | None = None) -> Verdict:
    """The verdict of one cell: the first of rules 1-6 that matches (``THRESHOLDS`` gives each value and its source).

    1. no measurable effect: the frozen forward KL is 0 (teacher = student: the loss is identically 0);
    2. collapse: entropy and grad norm rise together, or the boxed rate collapses while rollouts grow;
    3. ineffective length growth: rollouts grow (length ratio or capped fraction) without a significant reward
       change; with a significant reward drop: stable degradation; with a significant rise: gain;
    4. stable degradation: the reward falls significantly, or the boxed rate collapses; predicted, while the
       reward does not rise: the teacher answers the training problems significantly worse than the student
       (frozen ``teacher_lift_z``), or the clip turns the teacher's decisive signal around at most positions
       (frozen ``clip_reversal``), or the unclipped forward KL grows although the loss minimises it;
    5. gain: the reward rises significantly (observed), or the forward KL falls (the student takes on the
       teacher's behaviour) with no warning and no significant reward drop (predicted);
    6. no measurable effect otherwise.
    """
    t = {name: th.value for name, th in THRESHOLDS.items()}
    g = indicators.get
    frozen = frozen or {}
    if frozen.get("fwd_kl") is not None and frozen["fwd_kl"] < t["zero_kl"]:
        return Verdict("no measurable effect", "frozen", [_reason("no signal", "frozen fwd KL", frozen["fwd_kl"], "zero_kl")])
    z = g("reward_z")
    up, down = z is not None and z >= t["reward_z"], z is not None and z <= -t["reward_z"]
    reward = _reason("reward change", "on-policy reward z (late - early)", z, "reward_z")
    joint = (g("entropy_ratio") or 0) >= t["entropy_ratio"] and (g("grad_norm_ratio") or 0) >= t["grad_ratio"]
    growth = []
    if (g("length_ratio") or 0) >= t["length_ratio"]:
        growth.append(_reason("length growth", "length ratio", g("length_ratio"), "length_ratio"))
    if (g("capped_increase") or 0) >= t["capped_increase"]:
        growth.append(_reason("length growth", "capped-fraction increase", g("capped_increase"), "capped_increase"))
    boxed_early = g("boxed_rate_early")
    boxed_lost = (boxed_early is not None and boxed_early >= _MONITOR.min_early_boxed_rate
                  and g("boxed_rate_ratio") is not None and g("boxed_rate_ratio") <= t["boxed_ratio"])
    boxed = _reason("format loss", "boxed-rate ratio", g("boxed_rate_ratio"), "boxed_ratio")
    if joint:
        return Verdict("collapse", "warning", [
            _reason("joint rise", "entropy ratio", g("entropy_ratio"), "entropy_ratio"),
            _reason("joint rise", "grad-norm ratio", g("grad_norm_ratio"), "grad_ratio")])
    if boxed_lost and growth:
        return Verdict("collapse", "warning", [boxed, *growth])
    if growth:
        if down:
            return Verdict("stable degradation", "observed", [*growth, reward])
        if up:
            return Verdict("gain", "observed", [reward, *growth])
        return Verdict("ineffective length growth", "warning", [*growth, reward])
    if down:
        return Verdict("stable degradation", "observed", [reward])
    if boxed_lost:
        return Verdict("stable degradation", "warning", [boxed])
    lift = frozen.get("teacher_lift_z")
    if lift is not None and lift <= -t["teacher_lift_z"] and not up:
        return Verdict("stable degradation", "predicted", [
            _reason("teacher worse", "frozen teacher - student accuracy z", lift, "teacher_lift_z"), reward])
    reversal = frozen.get("clip_reversal")
    if reversal is not None and math.isfinite(reversal) and reversal >= t["clip_reversal"] and not up:
        return Verdict("stable degradation", "predicted", [
            _reason("clip reverses", "frozen clip reversal (%)", reversal, "clip_reversal"), reward])
    kl_ratio = g("kl_ratio")
    if kl_ratio is not None and kl_ratio >= t["kl_rise"] and not up:
        return Verdict("stable degradation", "predicted", [_reason("KL grows", "fwd-KL ratio", kl_ratio, "kl_rise"), reward])
    if up:
        return Verdict("gain", "observed", [reward])
    if kl_ratio is not None and kl_ratio <= t["kl_fall"] and not g("warnings"):
        return Verdict("gain", "predicted", [_reason("KL falls", "fwd-KL ratio", kl_ratio, "kl_fall"), reward])
    return Verdict("no measurable effect", "none", [reward] + (
        [_reason("KL flat", "fwd-KL ratio", kl_ratio, "kl_fall")] if kl_ratio is not None else []))


def recommend(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cell to run: among the gain verdicts, observed before predicted, then the largest reward z, then the
    smallest length ratio; ``{"cell": None, ...}`` when no cell is compatible."""
    gains = [c for c in cells if c["verdict"]["verdict"] == "gain"]
    if not gains:
        return {"cell": None, "why": "no cell is compatible: no gain verdict (" + ", ".join(
            f"{c['name']}: {c['verdict']['verdict']}" for c in cells) + ")"}

    def key(c):
        ind = c["indicators"]
        z = ind.get("reward_z")
        return (c["verdict"]["basis"] == "observed", -math.inf if z is None else z, -(ind.get("length_ratio") or 1.0))

    best = max(gains, key=key)
    z = best["indicators"].get("reward_z")
    return {"cell": best["name"], "why": f"{best['verdict']['basis']} gain, reward z {z:+.2f}" if z is not None
            else f"{best['verdict']['basis']} gain"}


def thresholds_table() -> str:
    """Markdown: every threshold, its rule and where its value comes from."""
    lines = ["| threshold | value | rule | source |", "|---|---|---|---|"]
    lines += [f"| {name} | {th.value:g} | {th.rule} | {th.source} |" for name, th in THRESHOLDS.items()]
    return "\n".join(lines)


def outcome(*, change: Mapping[str, float] | None, length_before: float | None, length_after: float | None,
            boxed_before: float | None = None, boxed_after: float | None = None) -> str:
    """The regime a full run ended in, from its held-out evaluation: ``change`` the accuracy change with its paired
    bootstrap interval (``estimate``, ``low``, ``high``; fractions). A gain / drop is an interval that excludes 0;
    a drop with the boxed rate at most ``boxed_ratio`` of the start is a collapse; no significant change with the
    mean length at least ``length_ratio`` x the start is ineffective length growth (the rules' thresholds)."""
    t = {name: th.value for name, th in THRESHOLDS.items()}
    length_ratio = _ratio(length_after, length_before)
    boxed_ratio = _ratio(boxed_after, boxed_before)
    if change is not None and change["low"] > 0:
        return "gain"
    if change is not None and change["high"] < 0:
        return "collapse" if boxed_ratio is not None and boxed_ratio <= t["boxed_ratio"] else "stable degradation"
    if length_ratio is not None and length_ratio >= t["length_ratio"]:
        return "ineffective length growth"
    return "no measurable effect"
