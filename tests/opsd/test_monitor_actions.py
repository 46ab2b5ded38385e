"""Collapse-monitor actions (recipe.opsd.core.monitor): stop / rollback per warning, the rollback's target,
the action log, and the trainer's call sites (log a request, scale the learning rate on resume)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from recipe.opsd.core.monitor import (
    ACTIONS_FILE,
    MonitorAction,
    MonitorConfig,
    TrainingDynamicsMonitor,
    learning_rate_scale,
    read_actions,
    rollback_target,
    rollbacks_done,
)


def rows(steps=40, collapse_from=21):
    """Entropy and grad norm flat, then both x3 from ``collapse_from``."""
    return [{"step": s, "opsd/student_entropy": 0.4 if s < collapse_from else 1.2,
             "actor/grad_norm": 0.3 if s < collapse_from else 0.9} for s in range(1, steps + 1)]


def run(config, rows_, *, rollbacks=0):
    monitor = TrainingDynamicsMonitor(config)
    monitor.rollbacks = rollbacks
    outs = []
    for row in rows_:
        outs.append(monitor.update(row))
        if monitor.should_stop:
            break
    return monitor, outs


def test_a_rollback_warning_asks_for_a_rollback_before_its_window():
    config = MonitorConfig(rollback_on=("collapse",), rollback_setting="lr_scale", rollback_value=0.5, max_rollbacks=2)
    monitor, outs = run(config, rows())
    action = monitor.action
    # the first step whose last 10 steps average >= 1.5x the early mean (both signals rise together)
    ratios = [(sum(1.2 if s >= 21 else 0.4 for s in range(t - 9, t + 1)) / 10) / 0.4 for t in range(20, 41)]
    first = 20 + next(i for i, r in enumerate(ratios) if r >= 1.5)
    assert action.step == first and action.kind == "rollback" and action.signature == "collapse"
    assert action.window == (first - 9, first) and action.rollback == 1
    assert (action.setting, action.value) == ("lr_scale", 0.5)
    assert monitor.should_stop
    assert outs[-1]["opsd_monitor/action_rollback"] == 1.0 and outs[-1]["opsd_monitor/action_stop"] == 0.0
    assert outs[-1]["opsd_monitor/rollbacks"] == 1.0
    assert all(o["opsd_monitor/action_rollback"] == 0.0 for o in outs[:-1])
    # the line names the rollback, the window and the change
    assert "rollback 1 (collapse warning over steps" in action.line() and "learning rate x0.5" in action.line()


def test_after_max_rollbacks_the_same_warning_stops_and_stop_on_stops():
    config = MonitorConfig(rollback_on=("collapse",), max_rollbacks=1)
    monitor, outs = run(config, rows(), rollbacks=1)
    assert monitor.action.kind == "stop" and "after 1 rollback(s)" in monitor.action.reason
    assert outs[-1]["opsd_monitor/action_stop"] == 1.0 and outs[-1]["opsd_monitor/rollbacks"] == 1.0
    monitor, _ = run(MonitorConfig(stop_on=("collapse",)), rows())
    assert monitor.action.kind == "stop" and "stop_on" in monitor.action.reason
    monitor, outs = run(MonitorConfig(), rows())  # a warning without an action: no action, the run goes on
    assert monitor.action is None and not monitor.should_stop and len(outs) == 40


def test_the_target_is_the_newest_save_before_the_window():
    assert rollback_target([10, 20, 30], window_start=21) == 20
    assert rollback_target([10, 20, 30], window_start=20) == 10
    assert rollback_target([30], window_start=21) == 0  # none before: the initial model
    assert rollback_target([], window_start=5) == 0


def test_learning_rate_scale_and_the_log(tmp_path):
    config = MonitorConfig(rollback_on=("boxed",), rollback_value=0.3)
    assert [learning_rate_scale(config, k) for k in range(3)] == pytest.approx([1.0, 0.3, 0.09])
    assert learning_rate_scale(MonitorConfig(rollback_setting="clip_tau", rollback_value=0.2), 2) == 1.0
    action = MonitorAction(step=30, kind="rollback", signature="boxed", window=(21, 30), reason="r",
                           setting="lr_scale", value=0.3, rollback=1)
    assert MonitorAction.from_record(action.record()) == action
    from recipe.opsd.core.monitor import append_action

    append_action(str(tmp_path), action)
    append_action(str(tmp_path), MonitorAction(step=35, kind="stop", signature="boxed", window=(26, 35), reason="s"))
    records = read_actions(str(tmp_path))
    assert [r["action"] for r in records] == ["rollback", "stop"] and rollbacks_done(records) == 1
    assert read_actions(str(tmp_path / "none")) == []


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(rollback_on=("explode",)), "rollback_on has unknown"),
    (dict(rollback_on="collapse"), "rollback_on must be a list"),
    (dict(rollback_on=("collapse",), stop_on=("collapse",)), "both stop_on and rollback_on"),
    (dict(rollback_setting="temperature"), "rollback_setting must be one of"),
    (dict(rollback_value=0.0), "rollback_value must be a number > 0"),
    (dict(rollback_value=None), "rollback_value must be a number > 0 with rollback_setting=lr_scale"),
    (dict(max_rollbacks=-1), "max_rollbacks must be an int >= 0"),
])
def test_action_settings_are_validated_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MonitorConfig(**kwargs)
    assert MonitorConfig(rollback_setting="clip_tau", rollback_value=None).rollback_value is None  # no clip: allowed


def _trainer(tmp_path, config, lr_scale=1.0):
    from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer

    monitor = TrainingDynamicsMonitor(config)
    monitor.lr_scale = lr_scale
    calls = []
    worker_group = SimpleNamespace(world_size=2, execute_with_func_generator=lambda fn, data: calls.append((fn, data)))
    trainer = SimpleNamespace(monitor=monitor, actor_rollout_wg=worker_group, global_steps=20, step_offset=0,
                              opsd=SimpleNamespace(diagnostics=SimpleNamespace(monitor=config)),
                              config=SimpleNamespace(trainer=SimpleNamespace(save_freq=10, default_local_dir=str(tmp_path))))
    trainer._record_monitor_action = lambda action: RayOPSDTrainer._record_monitor_action(trainer, action)
    return RayOPSDTrainer, trainer, calls


def test_the_trainer_logs_the_request_and_prints_it(tmp_path, capsys):
    config = MonitorConfig(rollback_on=("collapse",))
    cls, trainer, _ = _trainer(tmp_path, config)
    stopped = []
    for row in rows():
        trainer.global_steps = row["step"]
        stopped.append(cls._update_monitor(trainer, dict(row)))
        if stopped[-1]:
            break
    assert stopped[-1] and not any(stopped[:-1])
    records = read_actions(str(tmp_path))
    assert len(records) == 1 and records[0]["action"] == "rollback" and records[0]["step"] == trainer.global_steps
    assert (tmp_path / ACTIONS_FILE).is_file()
    out = capsys.readouterr().out
    assert f"[opsd] collapse monitor action at step {trainer.global_steps}: rollback 1" in out


def test_on_resume_the_trainer_scales_the_learning_rate_to_the_rollbacks(tmp_path, capsys):
    from recipe.opsd.core.monitor import append_action
    from recipe.opsd.opsd_step import _scale_learning_rate

    config = MonitorConfig(rollback_on=("collapse",), rollback_value=0.5, max_rollbacks=3)
    for k in (1, 2):
        append_action(str(tmp_path), MonitorAction(step=30, kind="rollback", signature="collapse", window=(21, 30),
                                                   reason="r", setting="lr_scale", value=0.5, rollback=k))
    # the restored save was written after the first rollback (its optimizer runs at x0.5): one more x0.5
    cls, trainer, calls = _trainer(tmp_path, config, lr_scale=0.5)
    cls._resume_monitor_actions(trainer)
    assert trainer.monitor.rollbacks == 2 and trainer.monitor.lr_scale == 0.25
    (fn, data), = calls
    assert fn is _scale_learning_rate and data.meta_info["factor"] == 0.5 and len(data) == 2
    assert "learning rate x0.5 from step 21 (rollback 2: x0.25 of the configured schedule)" in capsys.readouterr().out
    # what the function does on a worker: a cosine schedule with warmup keeps its shape at half the rate
    from transformers import get_cosine_schedule_with_warmup

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=10)
    reference = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ref_scheduler = get_cosine_schedule_with_warmup(reference, num_warmup_steps=2, num_training_steps=10)
    for _ in range(4):
        optimizer.step(), scheduler.step(), reference.step(), ref_scheduler.step()
    worker = SimpleNamespace(actor=SimpleNamespace(engine=SimpleNamespace(optimizer=optimizer, lr_scheduler=scheduler)))
    _scale_learning_rate(worker, data)
    for _ in range(3):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * reference.param_groups[0]["lr"], rel=1e-12)
        optimizer.step(), scheduler.step(), reference.step(), ref_scheduler.step()
    # nothing to do when the restored optimizer already runs at the rollbacks' rate
    cls, trainer, calls = _trainer(tmp_path, config, lr_scale=0.25)
    cls._resume_monitor_actions(trainer)
    assert calls == [] and trainer.monitor.lr_scale == 0.25


def test_a_relaunch_of_a_finished_run_trains_nothing(capsys):
    """verl's fit increments the step before comparing it with the total: resumed at the last step, the trainer
    itself stops before any rollout (the launcher says so earlier; the sweep runner starts the trainer directly)."""
    from recipe.opsd.opsd_step import OPSDStepMixin

    finished = SimpleNamespace(global_steps=100, total_training_steps=100)
    assert OPSDStepMixin._finished_run(finished)
    assert "[opsd] step 100 is trainer.total_training_steps=100: the run is finished" in capsys.readouterr().out
    assert not OPSDStepMixin._finished_run(SimpleNamespace(global_steps=99, total_training_steps=100))
