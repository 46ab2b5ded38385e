"""Figures are written as non-empty PNGs; moving average and eval-results reader by hand."""

import json

import pytest

from recipe.analysis import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_moving_average_hand_values():
    assert plots.moving_average([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3) == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    assert plots.moving_average([2.0, 4.0], 1) == [2.0, 4.0]
    with pytest.raises(ValueError):
        plots.moving_average([1.0], 0)


def test_training_dynamics_from_step_2_with_smoothing(tmp_path):
    rows = [{"step": s, "opsd/student_entropy": float(s), "actor/grad_norm": 1.0} for s in range(1, 31)]
    other = [{"step": s, "opsd/student_entropy": 0.5} for s in range(1, 31)]
    out = plots.plot_training_dynamics({"a": rows, "b": other}, tmp_path / "dyn.png")
    assert_png(out)
    with pytest.raises(FileExistsError):
        plots.plot_training_dynamics({"a": rows}, tmp_path / "dyn.png")
    with pytest.raises(ValueError, match="none of"):
        plots.plot_training_dynamics({"a": [{"step": 2, "x": 1.0}]}, tmp_path / "none.png")


def test_metric_vs_cap_accuracy_pca_windows(tmp_path):
    sweep = {
        "m1": {"caps": [128, 256, 1024], "opsd": {"avg": [30, 31, 29], "pass": [50, 52, 49], "length": [9000, 9500, 12000]},
               "base": {"avg": 30.5, "pass": 51, "length": 9100}},
        "m2": {"caps": [128, 256], "opsd": {"avg": [10, 11], "pass": [20, 22], "length": [3000, 3100]}, "base": {}},
    }
    assert_png(plots.plot_metric_vs_cap(sweep, tmp_path / "cap.png"))
    bad = {"m": {"caps": [128, 256], "opsd": {"avg": [1], "pass": [1, 2], "length": [1, 2]}}}
    with pytest.raises(ValueError, match="opsd.avg"):
        plots.plot_metric_vs_cap(bad, tmp_path / "bad.png")
    acc = {"run": [{"step": 0, "avg": 30, "pass": 50}, {"step": 50, "avg": 28, "pass": 49}]}
    assert_png(plots.plot_accuracy_vs_step(acc, tmp_path / "acc.png"))
    pts = {"a": [[0.0, 1.0], [1.0, 0.0]], "b": [[-1.0, -1.0], [-2.0, 0.5]]}
    assert_png(plots.plot_pca_scatter(pts, tmp_path / "pca.png", explained=[0.7, 0.2]))
    windows = {"c": [{"window": "[0,128)", "mean": 0.3, "snr": 0.2, "count": 5},
                     {"window": "[128,256)", "mean": None, "snr": None, "count": 0}]}
    assert_png(plots.plot_position_windows(windows, tmp_path / "win.png"))
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
