"""The probe's tables and figure: frozen signals, K-step indicators and verdicts per cell."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipe.probe import verdicts


def _f(value, digits=3, signed=False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None else f"{value}"
    return f"{value:+.{digits}g}" if signed else f"{value:.{digits}g}"

def table(cells: Sequence[dict[str, Any]]) -> str:
    """Markdown: frozen signals, K-step indicators and the verdict per cell."""
    lines = ["| cell | fwd KL | D>.05 % | HE20 KL % | KL decay | p(eos) T / S | clipped mass | clip rev. % "
             "| acc T / S % (z) | reward early -> late (z) | length x | capped + | boxed x | entropy x | grad x | KL x "
             "| verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        fz, ind = c.get("frozen") or {}, c["indicators"]
        eos = "-" if fz.get("eos_teacher") is None else f"{fz['eos_teacher']:.2f} / {fz['eos_student']:.2f}"
        reward = "-" if ind.get("reward_early") is None else (
            f"{100 * ind['reward_early']:.1f} -> {100 * ind['reward_late']:.1f} ({_f(ind['reward_z'], 2, True)})")
        verdict = c["verdict"]
        lines.append(
            f"| {c['name']} | {_f(fz.get('fwd_kl'))} | {_f(fz.get('d_gt_005'), 3)} | {_f(fz.get('he20_kl'), 3)} "
            f"| {_f(fz.get('kl_decay'), 2)} | {eos} | {_f(fz.get('clipped_teacher_mass'), 2)} "
            f"| {_f(fz.get('clip_reversal'), 3)} | {_lift(fz)} | {reward} "
            f"| {_f(ind.get('length_ratio'), 3)} | {_f(ind.get('capped_increase'), 2, True)} "
            f"| {_f(ind.get('boxed_rate_ratio'), 3)} | {_f(ind.get('entropy_ratio'), 3)} | {_f(ind.get('grad_norm_ratio'), 3)} "
            f"| {_f(ind.get('kl_ratio'), 3)} | **{verdict['verdict']}** ({verdict['basis']}) |")
    return "\n".join(lines)

def _lift(fz: dict[str, Any]) -> str:
    """``teacher / student accuracy % (z)`` of the frozen signals."""
    if fz.get("teacher_acc") is None:
        return "-"
    return f"{100 * fz['teacher_acc']:.0f} / {100 * fz['student_acc']:.0f} ({_f(fz['teacher_lift_z'], 2, True)})"

def frozen_table(signals: dict[str, dict[str, Any]]) -> str:
    """Markdown: the frozen signals of each cell (``--frozen-only``)."""
    lines = ["| cell | fwd KL | D>.05 % | HE20 KL % | KL decay | p(eos) T / S (ratio) | clipped mass | clip rev. % "
             "| acc T / S % (z) | rollout length |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, fz in signals.items():
        if "skipped" in fz:
            lines.append(f"| {name} | {fz['skipped']} |||||||||")
            continue
        eos = "-" if fz.get("eos_teacher") is None else \
            f"{fz['eos_teacher']:.2f} / {fz['eos_student']:.2f} ({fz['eos_ratio']:.2f})"
        lines.append(f"| {name} | {_f(fz['fwd_kl'])} | {_f(fz['d_gt_005'])} | {_f(fz['he20_kl'])} | {_f(fz['kl_decay'], 2)} "
                     f"| {eos} | {_f(fz['clipped_teacher_mass'], 2)} | {_f(fz.get('clip_reversal'), 3)} | {_lift(fz)} "
                     f"| {fz['mean_length']:.1f} |")
    return "\n".join(lines)

def reasons_text(cells: Sequence[dict[str, Any]]) -> str:
    out = []
    for c in cells:
        parts = [f"{r['indicator']} {_f(r['value'], 3)} [{r['threshold']}]" for r in c["verdict"]["reasons"]]
        out.append(f"- {c['name']}: {c['verdict']['verdict']} because " + "; ".join(parts))
    return "\n".join(out)

def plot(cells: Sequence[dict[str, Any]], path: Path) -> Path:
    """Four panels of the K-step traces per cell: reward, length, student entropy, forward KL."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = ((verdicts.REWARD_KEY, "on-policy reward"), ("response_length/mean", "rollout length"),
              ("opsd/student_entropy", "student entropy"), (verdicts.KL_KEY, "forward KL (unclipped)"))
    fig = Figure(figsize=(12, 7))
    FigureCanvasAgg(fig)
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        for c in cells:
            steps = [r["step"] for r in c["rows"] if r.get(key) is not None]
            ax.plot(steps, [r[key] for r in c["rows"] if r.get(key) is not None], marker="o", ms=3,
                    label=f"{c['name']} ({c['verdict']['verdict']})")
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.axes[0].legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
