"""The probe's own pieces (recipe.experiments.probe): the grid, the K-step launch's overrides, the end-of-turn
probabilities, the tables and the agreement with full runs; the launches are exercised by the e2e test."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from recipe.analysis.signal_analysis import Rollout
from recipe.probe import cells as probe_cells
from recipe.probe import probe, report
from recipe.probe import cli as probe_cli
from recipe.probe import validation as probe_validation


def test_grid_is_every_combination_with_its_overrides():
    cells = probe_cells.grid(contexts=["full_solution", "unrelated"], modes=["no_think:no_think"], clip_taus=["none", "0.05"],
                       temperatures=[1.0])
    assert [c.name for c in cells] == ["full_solution, no_think:no_think, tau=none, T=1",
                                       "full_solution, no_think:no_think, tau=0.05, T=1",
                                       "unrelated, no_think:no_think, tau=none, T=1", "unrelated, no_think:no_think, tau=0.05, T=1"]
    assert cells[0].overrides() == ["opsd.teacher_context=full_solution", "opsd.student_mode=no_think",
                                    "opsd.teacher_mode=no_think", "opsd.loss.clip_tau=null",
                                    "actor_rollout_ref.rollout.temperature=1", "opsd.loss.student_temperature=1"]
    assert cells[1].slug == "full_solution_no_think-no_think_tau0.05_T1"
    with pytest.raises(ValueError, match="student:teacher"):
        probe_cells.grid(contexts=["full_solution"], modes=["think"], clip_taus=["none"], temperatures=[1.0])


def test_the_k_step_launch_runs_at_the_peak_learning_rate_without_a_checkpoint():
    config = OmegaConf.create({"trainer": {"total_training_steps": 150},
                               "actor_rollout_ref": {"actor": {"optim": {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.1}}}})
    out = probe.probe_overrides(config, steps=12, batch=None)
    assert {"actor_rollout_ref.actor.optim.lr_warmup_steps=0", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
            "actor_rollout_ref.actor.optim.lr_scheduler_type=constant", "opsd.diagnostics.preflight=false"} <= set(out)
    assert {"trainer.total_training_steps=12", "trainer.save_freq=-1", "opsd.diagnostics.monitor.early_end=4",
            "opsd.diagnostics.monitor.recent_window=4"} <= set(out)
    assert "data.train_batch_size=16" in probe.probe_overrides(config, steps=12, batch=16)


def test_cells_share_a_launch_when_their_student_prompts_agree():
    cells = probe_cells.grid(contexts=["full_solution", "unrelated"], modes=["think:think", "think:no_think"],
                       clip_taus=["none", "0.05"], temperatures=[1.1, 0.7])
    assert probe_cells.launch_groups(cells) == [cells]  # contexts, teacher modes, taus and temperatures share a launch
    # concise_to_detailed changes the student's prompt too: its own launch
    styled = probe_cells.grid(contexts=["full_solution", "concise_to_detailed", "unrelated"], modes=["think:think"],
                        clip_taus=["none"], temperatures=[1.0])
    assert [[c.context for c in g] for g in probe_cells.launch_groups(styled)] == [["full_solution", "unrelated"],
                                                                             ["concise_to_detailed"]]
    assert len(probe_cells.launch_groups(probe_cells.grid(contexts=["full_solution"], modes=["think:think", "no_think:think"],
                                              clip_taus=["none"], temperatures=[1.0]))) == 2  # student modes differ


def test_a_cell_pays_its_own_steps_and_an_equal_share_of_the_rest_of_its_launch():
    launch = {"launch_dir": "a", "launch_s": 100.0, "launch_cells": 2}
    results = [{**launch, "step_times_s": [10.0, 20.0]}, {**launch, "step_times_s": [5.0, 5.0]},
               {"launch_dir": "b", "launch_s": 50.0, "launch_cells": 1, "step_times_s": [40.0]}]
    assert probe.launch_shares(results) == [30.0 + 30.0, 10.0 + 30.0, 50.0]  # 100 - 40 s outside the steps of a


def test_the_cells_override_composes_into_the_opsd_block_of_each_cell():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from recipe.opsd.core.config import OPSDConfig
    from recipe.probe.cell_configs import cell_configs, cell_temperatures

    cells = probe_cells.grid(contexts=["full_solution", "unrelated"], modes=["think:no_think"], clip_taus=["none", "0.05"],
                       temperatures=[1.1, 0.7])[:4]
    (override,) = OverridesParser.create().parse_overrides([probe_cells.cells_override(cells)])
    assert override.key_or_group == "probe.cells" and override.is_add()  # a block of the probe's own, added
    opsd = OPSDConfig.from_hydra({"student_mode": "think", "teacher_mode": "no_think"})
    got = [(c.teacher_context, c.teacher_mode, c.loss.clip_tau, c.loss.student_temperature)
           for c in cell_configs(opsd, override.value())]
    assert got == [("full_solution", "no_think", None, 1.1), ("full_solution", "no_think", None, 0.7),
                   ("full_solution", "no_think", 0.05, 1.1), ("full_solution", "no_think", 0.05, 0.7)]
    # each cell's rollout samples at its temperature
    assert cell_temperatures(override.value(), launch=1.0) == [1.1, 0.7, 1.1, 0.7]
    out = probe.probe_overrides(OmegaConf.create({"trainer": {"total_training_steps": 150}}), steps=4, batch=None, cells=4)
    assert {"trainer.total_training_steps=16", "opsd.diagnostics.monitor.early_end=2",
            "opsd.diagnostics.monitor.recent_window=2"} <= set(out)  # the monitor's windows are a cell's


def test_eos_probabilities_read_the_last_position_of_rollouts_that_ended_their_turn():
    # rollout 0 ended with eos (id 9) at position 2, rollout 1 hit the cap, rollout 2 ended with eos at position 0
    signals = {"rollout": torch.tensor([0, 0, 0, 1, 1, 2]), "position": torch.tensor([0, 1, 2, 0, 1, 0]),
               "sampled_id": torch.tensor([4, 5, 9, 4, 4, 9]),
               "student_logp": torch.tensor([0.0, 0.0, math.log(0.9), 0.0, 0.0, math.log(0.7)]),
               "teacher_logp": torch.tensor([0.0, 0.0, math.log(0.3), 0.0, 0.0, math.log(0.5)])}
    rollouts = [Rollout(0, [4, 5, 9], "stop"), Rollout(0, [4, 4], "length"), Rollout(1, [9], "stop")]
    out = probe.eos_probabilities(signals, rollouts, [9])
    assert out["eos_student"] == pytest.approx(0.8) and out["eos_teacher"] == pytest.approx(0.4)
    assert out["eos_ratio"] == pytest.approx(0.5) and out["eos_rollouts"] == 2
    assert probe.eos_probabilities(signals, [Rollout(0, [4], "length")] * 3, [9])["eos_ratio"] is None


def _cell(name, verdict):
    return {"name": name, "verdict": {"verdict": verdict, "basis": "observed", "reasons": [
        {"indicator": "on-policy reward z (late - early)", "value": 2.5, "threshold": "t (value 2)", "source": "s",
         "rule": "r"}]}, "indicators": {"reward_early": 0.1, "reward_late": 0.2, "reward_z": 2.5, "length_ratio": 1.0},
            "frozen": {"fwd_kl": 0.14, "eos_teacher": 0.4, "eos_student": 0.9}, "cost": {"cell_s": 40.0}}


def test_tables_show_indicators_and_reasons():
    text = report.table([_cell("a", "gain")])
    assert "| a | 0.14 |" in text and "0.40 / 0.90" in text and "10.0 -> 20.0 (+2.5)" in text and "**gain** (observed)" in text
    assert report.reasons_text([_cell("a", "gain")]) == "- a: gain because on-policy reward z (late - early) 2.5 [t (value 2)]"


def test_agreement_against_full_runs_uses_the_paired_bootstrap():
    scores = {f"p{i}": float(i % 2) for i in range(40)}  # 50% before
    better = {pid: 1.0 for pid in scores}
    same = dict(scores)
    behaviour = {"boxed_rate": 0.9, "eot_rate": 1.0, "repetitive_rate": 0.0, "sampled_length": None}
    runs = [{"name": "a", "seed": 1, "train_s": 400, "before": {"accuracy": 0.5, "mean_length": 20.0, **behaviour,
                                                                 "per_problem": scores},
             "after": {"accuracy": 1.0, "mean_length": 21.0, **behaviour, "per_problem": better}},
            {"name": "b", "seed": 1, "train_s": 400, "before": {"accuracy": 0.5, "mean_length": 20.0, **behaviour,
                                                                 "per_problem": scores},
             "after": {"accuracy": 0.5, "mean_length": 20.0, **behaviour, "per_problem": same}}]
    result = probe_validation.agreement({"cells": [_cell("a", "gain"), _cell("b", "gain")]}, runs)
    a, b = result["rows"]
    assert a["outcome"] == "gain" and a["agree"] and a["change"]["estimate"] == pytest.approx(0.5)
    assert b["outcome"] == "no measurable effect" and not b["agree"] and not b["compatible_agree"]
    assert (result["agree"], result["cells"]) == (1, 2)
    text = probe_validation.agreement_table(result)
    assert "| a | gain (observed) | 50.0 -> 100.0 | +50.0 [" in text and "40 / 400 (10%)" in text
    assert "agreement: 1 of 2 cells" in text


def _run(name, seed, after):
    return {"name": name, "seed": seed, "after": {"accuracy": sum(after.values()) / len(after), "per_problem": after}}


def test_a_cell_against_its_control_is_paired_by_seed_and_problem():
    ids = [f"p{i}" for i in range(20)]
    control = [_run("ctl", 1, {p: 0.0 for p in ids}), _run("ctl", 2, {p: float(i < 10) for i, p in enumerate(ids)})]
    # seed 1: 4 of 20 above the control; seed 2: the control's 10 plus 2 more; seed 3 has no control run
    cell = [_run("a", 1, {p: float(i < 4) for i, p in enumerate(ids)}),
            _run("a", 2, {p: float(i < 12) for i, p in enumerate(ids)}), _run("a", 3, {p: 1.0 for p in ids})]
    (row,) = probe_validation.versus_control(cell, control)
    assert row["seeds"] == [1, 2] and row["problems"] == 20 and row["control"] == "ctl"
    # hand computation: mean over problems of (seed-mean cell - seed-mean control) = ((4 + 12) - (0 + 10)) / 2 / 20
    assert row["difference"]["estimate"] == pytest.approx(0.15)
    assert row["difference"]["low"] <= 0.15 <= row["difference"]["high"]
    assert row["after"] == [0.2, 0.6] and row["control_after"] == [0.0, 0.5]
    text = probe_validation.control_table([row])
    assert "| a | ctl | 1, 2 | 20.0, 60.0 | 0.0, 50.0 | +15.0 [" in text
    # identical arms: a zero difference and a zero-width interval
    (same,) = probe_validation.versus_control([{**r, "name": "b"} for r in control], control)
    assert (same["difference"]["estimate"], same["difference"]["low"], same["difference"]["high"]) == (0.0, 0.0, 0.0)
    assert probe_validation.versus_control([_run("a", 7, {"p0": 1.0})], control) == []
    with pytest.raises(ValueError, match="one cell's; found"):
        probe_validation.versus_control(cell, [*control, _run("other", 1, {"p0": 0.0})])


def test_a_control_without_full_runs_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from recipe.common import cli

    monkeypatch.setattr(probe, "run_probe", lambda *a, **k: pytest.fail("no probe"))
    with pytest.raises(cli.InputError, match="needs --validate"):
        probe_cli.main(["--out-dir", str(tmp_path), "--control", str(tmp_path)])
    with pytest.raises(cli.InputError, match="has no full_runs.jsonl"):
        probe_cli.main(["--out-dir", str(tmp_path), "--validate", "--control", str(tmp_path / "ctl")])


def test_the_cli_refuses_few_steps_and_a_validation_without_a_demo(tmp_path, monkeypatch):
    from recipe.common import cli

    monkeypatch.setenv("DEVICE", "cpu")
    with pytest.raises(cli.InputError, match="--steps 3"):
        probe_cli.main(["--out-dir", str(tmp_path), "--steps", "3"])
    monkeypatch.setenv("MODEL_PATH", str(tmp_path))
    monkeypatch.setenv("TRAIN_FILES", str(tmp_path / "t.parquet"))
    monkeypatch.setattr(probe, "run_probe", lambda *a, **k: pytest.fail("no probe"))
    monkeypatch.setattr("recipe.launch.config.Settings.demo", property(lambda self: None))
    with pytest.raises(cli.InputError, match="--validate evaluates held-out problems"):
        probe_cli.main(["--out-dir", str(tmp_path), "--validate"])


def test_an_explicit_cell_list_replaces_the_grid():
    assert probe_cli._cell("full_solution,native:native,none,0.7").name == "full_solution, native:native, tau=none, T=0.7"
    cell = probe_cli._cell("unrelated,native:native,0.05,1.1,beta=1,lr=3e-5")
    assert (cell.clip_tau, cell.beta, cell.lr) == (0.05, 1.0, 3e-5)
    assert cell.name == "unrelated, native:native, tau=0.05, T=1.1, beta=1, lr=3e-05"
    from recipe.common import cli

    for bad in ("full_solution,none", "full_solution,native:native,none,0.7,gamma=1", "full_solution,native:native,none,0.7,beta",
                "full_solution,native,none,0.7", "full_solution,native:native,none,hot", "full_solution,native:native,0.05,1.1,lr=x"):
        with pytest.raises(cli.InputError, match=r"CONTEXT,STUDENT:TEACHER,TAU,T\[,beta=B\]"):
            probe_cli._cell(bad)


def test_frozen_signals_of_a_tiny_model(tmp_path):
    """The frozen pass on the tiny random model and data: one sampling per (student mode, temperature), every cell
    summarised, the clip diagnostics only for a clipped cell, the KL's decay over relative positions."""
    from recipe.models.tiny import build_tiny_model
    from recipe.toy.demo import write_tiny_data

    model = build_tiny_model(tmp_path / "model", seed=0)
    data = write_tiny_data(tmp_path / "data")
    cells = probe_cells.grid(contexts=["full_solution", "unrelated"], modes=["no_think:no_think"], clip_taus=["none", "0.05"],
                       temperatures=[1.0])
    out = probe.frozen_signals(str(model), str(data["train"]), cells, cap=16, top_p=1.0, top_k=-1, num_prompts=4,
                               log=lambda *_: None)
    assert set(out) == {c.name for c in cells}
    clipped, unclipped = out[cells[1].name], out[cells[0].name]
    assert unclipped["fwd_kl"] == clipped["fwd_kl"] > 0 and unclipped["clipped_teacher_mass"] == 0.0
    assert clipped["clipped_teacher_mass"] >= 0.0 and clipped["rollouts"] == 8
    assert unclipped["kl_decay"] is None or unclipped["kl_decay"] >= 0
    assert out[cells[2].name]["fwd_kl"] != unclipped["fwd_kl"]  # another teacher context, the same rollouts
    # the same student samples graded once; each teacher context samples its own
    assert {out[c.name]["student_acc"] for c in cells} == {unclipped["student_acc"]}
    assert all(0.0 <= out[c.name]["teacher_acc"] <= 1.0 and out[c.name]["teacher_lift_z"] is not None for c in cells)
    assert unclipped["clip_reversal"] == 0.0 and 0.0 <= unclipped["decisive"] <= 100.0
    assert math.isnan(clipped["clip_reversal"]) or 0.0 <= clipped["clip_reversal"] <= 100.0
