"""A relaunch on a checkpoint directory (recipe.launch.resume): a finished run is not trained again,
a save of another config is not resumed, and the step count, the logger, the paths and a
continuation preset may change."""

from __future__ import annotations

import os
import shutil

import pytest

from recipe.launch import __main__ as launcher
from recipe.launch.config import Settings, get_recipe
from recipe.launch.resume import ConfigChangedError, config_changes, continuation_keys, reference_config
from recipe.launch.run import plan

OPSD, GRPO, SFT = get_recipe("opsd"), get_recipe("grpo"), get_recipe("sft")


SAVE = None  # tests/launch/conftest.py fake_save


@pytest.fixture(autouse=True)
def _save(make_save):
    global SAVE
    SAVE = make_save


def launched(recipe, inputs, ckpt, argv=(), *, steps: int, saved: int, **settings):
    """Plan a launch into ``ckpt``, write its launch_config as execute() does, then a save of step ``saved``."""
    launch = relaunch(recipe, inputs, ckpt, argv, steps=steps, **settings)
    ckpt.mkdir(parents=True, exist_ok=True)
    launch.config_path.write_text(launch.resolved_yaml())
    SAVE(ckpt, saved, inputs.model, sft=recipe is SFT)
    return launch


def relaunch(recipe, inputs, ckpt, argv=(), *, steps: int, **settings):
    settings.setdefault("model_path", str(inputs.model))
    settings.setdefault("train_files", str(inputs.sft if recipe is SFT else inputs.train))
    return plan(recipe, Settings(device="gpu", ckpt_dir=str(ckpt), steps=steps, **settings), list(argv),
                environ=inputs.env, detect_gpus=lambda: 1)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [OPSD, GRPO, SFT], ids=lambda r: r.name)
def test_a_finished_run_is_said_and_a_raised_step_count_continues_it(recipe, launch_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    launched(recipe, launch_inputs, ckpt, steps=2, saved=2)
    again = relaunch(recipe, launch_inputs, ckpt, steps=2)
    assert again.finished == (
        f"[launch] {ckpt} holds a finished run: its save global_step_2 is step 2 of trainer.total_training_steps=2; "
        "nothing to train (raise STEPS or trainer.total_training_steps to continue it, or set CKPT_DIR to another "
        "directory for a new run)")
    assert "holds a finished run" in again.describe()  # a dry run shows it too
    more = relaunch(recipe, launch_inputs, ckpt, steps=3)
    assert more.finished is None and more.checked.resume_dir == ckpt / "global_step_2"


@pytest.mark.slow
def test_the_launcher_exits_0_without_training_a_finished_run(launch_inputs, tmp_path, monkeypatch, capsys):
    ckpt = tmp_path / "ckpt"
    launched(GRPO, launch_inputs, ckpt, steps=2, saved=2)
    for key, value in {**launch_inputs.env, "DEVICE": "gpu", "MODEL_PATH": str(launch_inputs.model),
                       "TRAIN_FILES": str(launch_inputs.train), "CKPT_DIR": str(ckpt), "STEPS": "2", "NGPUS": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(launcher, "execute_with_actions", lambda launch, **_: pytest.fail("a finished run was launched"))
    assert launcher.main(["grpo"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [relaunch(GRPO, launch_inputs, ckpt, steps=2).finished]


@pytest.mark.slow
def test_another_config_is_refused_one_line_per_key(launch_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = launched(OPSD, launch_inputs, ckpt, steps=4, saved=2)
    with pytest.raises(ConfigChangedError) as caught:
        relaunch(OPSD, launch_inputs, ckpt, ["actor_rollout_ref.actor.optim.lr=3e-6", "opsd.loss.clip_tau=0.2"], steps=4)
    lines = caught.value.line.splitlines()
    assert lines[0] == (f"error: {ckpt / 'global_step_2'}: saved by a launch with another config "
                        f"({first.config_path}); this launch differs in 2 setting(s) (to start a new run set CKPT_DIR "
                        f"to another directory (or remove {ckpt}); to resume this save with the new values anyway set "
                        "RESUME_WITH_CHANGES=1)")
    assert lines[1:] == ["  actor_rollout_ref.actor.optim.lr: 1e-06 -> 3e-06 (saved -> now)",
                         "  opsd.loss.clip_tau: 0.05 -> 0.2 (saved -> now)"]
    anyway = relaunch(OPSD, launch_inputs, ckpt, ["actor_rollout_ref.actor.optim.lr=3e-6", "opsd.loss.clip_tau=0.2"],
                      steps=4, resume_with_changes=True)
    assert ("resuming " + str(ckpt / "global_step_2") + " with 2 setting(s) changed from launch_config.yaml "
            "(RESUME_WITH_CHANGES=1): actor_rollout_ref.actor.optim.lr, opsd.loss.clip_tau") in anyway.notes


@pytest.mark.slow
def test_step_count_logger_cadence_retention_and_paths_may_change(launch_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    launched(GRPO, launch_inputs, ckpt, steps=2, saved=2)
    moved = tmp_path / "moved" / "train.parquet"
    moved.parent.mkdir()
    shutil.copy(launch_inputs.train, moved)
    launch = relaunch(GRPO, launch_inputs, ckpt, ["trainer.logger=[console]", "trainer.experiment_name=other",
                                                  "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=1"],
                      steps=5, train_files=str(moved))
    assert launch.finished is None and launch.checked.resume_dir == ckpt / "global_step_2"


@pytest.mark.slow
def test_the_reference_is_the_config_of_the_launch_that_wrote_the_save(launch_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = launched(GRPO, launch_inputs, ckpt, steps=4, saved=2)
    # a later launch with another lr (resumed anyway) that failed before saving: step 2 is still the first's
    later = relaunch(GRPO, launch_inputs, ckpt, ["actor_rollout_ref.actor.optim.lr=3e-6"], steps=4,
                     resume_with_changes=True)
    later.config_path.write_text(later.resolved_yaml())
    saved = (ckpt / "global_step_2" / "data.pt").stat().st_mtime_ns
    os.utime(later.config_path, ns=(saved + 10**9, saved + 10**9))
    assert reference_config(ckpt / "global_step_2") == first.config_path
    assert relaunch(GRPO, launch_inputs, ckpt, steps=4).finished is None  # the first's config: no change
    # ... once it saved step 3, that save is compared with its config
    SAVE(ckpt, 3, launch_inputs.model)
    os.utime(ckpt / "global_step_3" / "data.pt", ns=(saved + 2 * 10**9, saved + 2 * 10**9))
    assert reference_config(ckpt / "global_step_3") == later.config_path
    with pytest.raises(ConfigChangedError) as changed:
        relaunch(GRPO, launch_inputs, ckpt, steps=4)
    assert "optim.lr: 3e-06 -> 5e-07" in changed.value.line


def test_a_save_without_a_launch_config_is_resumed_with_a_note(launch_inputs, tmp_path, make_save):
    ckpt = tmp_path / "ckpt"
    make_save(ckpt, 2, launch_inputs.model)
    launch = relaunch(GRPO, launch_inputs, ckpt, ["actor_rollout_ref.actor.optim.lr=3e-6"], steps=4)
    assert any("no launch_config*.yaml of the launch that wrote it" in note for note in launch.notes)


def test_a_continuation_preset_may_change_what_it_sets():
    keys = continuation_keys(OPSD, ["+model=qwen3_1p7b", "+experiment=steps_300_continued"])
    assert {"trainer.save_freq", "trainer.resume_mode", "trainer.resume_from_path", "sweep.eval_every"} <= keys
    assert continuation_keys(OPSD, ["+experiment=clip_tau_0p2"]) == set()  # not a continuation preset
    reference = {"trainer": {"save_freq": 25, "total_training_steps": 100}, "opsd": {"loss": {"clip_tau": 0.05}}}
    current = {"trainer": {"save_freq": 50, "total_training_steps": 300}, "opsd": {"loss": {"clip_tau": 0.2}}}
    assert config_changes(reference, current, allowed=keys) == [("opsd.loss.clip_tau", 0.05, 0.2)]
    assert config_changes({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == [("a.c", "(not set)", 2)]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [GRPO, SFT], ids=lambda r: r.name)
def test_verl_is_told_the_last_whole_save_when_the_tracker_names_a_broken_one(recipe, launch_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    launched(recipe, launch_inputs, ckpt, steps=4, saved=2)
    SAVE(ckpt, 3, launch_inputs.model, sft=recipe is SFT, data=False)  # tracker 3, the save without its data state
    launch = relaunch(recipe, launch_inputs, ckpt, steps=4)
    assert launch.checked.resume_dir == ckpt / "global_step_2"
    assert any(note.startswith(f"not resuming from {ckpt / 'global_step_3'}: no data.pt") for note in launch.notes)
    trainer = launch.config.trainer  # verl would load the tracker's save (auto): the launcher names the whole one
    assert (trainer.resume_mode, trainer.resume_from_path) == ("resume_path", str(ckpt / "global_step_2"))
    assert relaunch(recipe, launch_inputs, tmp_path / "fresh", steps=4).config.trainer.resume_mode == "auto"
