"""Disk use of a launch (recipe.launch.disk): the size of one save and the free space in every launch's
header, a refusal when one save cannot fit, retention across launches, a full disk after the fact,
the CPU demos' run directories."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import safe_open

from recipe.common import cli
from recipe.launch import disk
from recipe.launch.config import Settings, get_recipe
from recipe.launch.run import plan

OPSD, GRPO, SFT = get_recipe("opsd"), get_recipe("grpo"), get_recipe("sft")


def parameters(model: Path) -> int:
    with safe_open(model / "model.safetensors", "pt") as weights:
        return sum(weights.get_tensor(name).numel() for name in weights.keys())


def gpu_plan(recipe, inputs, ckpt, argv=()):
    return plan(recipe, Settings(device="gpu", model_path=str(inputs.model), ckpt_dir=str(ckpt),
                                 train_files=str(inputs.sft if recipe is SFT else inputs.train)),
                list(argv), environ=inputs.env, detect_gpus=lambda: 1)


@pytest.mark.slow
def test_every_launch_prints_one_saves_size_and_the_free_space(launch_inputs, tmp_path):
    count = parameters(launch_inputs.model)
    tokenizer = sum(f.stat().st_size for f in launch_inputs.model.iterdir() if f.suffix != ".safetensors")
    launch = gpu_plan(GRPO, launch_inputs, tmp_path / "ckpt")
    save = launch.checked.disk.save
    assert (save.parameters, save.per_parameter, save.bytes) == (count, 12, 12 * count + tokenizer + disk.SMALL_FILES)
    line = next(line for line in launch.describe().splitlines() if line.startswith("[launch] disk:"))
    free = cli.human_bytes(cli.free_bytes(tmp_path))
    assert line.startswith(f"[launch] disk: one checkpoint save ~{cli.human_bytes(save.bytes)} "
                           f"({count / 1e3:.3g} K parameters x 12 bytes: fp32 weights, AdamW state); ")
    assert line.endswith(f"free in {tmp_path}; trainer.max_actor_ckpt_to_keep=2 keeps the last 2")
    assert free.split()[1] in line
    ema = gpu_plan(OPSD, launch_inputs, tmp_path / "ema", ["opsd.teacher.kind=ema", "opsd.teacher.ema_decay=0.99",
                                                            "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32"])
    assert ema.checked.disk.save.per_parameter == 16 and "EMA teacher" in ema.checked.disk.note
    sft = gpu_plan(SFT, launch_inputs, tmp_path / "sft")
    assert "trainer.max_ckpt_to_keep=2 keeps the last 2" in sft.checked.disk.note
    nosave = gpu_plan(GRPO, launch_inputs, tmp_path / "ns", ["trainer.save_freq=-1"])
    assert nosave.checked.disk.note.startswith("disk: no checkpoint saves (trainer.save_freq=-1)")


def test_a_launch_whose_one_save_cannot_fit_is_refused(launch_inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "free_bytes", lambda path: 1000)
    with pytest.raises(cli.NoSpaceError) as caught:
        gpu_plan(GRPO, launch_inputs, tmp_path / "ckpt")
    assert str(caught.value).startswith(f"{tmp_path / 'ckpt'}: one checkpoint save needs ~")
    assert str(caught.value).endswith(", 1000 B free there (free space, or set CKPT_DIR to a file system with room)")


@pytest.mark.slow
def test_a_run_whose_saves_do_not_fit_is_warned(launch_inputs, tmp_path, monkeypatch):
    launch = gpu_plan(GRPO, launch_inputs, tmp_path / "ckpt", ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=null"])
    one = launch.checked.disk.save.bytes
    monkeypatch.setattr(cli, "free_bytes", lambda path: 3 * one)
    launch = gpu_plan(GRPO, launch_inputs, tmp_path / "ckpt", ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=null"])
    assert any(note.startswith("the run's 100 saves need ~") and "free space or keep fewer saves" in note
               for note in launch.notes)
    kept = gpu_plan(GRPO, launch_inputs, tmp_path / "ckpt", ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=1"])
    assert not any("saves need" in note for note in kept.notes)  # 1 kept + 1 being written fit in 3


def test_retention_across_launches_keeps_the_newest_and_the_resumed_save(launch_inputs, tmp_path, make_save):
    ckpt = tmp_path / "ckpt"
    for step in (1, 2, 3, 4):
        make_save(ckpt, step, launch_inputs.model)
    (ckpt / "global_step_0").mkdir()  # a save whose shards verl's own retention removed
    make_save(ckpt, 5, launch_inputs.model, tracker=False, data=False)  # interrupted: no data.pt, no tracker
    plan_ = disk.DiskPlan(note="", keep=2, keep_key="trainer.max_actor_ckpt_to_keep", resume_step=4)
    removed = []
    disk.prune(ckpt, plan_, log=removed.append)
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_3", "global_step_4"]
    assert [line.split(" (")[0] for line in removed] == [f"[launch] removed {ckpt / f'global_step_{s}'}"
                                                        for s in (5, 0, 2, 1)]
    assert "a partial save past the resumed step 4 (it is written again)" in removed[0]
    assert "retention keeps the 2 newest save(s) (global_step_4, global_step_3)" in removed[-1]
    disk.prune(ckpt, disk.DiskPlan(note="", keep=None, keep_key="k", resume_step=4), log=removed.append)
    assert len(removed) == 4  # keep null: nothing more


def test_a_full_disk_after_a_failed_launch_is_one_line(launch_inputs, tmp_path, make_save):
    ckpt = tmp_path / "ckpt"
    make_save(ckpt, 2, launch_inputs.model)
    make_save(ckpt, 3, launch_inputs.model, tracker=False, data=False)
    plan_ = disk.DiskPlan(note="", keep=None, keep_key="trainer.max_actor_ckpt_to_keep", resume_step=2,
                          save=disk.SaveSize(bytes=10**6, parameters=1, per_parameter=12, parts=""))
    assert disk.failure_line(ckpt, plan_, log_text="ValueError: something else") is None
    line = disk.failure_line(ckpt, plan_, log_text="RuntimeError: [enforce fail at inline_container.cc:664] . "
                                                   "PytorchStreamWriter failed writing file data/0: file write failed")
    assert line == (f"error: {ckpt}: no space left: the save global_step_3 stopped part-way (one save needs "
                    f"~976.6 KB, {cli.human_bytes(cli.free_bytes(ckpt))} free) (the last whole save global_step_2 is "
                    "intact: free space and run the same command to resume from it, or keep fewer saves: "
                    "trainer.max_actor_ckpt_to_keep=1)")


def test_cpu_demos_keep_their_last_three_run_directories(tmp_path):
    runs = tmp_path / "runs"
    for stamp in ("20261120T000000Z", "20261121T000000Z", "20261122T000000Z", "20261123T000000Z"):
        (runs / f"{stamp}-opsd").mkdir(parents=True)
        (runs / f"{stamp}-opsd" / "big.pt").write_bytes(b"x" * 1024)
    (runs / "20261101T000000Z-grpo").mkdir()
    (runs / "seeds_20261101T000000Z").mkdir()
    said = []
    disk.prune_demo_runs(runs / "20261125T000000Z-opsd", recipe="opsd", log=said.append)
    assert sorted(p.name for p in runs.iterdir()) == ["20261101T000000Z-grpo", "20261122T000000Z-opsd",
                                                      "20261123T000000Z-opsd", "seeds_20261101T000000Z"]
    assert said[0] == (f"[launch] removed the old demo run {runs / '20261121T000000Z-opsd'} (1.0 KB): the opsd demo "
                       f"keeps its 3 latest runs in {runs} (copy one elsewhere to keep it)")
    assert len(said) == 2


def test_saves_in_a_run_follow_verl():
    assert disk.saves_in_run(total=100, start=0, save_freq=25, last_step_saves=False) == 4
    assert disk.saves_in_run(total=10, start=0, save_freq=4, last_step_saves=False) == 3  # 4, 8 and the last
    assert disk.saves_in_run(total=10, start=8, save_freq=4, last_step_saves=False) == 1
    assert disk.saves_in_run(total=10, start=0, save_freq=-1, last_step_saves=False) == 0
    assert disk.saves_in_run(total=10, start=0, save_freq=-1, last_step_saves=True) == 1  # verl's SFT trainer
