"""Figures: what is drawn (the series, smoothing, start step, reference lines, labels), and the PNG file.

The figure of each ``plot_*`` is captured at ``plots._save`` and its lines are compared with the
numbers given, so a wrong smoothing window, a dropped run, a swapped axis or a missing Base line
fails. ``_save`` itself is checked once (PNG written, never overwritten silently, .png only).
"""

import json

import numpy as np
import pytest

from recipe.analysis import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions built (instead of writing them)."""
    figures = []

    def capture(fig, out_path, overwrite):
        figures.append(fig)
        return out_path

    monkeypatch.setattr(plots, "_save", capture)
    return figures


def lines_of(ax):
    """``{label: (x, y)}`` of the labelled lines of an axis."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_moving_average_hand_values():
    assert plots.moving_average([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3) == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    assert plots.moving_average([2.0, 4.0], 1) == [2.0, 4.0]
    with pytest.raises(ValueError):
        plots.moving_average([1.0], 0)


def test_training_dynamics_smooths_from_step_2_and_notes_missing_metrics(drawn, tmp_path):
    rows = [{"step": s, "opsd/student_entropy": float(s), "actor/grad_norm": 1.0} for s in range(1, 31)]
    other = [{"step": s, "opsd/student_entropy": 0.5} for s in range(1, 31)]
    plots.plot_training_dynamics({"a": rows, "b": other}, tmp_path / "dyn.png", smooth=5)
    (fig,) = drawn
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert list(panels) == ["Student entropy $H_S$", r"Grad norm $\|\nabla\|$ (pre-clip)"]  # fwd_kl, loss: not logged
    entropy = lines_of(panels["Student entropy $H_S$"])
    assert entropy["a"] == (list(range(2, 31)), plots.moving_average([float(s) for s in range(2, 31)], 5))
    assert entropy["b"] == (list(range(2, 31)), [0.5] * 29)
    grad = panels[r"Grad norm $\|\nabla\|$ (pre-clip)"]
    assert list(lines_of(grad)) == ["a"] and "not logged: b" in [t.get_text() for t in grad.texts]
    with pytest.raises(ValueError, match="none of"):
        plots.plot_training_dynamics({"a": [{"step": 2, "x": 1.0}]}, tmp_path / "none.png")


def test_metric_vs_cap_draws_opsd_and_the_base_reference(drawn, tmp_path):
    sweep = {
        "m1": {"caps": [128, 256, 1024], "opsd": {"avg": [30, 31, 29], "pass": [50, 52, 49], "length": [9000, 9500, 12000]},
               "base": {"avg": 30.5, "pass": 51, "length": 9100}},
        "m2": {"caps": [128, 256], "opsd": {"avg": [10, 11], "pass": [20, 22], "length": [3000, 3100]}, "base": {}},
    }
    plots.plot_metric_vs_cap(sweep, tmp_path / "cap.png", n=8)
    (fig,) = drawn
    left = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    m1 = left["m1"]
    assert lines_of(m1) == {"Avg@8": ([128.0, 256.0, 1024.0], [30, 31, 29]), "Pass@8": ([128.0, 256.0, 1024.0], [50, 52, 49])}
    dashed = sorted(line.get_ydata()[0] for line in m1.get_lines() if line.get_linestyle() == "--")
    assert dashed == [30.5, 51]  # Base as horizontal lines
    right = next(ax for ax in fig.axes if ax is not m1 and ax.bbox.bounds == m1.bbox.bounds)
    assert lines_of(right)["Length (k tokens)"][1] == [9.0, 9.5, 12.0]
    assert not [line for line in left["m2"].get_lines() if line.get_linestyle() == "--"]  # no Base given
    bad = {"m": {"caps": [128, 256], "opsd": {"avg": [1], "pass": [1, 2], "length": [1, 2]}}}
    with pytest.raises(ValueError, match="opsd.avg"):
        plots.plot_metric_vs_cap(bad, tmp_path / "bad.png")


def test_accuracy_vs_step_pca_and_windows(drawn, tmp_path):
    acc = {"run": [{"step": 50, "avg": 28, "pass": 49}, {"step": 0, "avg": 30, "pass": 50}]}
    plots.plot_accuracy_vs_step(acc, tmp_path / "acc.png", n=8)
    assert lines_of(drawn[-1].axes[0]) == {"run Avg@8": ([0, 50], [30, 28]), "run Pass@8": ([0, 50], [50, 49])}

    pts = {"a": [[0.0, 1.0], [1.0, 0.0]], "b": [[-1.0, -1.0], [-2.0, 0.5]]}
    plots.plot_pca_scatter(pts, tmp_path / "pca.png", explained=[0.7, 0.2])
    ax = drawn[-1].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("PC1 (70.0% var.)", "PC2 (20.0% var.)")
    centroids = {c.get_label(): c.get_offsets().tolist() for c in ax.collections if not c.get_label().startswith("_")}
    assert centroids == {"a (n=2)": [[0.5, 0.5]], "b (n=2)": [[-1.5, -0.25]]}

    windows = {"c": [{"window": "[0,128)", "mean": 0.3, "snr": 0.2, "count": 5},
                     {"window": "[128,256)", "mean": None, "snr": None, "count": 0},
                     {"window": "[256,512)", "mean": 0.1, "snr": None, "count": 3}]}
    plots.plot_position_windows(windows, tmp_path / "win.png")
    ax_mean, ax_snr = drawn[-1].axes
    assert [t.get_text() for t in ax_mean.get_xticklabels()] == ["[0,128)", "[256,512)"]  # the empty window is skipped
    assert lines_of(ax_mean)["c"] == ([0, 1], [0.3, 0.1]) and lines_of(ax_snr)["c"] == ([0], [0.2])


def test_save_writes_a_png_and_never_overwrites_silently(tmp_path):
    acc = {"run": [{"step": 0, "avg": 30}, {"step": 50, "avg": 28}]}
    out = plots.plot_accuracy_vs_step(acc, tmp_path / "fig" / "acc.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
    before = out.read_bytes()
    with pytest.raises(FileExistsError, match="pass --overwrite to replace it"):
        plots.plot_accuracy_vs_step({"other": acc["run"]}, out)
    assert out.read_bytes() == before
    plots.plot_accuracy_vs_step({"other": acc["run"]}, out, overwrite=True)
    assert out.read_bytes() != before
    with pytest.raises(ValueError, match=".png"):
        plots.plot_accuracy_vs_step(acc, tmp_path / "acc.pdf")


def test_read_eval_results(tmp_path):
    results = {"n": 8, "macro": {"avg@8": 0.25, "pass@8": 0.5, "mean_length": 1234.0, "boxed_rate": 0.75},
               "per_dataset": {"aime2024": {"avg@8": 0.125, "pass@8": 0.25, "mean_length": 99.0, "boxed_rate": 1.0}}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert plots.read_eval_results(tmp_path) == {"avg": 25.0, "pass": 50.0, "length": 1234.0, "boxed": 75.0, "n": 8}
    assert plots.read_eval_results(tmp_path / "results.json", dataset="aime2024")["avg"] == 12.5
    (tmp_path / "other.json").write_text(json.dumps({"n": 8}))
    with pytest.raises(ValueError, match="macro"):
        plots.read_eval_results(tmp_path / "other.json")
    assert np.isfinite(plots.read_eval_results(tmp_path)["length"])
