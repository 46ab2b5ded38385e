"""recipe.experiments.checkpoint_selection with the merge and the evaluation replaced: every whole save evaluated,
the best by the metric (the start a candidate), intervals against the start, saves set aside not read."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.experiments import checkpoint_selection as sel
from recipe.launch import monitor_actions


def test_the_best_save_by_the_metric_with_intervals_against_the_start(tmp_path, monkeypatch):
    for step in (10, 20, 30):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / "rolled_back" / "rollback_1" / "global_step_40").mkdir(parents=True)
    monkeypatch.setattr(monitor_actions, "check_resumable", lambda folder: Path(folder))
    merged = []

    def merge(ckpt, target, log=None):
        merged.append(Path(ckpt).name)
        Path(target).mkdir(parents=True)
        (Path(target) / "config.json").write_text("{}")
        return Path(target)

    monkeypatch.setattr("recipe.common.merge.merge_checkpoint", merge)
    ids = [f"p{i}" for i in range(20)]
    scores = {10: 0.6, 20: 0.9, 30: 0.5}  # the fraction of problems solved after each save

    def evaluate(model, out):
        step = int(Path(model).parent.name.removeprefix("step_"))
        solved = int(scores[step] * len(ids))
        return {"avg@4": scores[step], "mean_length": 20.0,
                "per_problem": {"avg@4": {p: float(i < solved) for i, p in enumerate(ids)}}}

    before = {"avg@4": 0.5, "per_problem": {"avg@4": {p: float(i < 10) for i, p in enumerate(ids)}}}
    result = sel.select_checkpoint(tmp_path, evaluate=evaluate, before=before, metric="avg@4", log=lambda *_: None)
    assert merged == ["global_step_10", "global_step_20", "global_step_30"]
    assert result["best"] == 20 and result["best_model"].endswith("selection/step_20/model")
    row = next(r for r in result["rows"] if r["step"] == 20)
    assert row["change"] == pytest.approx(0.4) and row["low"] > 0  # 8 more of 20 problems, paired
    assert "| 20 (chosen) | 90.0 | +40.0 [" in sel.table(result)
    # no save beats the start: the initial model is kept
    scores.update({10: 0.4, 20: 0.3, 30: 0.2})
    result = sel.select_checkpoint(tmp_path, evaluate=evaluate, before=before, metric="avg@4", log=lambda *_: None)
    assert result["best"] == 0 and result["best_model"] == "the initial model"
