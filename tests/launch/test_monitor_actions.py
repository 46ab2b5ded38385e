"""The launcher's side of the collapse monitor's actions (recipe.launch.monitor_actions):
a stop's exit code, a rollback's relaunch from the last whole save before the warning window with its change,
the abandoned saves moved aside; training itself is replaced by a fake ``execute`` that writes what a trainer would."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipe.common import cli
from recipe.launch import monitor_actions
from recipe.opsd.core.monitor import ACTIONS_FILE, STOPPED_EXIT_CODE, MonitorAction, append_action


@pytest.fixture()
def saves(monkeypatch):
    """A save is whole when its directory holds ``data.pt`` (the real check reads FSDP shards)."""
    def resumable(folder):
        if not (Path(folder) / "data.pt").is_file():
            raise cli.InputError("no data.pt", file=folder)
        return Path(folder)

    monkeypatch.setattr(monitor_actions, "check_resumable", resumable)

    def make(root: Path, *steps: int, whole=True):
        for step in steps:
            folder = root / f"global_step_{step}"
            folder.mkdir(parents=True, exist_ok=True)
            if whole:
                (folder / "data.pt").write_text("x")
        (root / monitor_actions.TRACKER).write_text(str(max(steps)))
    return make


def _launch(ckpt: Path, overrides=()):
    config = SimpleNamespace(trainer={"resume_mode": "auto", "resume_from_path": None})
    return SimpleNamespace(ckpt_dir=ckpt, config=config, overrides=list(overrides),
                           env={"VERL_FILE_LOGGER_PATH": str(ckpt / "metrics.jsonl")})


def _rollback(step, window, *, k=1, setting="lr_scale", value=0.5):
    return MonitorAction(step=step, kind="rollback", signature="collapse", window=window, reason="r", setting=setting,
                         value=value, rollback=k)


def test_a_rollback_relaunches_from_the_last_whole_save_before_the_window_then_a_stop_exits_4(tmp_path, saves,
                                                                                              monkeypatch, capsys):
    ckpt = tmp_path / "run"
    script = [  # what each launch "trains": its saves and its monitor request
        lambda: (saves(ckpt, 10, 20, 30), saves(ckpt, 25, whole=False),
                 append_action(str(ckpt), _rollback(30, (21, 30), setting="clip_tau", value=0.2))),
        lambda: (saves(ckpt, 20, 30, 40),
                 append_action(str(ckpt), MonitorAction(step=40, kind="stop", signature="collapse", window=(31, 40),
                                                        reason="after 1 rollback(s)"))),
    ]
    launches = []

    def fake_execute(launch, **_):
        launches.append(launch)
        Path(launch.env["VERL_FILE_LOGGER_PATH"]).parent.mkdir(parents=True, exist_ok=True)
        Path(launch.env["VERL_FILE_LOGGER_PATH"]).write_text("{}")
        script[len(launches) - 1]()
        return {"exit_code": 0}

    monkeypatch.setattr(monitor_actions, "execute", fake_execute)
    replans = []
    record = monitor_actions.execute_with_actions(_launch(ckpt), replan=lambda extra: replans.append(extra) or _launch(ckpt, extra))
    assert record["exit_code"] == STOPPED_EXIT_CODE == 4
    assert [a["action"] for a in record["monitor_actions"]] == ["rollback", "stop"]
    # the relaunch: resume from step 20 (30 is in the window, 25 is not whole), clip tau changed
    assert replans == [["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt.absolute() / 'global_step_20'}",
                        "opsd.loss.clip_tau=0.2"]]
    # the saves after 20 were moved aside before the relaunch; verl's tracker names 20
    assert (ckpt / "rolled_back" / "rollback_1" / "global_step_30").is_dir()
    assert (ckpt / "rolled_back" / "rollback_1" / "global_step_25").is_dir()
    out = capsys.readouterr().out
    assert "[launch] monitor rollback 1 at step 30 (collapse warning over steps 21-30): relaunching from step 20 with " \
           "opsd.loss.clip_tau=0.2" in out
    assert "[launch] monitor stop at step 40: after 1 rollback(s)" in out and "exit code 4" in out
    assert monitor_actions.rollback_changes(ckpt) == {"opsd.loss.clip_tau"}
    # the relaunch logs to a new metrics file (verl's file logger truncates the one it is given)
    assert [Path(la.env["VERL_FILE_LOGGER_PATH"]).name for la in launches] == ["metrics.jsonl", "metrics.1.jsonl"]


def test_no_save_before_the_window_restarts_from_the_initial_model(tmp_path, saves):
    ckpt = tmp_path / "run"
    saves(ckpt, 30)
    target, overrides = monitor_actions.relaunch_overrides(_rollback(30, (21, 30)), ckpt_dir=ckpt)
    assert (target, overrides) == (0, ["trainer.resume_mode=disable"])  # lr_scale: applied by the trainer
    monitor_actions.set_aside(ckpt, after_step=0, rollback=1)
    assert not (ckpt / monitor_actions.TRACKER).exists() and not list(ckpt.glob("global_step_*"))


def test_a_fresh_launch_moves_an_earlier_runs_action_log_aside_and_a_failed_launch_is_returned(tmp_path, monkeypatch):
    ckpt = tmp_path / "run"
    append_action(str(ckpt), _rollback(30, (21, 30)))
    monkeypatch.setattr(monitor_actions, "execute", lambda launch, **_: {"exit_code": 1})
    monkeypatch.setattr(monitor_actions, "choose_resume_dir", lambda **_: (None, None))
    record = monitor_actions.execute_with_actions(_launch(ckpt), replan=lambda extra: pytest.fail("no relaunch"))
    assert record["exit_code"] == 1 and record["monitor_actions"] == []
    assert not (ckpt / ACTIONS_FILE).exists()
    assert [json.loads(line)["action"] for line in (ckpt / "monitor_actions.1.jsonl").read_text().splitlines()] == ["rollback"]
