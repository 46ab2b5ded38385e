"""The paper's figures as PNG files (matplotlib, Agg canvas; no GPU, no display).

Every ``plot_*`` function takes plain numbers (read from run logs or result JSON by
``recipe.analysis.figures``, the sweep and the signal report), draws on a ``matplotlib.figure.Figure``
(no pyplot global state) and writes one PNG, refusing to overwrite an existing file unless
``overwrite=True``. Each function's docstring names the paper figure it draws.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from recipe.analysis.run_logs import metric_series
from recipe.common.cli import InputError, read_json, refuse_overwrite

# Default training-dynamics panels: the four traces of the paper's "OPSD Training Dynamics".
DYNAMICS_METRICS: tuple[tuple[str, str], ...] = (
    ("opsd/student_entropy", "Student entropy $H_S$"),
    ("opsd/fwd_kl", r"Forward KL $D_{KL}(\pi^T\|\pi^S)$"),
    ("opsd/loss", "Clipped loss"),
    ("actor/grad_norm", r"Grad norm $\|\nabla\|$ (pre-clip)"),
)
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    if window < 1:
        raise InputError(f"moving-average window (--smooth) must be >= 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_metric_vs_cap(
    models: Mapping[str, Mapping[str, Any]],
    out_path: str | Path,
    *,
    n: int = 8,
    length_unit: float = 1000.0,
    overwrite: bool = False,
) -> Path:
    """One panel per model: OPSD (solid) vs Base (dashed) across rollout caps (paper ``fig:length_sweeps``),
    Avg@n / Pass@n on the left axis, mean length on a right axis.

    ``models[name]`` = ``{"caps": [128, 256, ...], "opsd": {"avg": [...], "pass": [...],
    "length": [...]}, "base": {"avg": x, "pass": y, "length": z}}`` (accuracies in %,
    length in tokens; Base is one evaluation so it is drawn as a horizontal line).
    """
    if not models:
        raise ValueError("plot_metric_vs_cap: no models given")
    ncols = min(len(models), 4)
    nrows = math.ceil(len(models) / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.4 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    unit = "k tokens" if length_unit == 1000 else f"x{length_unit:g} tokens"
    for ax, (name, data) in zip(axes, models.items()):
        caps = [float(c) for c in data["caps"]]
        opsd, base = data["opsd"], data.get("base") or {}
        for key in ("avg", "pass", "length"):
            if len(opsd[key]) != len(caps):
                raise ValueError(f"plot_metric_vs_cap: {name}: opsd.{key} has {len(opsd[key])} values for {len(caps)} caps")
        right = ax.twinx()
        lines = []
        for key, label, color, axis in (
            ("avg", f"Avg@{n}", _COLORS[0], ax),
            ("pass", f"Pass@{n}", _COLORS[1], ax),
            ("length", f"Length ({unit})", _COLORS[2], right),
        ):
            scale = length_unit if key == "length" else 1.0
            lines += axis.plot(caps, [v / scale for v in opsd[key]], "-", marker="o", ms=4, color=color, label=label)
            if key in base:
                axis.axhline(base[key] / scale, ls="--", lw=1.2, color=color)
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps, [_cap_label(c) for c in caps])
        ax.minorticks_off()
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("Max rollout length (tokens)")
        ax.set_ylabel("Accuracy (%)")
        right.set_ylabel(f"Mean length ({unit})", color=_COLORS[2])
        right.tick_params(axis="y", colors=_COLORS[2])
        ax.grid(alpha=0.3)
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    style = [Line2D([], [], color="black", ls="-", marker="o", ms=4, label="OPSD"),
             Line2D([], [], color="black", ls="--", label="Base")]
    # One row of five entries needs two panels' width; a single panel wraps them (3 + 2).
    fig.legend(handles=lines[:3] + style, loc="outside lower center", ncols=5 if ncols > 1 else 3, frameon=False)
    return _save(fig, out_path, overwrite)


def plot_training_dynamics(
    runs: Mapping[str, Iterable[Mapping[str, Any]]],
    out_path: str | Path,
    *,
    metrics: Sequence[tuple[str, str]] = DYNAMICS_METRICS,
    smooth: int = 5,
    start_step: int = 2,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """One panel per metric, one line per run: ``smooth``-step moving average of the rows with
    step >= ``start_step`` (paper ``fig:grpo_opsd_dynamics``: 5, from step 2, "Step 1 contains a one-off
    startup batch"). A metric no run logged is left out; a run lacking a metric is listed in that panel's note."""
    runs = {name: list(rows) for name, rows in runs.items()}
    if not runs:
        raise ValueError("plot_training_dynamics: no runs given")
    panels = []
    for key, label in metrics:
        series = {}
        for name, rows in runs.items():
            steps, values = metric_series([r for r in rows if r["step"] >= start_step], key)
            if steps:
                series[name] = (steps, moving_average(values, smooth))
        if series:
            panels.append((key, label, series))
    if not panels:
        wanted = [key for key, _ in metrics]
        raise InputError(f"none of the metrics {wanted} was logged by any run (from step {start_step})",
                         hint="choose panels with --metric KEY, or pass the runs' file-logger .jsonl")
    ncols = min(len(panels), 2)
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.0 * ncols, 3.2 * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colors = {name: _COLORS[i % len(_COLORS)] for i, name in enumerate(runs)}
    for ax, (key, label, series) in zip(axes, panels):
        for name, (steps, values) in series.items():
            ax.plot(steps, values, color=colors[name], lw=1.6, label=name)
        missing = [name for name in runs if name not in series]
        if missing:
            ax.text(0.01, 0.98, "not logged: " + ", ".join(missing), transform=ax.transAxes, fontsize=7, va="top", color="gray")
        ax.set_title(label, fontsize=11)
        ax.set_xlabel("Training step")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    handles = [ax_line for ax_line in axes[0].get_lines()]
    fig.legend(handles=handles, labels=[h.get_label() for h in handles], loc="outside lower center",
               ncols=min(len(runs), 4), frameon=False)
    fig.suptitle(title or f"{smooth}-step moving average from step {start_step}", fontsize=11)
    return _save(fig, out_path, overwrite)


def plot_accuracy_vs_step(
    runs: Mapping[str, Sequence[Mapping[str, float]]],
    out_path: str | Path,
    *,
    n: int = 8,
    overwrite: bool = False,
) -> Path:
    """Avg@n (solid) and Pass@n (dashed) vs training step, one colour per run (paper ``fig:opsd_extend300``).

    ``runs[name]`` = ``[{"step": 0, "avg": .., "pass": ..}, ...]`` (step 0 = Base), in %.
    """
    if not runs:
        raise ValueError("plot_accuracy_vs_step: no runs given")
    fig = Figure(figsize=(5.6, 4.0), layout="constrained")
    ax = fig.subplots()
    for i, (name, points) in enumerate(runs.items()):
        points = sorted(points, key=lambda p: p["step"])
        steps = [p["step"] for p in points]
        color = _COLORS[i % len(_COLORS)]
        ax.plot(steps, [p["avg"] for p in points], "-", marker="o", ms=4, color=color, label=f"{name} Avg@{n}")
        if all("pass" in p for p in points):
            ax.plot(steps, [p["pass"] for p in points], "--", marker="s", ms=4, color=color, label=f"{name} Pass@{n}")
    ax.set_xlabel("Training step (0 = Base)")
    ax.set_ylabel("Accuracy (%)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    return _save(fig, out_path, overwrite)


def plot_pca_scatter(
    points: Mapping[str, Sequence[Sequence[float]]],
    out_path: str | Path,
    *,
    explained: Sequence[float] | None = None,
    title: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Rollout-level PCA coordinates (small, translucent) and per-condition centroids (large)
    (paper ``fig:teacher_context_signals`` (a)).

    ``points[condition]`` = list of ``[pc1, pc2]``; ``explained`` = variance ratios of the PCs.
    """
    if not points:
        raise ValueError("plot_pca_scatter: no conditions given")
    fig = Figure(figsize=(6.2, 5.2), layout="constrained")
    ax = fig.subplots()
    for i, (name, coords) in enumerate(points.items()):
        if len(coords) == 0:
            continue
        xs, ys = [c[0] for c in coords], [c[1] for c in coords]
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        few = len(xs) < 100
        ax.scatter(xs, ys, s=16 if few else 8, alpha=0.6 if few else 0.25, color=color, marker=marker, linewidths=0)
        ax.scatter([sum(xs) / len(xs)], [sum(ys) / len(ys)], s=140, color=color, marker=marker,
                   edgecolors="black", linewidths=1.0, label=f"{name} (n={len(xs)})", zorder=3)
    variance = [f" ({100 * ratio:.1f}% var.)" for ratio in explained] if explained is not None else ["", ""]
    ax.set_xlabel("PC1" + variance[0])
    ax.set_ylabel("PC2" + variance[1])
    ax.axhline(0, color="gray", lw=0.5)
    ax.axvline(0, color="gray", lw=0.5)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=min(len(points), 3), fontsize=8, frameon=False,
               title="small: rollouts, large: condition centroid", title_fontsize=8)
    if title:
        ax.set_title(title, fontsize=11)
    return _save(fig, out_path, overwrite)


def plot_position_windows(
    windows: Mapping[str, Sequence[Mapping[str, Any]]],
    out_path: str | Path,
    *,
    overwrite: bool = False,
) -> Path:
    """Forward-KL mean (left panel) and SNR = mean/std (right panel) per response-position
    window, one line per condition (paper ``tab:position_window_main``). ``windows[cond]`` =
    ``[{"window": "[0,128)", "mean": .., "snr": .., "count": ..}, ...]``; windows without tokens
    (count 0 or mean None) are skipped."""
    if not windows:
        raise ValueError("plot_position_windows: no conditions given")
    labels: list[str] = []  # windows with tokens in at least one condition, in order
    for rows in windows.values():
        for row in rows:
            if row["window"] not in labels and row.get("count", 1) and row.get("mean") is not None:
                labels.append(row["window"])
    if not labels:
        raise InputError("every response-position window is empty in the signals.json files")
    fig = Figure(figsize=(9.0, 4.2), layout="constrained")
    ax_mean, ax_snr = fig.subplots(1, 2)
    for i, (name, rows) in enumerate(windows.items()):
        kept = [r for r in rows if r.get("count", 1) and r.get("mean") is not None]
        xs = [labels.index(r["window"]) for r in kept]
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        ax_mean.plot(xs, [r["mean"] for r in kept], "-", marker=marker, color=color, label=name)
        snr = [(x, r["snr"]) for x, r in zip(xs, kept) if r.get("snr") is not None]
        ax_snr.plot([x for x, _ in snr], [s for _, s in snr], "-", marker=marker, color=color, label=name)
    for ax, ylabel in ((ax_mean, "Mean forward KL"), (ax_snr, r"SNR $=\mu/\sigma$")):
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("Response position window")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    fig.legend(handles=ax_mean.get_lines(), loc="outside lower center", ncols=min(len(windows), 3), fontsize=8, frameon=False)
    return _save(fig, out_path, overwrite)


def read_eval_results(path: str | Path, *, dataset: str | None = None) -> dict[str, float]:
    """Figure numbers of one evaluation (``results.json`` of ``scripts/evaluate.py``, or its
    directory): ``avg`` / ``pass`` (Avg@n / Pass@n in %), ``length`` (mean tokens), ``boxed`` (%),
    ``n``; the macro average unless ``dataset`` names one benchmark."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    results = read_json(path, what="evaluation results.json")
    try:
        n = int(results["n"])
        metrics = results["macro"] if dataset is None else results["per_dataset"][dataset]
        return {
            "avg": 100.0 * metrics[f"avg@{n}"],
            "pass": 100.0 * metrics[f"pass@{n}"],
            "length": float(metrics["mean_length"]),
            "boxed": 100.0 * metrics["boxed_rate"],
            "n": n,
        }
    except (KeyError, TypeError) as err:
        raise InputError(f"not an evaluation results.json of scripts/evaluate.py (missing {err})", file=path,
                         hint="--dataset must name a benchmark it holds" if dataset else None) from None


def _cap_label(cap: float) -> str:
    return f"{cap / 1024:g}k" if cap >= 1024 else f"{cap:g}"


def _save(fig: Figure, out_path: str | Path, overwrite: bool) -> Path:
    out_path = Path(out_path)
    if out_path.suffix.lower() != ".png":
        raise InputError("figure path must end in .png", file=out_path)
    refuse_overwrite([out_path], overwrite=overwrite, other="another --out")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out_path, dpi=150)
    return out_path
