"""Collapse monitor: fires on the paper's joint entropy + grad-norm rise, quiet otherwise."""

import logging

import pytest

from recipe.opsd.core.monitor import (
    MonitorConfig,
    TrainingCollapseError,
    TrainingDynamicsMonitor,
    replay,
    window_table,
)


def trace(steps=60, *, entropy=lambda s: 0.4, grad=lambda s: 0.35, length=lambda s: 500.0,
          clip=lambda s: 0.1, boxed=lambda s: 0.8):
    return [
        {
            "step": s,
            "opsd/student_entropy": entropy(s),
            "actor/grad_norm": grad(s),
            "opsd/fwd_kl": 0.05,
            "opsd/loss": -0.001,
            "response_length/mean": length(s),
            "response_length/clip_ratio": clip(s),
            "opsd/rollout_boxed_rate": boxed(s),
        }
        for s in range(1, steps + 1)
    ]


def rising(start, end, steps=60):
    return lambda s: start + (end - start) * (s - 1) / (steps - 1)


def test_fires_on_joint_entropy_and_grad_norm_rise(caplog):
    monitor = TrainingDynamicsMonitor(MonitorConfig())
    rows = trace(entropy=rising(0.41, 1.29), grad=rising(0.35, 0.86))
    with caplog.at_level(logging.WARNING, logger="recipe.opsd.core.monitor"):
        outs = [monitor.update(r) for r in rows]
    collapse = [e for e in monitor.events if e.signature == "collapse"]
    assert collapse, "no collapse warning on a rising entropy + grad-norm trace"
    first = collapse[0]
    # Hand check of the first firing step: early means (steps 1-10) vs the last 10 steps.
    early_ent = sum(rising(0.41, 1.29)(s) for s in range(1, 11)) / 10
    early_grad = sum(rising(0.35, 0.86)(s) for s in range(1, 11)) / 10
    for step in range(20, 61):
        ent = sum(rising(0.41, 1.29)(s) for s in range(step - 9, step + 1)) / 10 / early_ent
        grad = sum(rising(0.35, 0.86)(s) for s in range(step - 9, step + 1)) / 10 / early_grad
        if ent >= 1.5 and grad >= 1.5:
            expected_step = step
            break
    assert first.step == expected_step
    out = outs[expected_step - 1]
    assert out["opsd_monitor/collapse_warning"] == 1.0
    assert out["opsd_monitor/entropy_ratio"] == pytest.approx(
        sum(rising(0.41, 1.29)(s) for s in range(expected_step - 9, expected_step + 1)) / 10 / early_ent
    )
    assert "student entropy" in caplog.text and "grad norm" in caplog.text and "opsd/student_entropy" in caplog.text
    # Not re-logged every step while it persists: every warn_every (10) steps.
    assert [e.step for e in collapse] == list(range(expected_step, 61, 10))
    assert not monitor.should_stop  # stop_on is empty by default


def test_quiet_on_flat_trace_and_on_entropy_rising_alone(caplog):
    with caplog.at_level(logging.WARNING, logger="recipe.opsd.core.monitor"):
        flat = replay(trace())
        entropy_only = replay(trace(entropy=rising(0.41, 1.29), grad=rising(0.39, 0.18)))
        grad_only = replay(trace(grad=rising(0.35, 0.86)))
    assert flat.events == [] and entropy_only.events == [] and grad_only.events == []
    assert caplog.text == ""


def test_no_judgement_before_recent_window_is_full():
    monitor = TrainingDynamicsMonitor(MonitorConfig(early_end=10, recent_window=10))
    rows = trace(steps=19, entropy=lambda s: 0.4 if s <= 10 else 4.0, grad=lambda s: 0.3 if s <= 10 else 3.0)
    outs = [monitor.update(r) for r in rows]
    assert monitor.events == []
    assert "opsd_monitor/entropy_ratio" not in outs[-1]
    monitor.update(trace(steps=20, entropy=lambda s: 4.0, grad=lambda s: 3.0)[-1])
    assert [e.signature for e in monitor.events] == ["collapse"]


def test_length_blowup_by_mean_and_by_cap_fraction():
    by_mean = replay(trace(length=lambda s: 400.0 if s <= 10 else 700.0))
    assert [e.signature for e in by_mean.events][:1] == ["length"]
    assert "response_length/mean" in by_mean.events[0].message
    by_cap = replay(trace(clip=lambda s: 0.6 if s <= 10 else 0.9))
    assert by_cap.events and by_cap.events[0].signature == "length"
    assert "length cap" in by_cap.events[0].message
    # Already at the cap from step 1 (thinking model, short cap): not a blow-up.
    assert replay(trace(clip=lambda s: 0.95)).events == []


def test_boxed_rate_collapse_and_guard():
    monitor = replay(trace(boxed=lambda s: 0.8 if s <= 10 else 0.3))
    assert monitor.events and monitor.events[0].signature == "boxed"
    # Early boxed rate below min_early_boxed_rate: ratio meaningless, no check.
    assert replay(trace(boxed=lambda s: 0.02 if s <= 10 else 0.0)).events == []


def test_stop_flag_and_exception():
    rows = trace(entropy=lambda s: 0.4 if s <= 10 else 1.2, grad=lambda s: 0.3 if s <= 10 else 0.9)
    monitor = replay(rows, config=MonitorConfig(stop_on=("collapse",)))
    assert monitor.should_stop and "collapse" in monitor.stop_reason
    strict = TrainingDynamicsMonitor(MonitorConfig(stop_on=["collapse"], raise_on_stop=True))
    with pytest.raises(TrainingCollapseError, match="entropy"):
        for row in rows:
            strict.update(row)
    assert strict.history[-1]["step"] == 20


def test_state_dict_round_trip_continues_monitoring():
    rows = trace(entropy=lambda s: 0.4 if s <= 10 else 1.2, grad=lambda s: 0.3 if s <= 10 else 0.9)
    first = TrainingDynamicsMonitor()
    for row in rows[:15]:
        first.update(row)
    resumed = TrainingDynamicsMonitor()
    resumed.load_state_dict(first.state_dict())
    for row in rows[15:]:
        resumed.update(row)
    assert [e.step for e in resumed.events] == [e.step for e in replay(rows).events]


def test_bad_steps_and_configs():
    monitor = TrainingDynamicsMonitor()
    with pytest.raises(ValueError, match="step"):
        monitor.update({"actor/grad_norm": 1.0})
    monitor.update({"step": 3})
    with pytest.raises(ValueError, match="not after"):
        monitor.update({"step": 3})
    with pytest.raises(ValueError, match="stop_on"):
        MonitorConfig(stop_on=("explode",))
    with pytest.raises(ValueError, match="stop_on"):
        MonitorConfig(stop_on="collapse")
    with pytest.raises(ValueError, match="entropy_ratio_threshold"):
        MonitorConfig(entropy_ratio_threshold=0.9)
    with pytest.raises(ValueError, match="early_end"):
        MonitorConfig(early_start=5, early_end=2)
    with pytest.raises(ValueError, match="metric_keys"):
        MonitorConfig(metric_keys={"entropyy": "actor/entropy"})
    assert TrainingDynamicsMonitor(MonitorConfig(enabled=False)).update({"step": 1}) == {}


def test_metric_key_override_monitors_a_grpo_run():
    rows = [
        {"step": s, "actor/entropy": 0.4 if s <= 10 else 1.2, "actor/grad_norm": 0.3 if s <= 10 else 0.9}
        for s in range(1, 31)
    ]
    assert replay(rows).events == []
    assert replay(rows, config=MonitorConfig(metric_keys={"entropy": "actor/entropy"})).events


def test_window_table_matches_hand_means():
    rows = [{"step": s, "opsd/student_entropy": float(s), "opsd/fwd_kl": 0.1, "actor/grad_norm": 2.0,
             "opsd/loss": -0.01} for s in range(1, 101)]
    table = window_table({"run": rows})
    lines = table.splitlines()
    assert lines[0] == "| Run | Steps | H_S | D_KL(T||S) | ||grad|| | Loss |"
    assert lines[2] == "| run | 1-10 (n=10) | 5.5 | 0.1 | 2 | -0.01 |"
    assert lines[3] == "| run | 91-100 (n=10) | 95.5 | 0.1 | 2 | -0.01 |"
    assert "| - |" in window_table({"short": rows[:5]}).splitlines()[3]


def test_config_from_hydra_yaml_containers():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"enabled": True, "stop_on": ["collapse", "boxed"], "entropy_ratio_threshold": 2,
                            "metric_keys": {"entropy": "actor/entropy"}})
    config = MonitorConfig(**cfg)
    assert config.stop_on == ("collapse", "boxed")
    assert config.key("entropy") == "actor/entropy" and config.key("grad_norm") == "actor/grad_norm"


def test_the_trainer_prints_each_new_warning_as_an_opsd_console_line(capsys):
    """``RayOPSDTrainer._update_monitor`` (the glue): every warning the step adds is printed once as an
    ``[opsd]`` line, the prefix the launcher's condensed console output shows (a demo run shows it live)."""
    from types import SimpleNamespace

    from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer

    trainer = SimpleNamespace(monitor=TrainingDynamicsMonitor(MonitorConfig(early_end=3, recent_window=3)),
                              config=SimpleNamespace(trainer=SimpleNamespace(save_freq=0)), global_steps=0, step_offset=0)
    printed = []
    for row in trace(16, length=lambda s: 40.0 if s <= 3 else 90.0):
        trainer.global_steps = row.pop("step")
        assert RayOPSDTrainer._update_monitor(trainer, dict(row)) is False
        printed += [line for line in capsys.readouterr().out.splitlines() if line.startswith("[opsd] collapse monitor")]
    assert printed[0].startswith("[opsd] collapse monitor (length): rollout length blow-up at step 6:")
    assert len(printed) == len(trainer.monitor.events) >= 1
