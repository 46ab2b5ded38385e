"""The faults a user meets first, end to end through ``bash recipe/opsd/run_opsd.sh`` (tiny model, CPU).

Inputs (no Ray; each launch ends before Ray starts, ~10 s): a model path, a training file and a teacher
checkpoint that do not exist, a training file that is not a parquet: one line naming the setting and
the fix, exit 2; the same for run_sft.sh and the pipeline.

One checkpoint directory on a small real file system (a tmpfs; skipped where the machine cannot
mount one), two Ray launches and three that end before Ray:

A. 3 steps, a save every step, every save kept, a ballast file on the disk: the first launch prints
   the size of one save and the free space, warns that its 3 saves will not fit, saves steps 1 and 2
   and fails in the step-3 save: one line naming the directory, the space one save needs and the
   last whole save (global_step_2, intact); exit non-zero.
B. the ballast removed (space freed), the same command with the other fix A's line names
   (trainer.max_actor_ckpt_to_keep=1) and STEPS=4: resumes from global_step_2 (the partial
   global_step_3 is removed first), trains steps 3 and 4, and the saves of earlier launches beyond
   the retention count are removed (only global_step_4 is left); exit 0. While it runs a second
   launch on the same directory is refused naming it (exit 2).
C. the same command again: "holds a finished run" (step 4 of 4), exit 0, nothing trained.
D. the same command with another learning rate: refused, one line per differing key, exit 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipe.common.checkpoints import check_resumable
from tests.conftest import SmallFs
from tests.e2e.conftest import bound, stop_launch

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "recipe/opsd/run_opsd.sh"
ARGS = ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=null"]
RETAINED = ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=1"]  # B, C, D: A's line's other fix
MB = 1024 * 1024


def _run(script, args, env, *, timeout=120) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(REPO_ROOT / script), *args], cwd=REPO_ROOT, env=full, capture_output=True,
                          text=True, timeout=bound(timeout))


def _last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


# --------------------------------------------------------------------------- inputs (no Ray)
def test_wrong_inputs_stop_before_ray_with_one_line(tiny_run_env, tiny_data, tmp_path):
    env = tiny_run_env(tmp_path / "ckpt", STEPS="1", OPSD_CACHE=str(tmp_path / "cache"))
    start = time.monotonic()
    model = _run(SCRIPT, [], {**env, "MODEL_PATH": "/nonexistent/model"})
    assert model.returncode == 2, model.stderr[-3000:]
    assert _last_line(model) == (
        "error: actor_rollout_ref.model.path=/nonexistent/model (MODEL_PATH): no such model directory "
        "(set MODEL_PATH to a Hugging Face model directory or a Hub id such as Qwen/Qwen3-1.7B)")
    assert "Ray" not in model.stdout + model.stderr and time.monotonic() - start < 60
    train = _run(SCRIPT, [], {**env, "TRAIN_FILES": str(tmp_path / "missing.parquet")})
    assert train.returncode == 2 and _last_line(train) == (
        f"error: data.train_files={tmp_path / 'missing.parquet'} (TRAIN_FILES): no such data file "
        "(set TRAIN_FILES to an existing parquet file)")
    teacher = _run(SCRIPT, ["opsd.teacher.kind=checkpoint", "opsd.teacher.path=/nonexistent/teacher"], env)
    assert teacher.returncode == 2 and _last_line(teacher).startswith(
        "error: opsd.teacher.path=/nonexistent/teacher (command line): no such model directory")
    sft = _run("recipe/sft/run_sft.sh", [], {**env, "TRAIN_FILES": str(tiny_data["train"])})  # an RL parquet
    assert sft.returncode == 2 and _last_line(sft).startswith(
        f"error: data.train_files={tiny_data['train']} (TRAIN_FILES): no column 'messages'")
    pipeline = _run("scripts/pipeline_sft_grpo_opsd.sh", [], {
        "DEVICE": "cpu", "OPSD_CACHE": str(tmp_path / "cache"), "WORK_DIR": str(tmp_path / "pipeline"),
        "OPSD_TRAIN_FILES": str(tmp_path / "ot.parquet")})
    assert pipeline.returncode == 2 and _last_line(pipeline) == (
        f"error: data.train_files={tmp_path / 'ot.parquet'} (OPSD_TRAIN_FILES): no such data file "
        "(set OPSD_TRAIN_FILES to an existing parquet file)")
    assert not (tmp_path / "pipeline").exists()  # refused before the SFT stage


# --------------------------------------------------------------------------- one directory, a full disk, relaunches
@pytest.fixture(scope="module")
def relaunches(run_cpu_verl, tiny_run_env, tmp_path_factory):
    """``(ckpt, runs)``: the launches A-E of the module docstring (``runs[name]``: a VerlRun or CompletedProcess)."""
    root = tmp_path_factory.mktemp("faults")
    fs = None
    try:
        fs = SmallFs(root / "fs", size=4 * MB)
    except OSError as err:
        pytest.skip(f"cannot mount a tmpfs here ({err})")
    ckpt = fs.path / "ckpt"
    env = tiny_run_env(ckpt, STEPS="3")
    runs = {}
    try:
        ballast = fs.path / "ballast"
        # free at the start: ~2.5 saves of the tiny model (1.2 MB each) and the logs: saves 1 and 2 fit, 3 does not
        ballast.write_bytes(b"\0" * (fs.free() - int(3.2 * MB)))
        runs["A"] = run_cpu_verl(SCRIPT, ARGS, workdir=root / "A", env=env, script=True, timeout=300)
        runs["A_files"] = sorted(p.name for p in ckpt.glob("global_step_*"))
        runs["A_tracker"] = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
        check_resumable(ckpt / "global_step_2")  # the last complete save is intact
        ballast.unlink()  # the user frees space
        # B, and a second launch on the same directory while B holds it
        env = {**env, "STEPS": "4"}
        full = {**os.environ, "VERL_FILE_LOGGER_PATH": str(root / "B" / "metrics.jsonl"), "PYTHON": sys.executable,
                **env}
        (root / "B").mkdir()
        with open(root / "B" / "run.log", "w") as log:
            b = subprocess.Popen(["bash", str(REPO_ROOT / SCRIPT), *RETAINED], cwd=REPO_ROOT, env=full, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.monotonic() + 120
                while not (ckpt / "launch_config.1.yaml").exists():  # B holds the lock, then writes its config
                    assert b.poll() is None and time.monotonic() < deadline, (root / "B" / "run.log").read_text()[-3000:]
                    time.sleep(0.2)
                runs["second"] = _run(SCRIPT, RETAINED, env)
                runs["second_pid"] = b.pid
                runs["B_code"] = b.wait(timeout=bound(300))
            except BaseException:
                stop_launch(b)
                raise
        runs["B_log"] = (root / "B" / "run.log").read_text() + (ckpt / "train.log").read_text(errors="replace")
        from tests.e2e.conftest import read_metrics_jsonl

        runs["B_metrics"] = read_metrics_jsonl(root / "B" / "metrics.jsonl")
        runs["B_files"] = sorted(p.name for p in ckpt.glob("global_step_*"))
        runs["C"] = _run(SCRIPT, RETAINED, env)
        runs["C_files"] = sorted(p.name for p in ckpt.glob("global_step_*"))
        runs["D"] = _run(SCRIPT, [*RETAINED, "actor_rollout_ref.actor.optim.lr=1e-3"], env)
        yield ckpt, runs
    finally:
        fs.unmount()


def test_a_full_disk_during_a_save_stops_the_run_with_one_line(relaunches):
    ckpt, runs = relaunches
    a = runs["A"]
    assert a.returncode != 0, a.tail()
    disk_line = next(line for line in a.log.splitlines() if line.startswith("[launch] disk: one checkpoint save ~"))
    assert f"free in {ckpt.parent}" in disk_line and "trainer.max_actor_ckpt_to_keep=null keeps every save" in disk_line
    assert any("the run's 3 saves need ~" in line and "free space or keep fewer saves" in line
               for line in a.log.splitlines())
    last = [line for line in a.log.splitlines() if line.startswith(("[launch]", "error:"))][-1]
    assert re.match(rf"error: {re.escape(str(ckpt))}: no space left: the save global_step_3 stopped "
                    r"part-way \(one save needs ~1\.\d MB, \d+(\.\d)? [KM]?B free\) ", last), a.tail()
    assert last.endswith("the last whole save global_step_2 is intact: free space and run the same command to resume "
                         "from it, or keep fewer saves: trainer.max_actor_ckpt_to_keep=1)")
    # step 3 trained; verl logs a step after its save, which failed
    assert sorted(a.metrics) == [1, 2] and runs["A_tracker"] == "2"
    assert runs["A_files"] == ["global_step_1", "global_step_2", "global_step_3"]


def test_freeing_space_and_relaunching_resumes_from_the_last_whole_save(relaunches):
    ckpt, runs = relaunches
    assert runs["B_code"] == 0, runs["B_log"][-4000:]
    assert f"[launch] removed {ckpt / 'global_step_3'} (" in runs["B_log"]  # the partial save, written again
    assert f"Resuming from {ckpt / 'global_step_2'}" in runs["B_log"]
    assert sorted(runs["B_metrics"]) == [3, 4]
    assert all(runs["B_metrics"][step]["training/resumed_from_step"] == 2 for step in (3, 4))
    # raising the step count continued the run; the retention count bounds the directory
    assert runs["B_files"] == ["global_step_4"], runs["B_log"][-4000:]
    removed = [line.split(" (")[0] for line in runs["B_log"].splitlines() if line.startswith("[launch] removed ")]
    assert {f"[launch] removed {ckpt / f'global_step_{s}'}" for s in (1, 2, 3)} <= set(removed), removed
    check_resumable(ckpt / "global_step_4")


def test_a_second_launch_on_the_same_directory_is_refused_naming_the_first(relaunches):
    ckpt, runs = relaunches
    second = runs["second"]
    assert second.returncode == 2, second.stderr[-3000:]
    assert _last_line(second).startswith(f"error: CKPT_DIR={ckpt}: in use by another launch (pid ")
    assert _last_line(second).endswith("(wait for it to end (or stop it), or set CKPT_DIR to another directory)")
    assert "opsd: " in _last_line(second)  # the first's command


def test_a_finished_run_is_not_trained_again(relaunches):
    ckpt, runs = relaunches
    c = runs["C"]
    assert c.returncode == 0, c.stderr[-3000:]
    assert c.stdout.strip().splitlines()[-1] == (f"[launch] {ckpt} holds a finished run: its save global_step_4 is step 4 of "
                             "trainer.total_training_steps=4; nothing to train (raise STEPS or "
                             "trainer.total_training_steps to continue it, or set CKPT_DIR to another directory for a "
                             "new run)")
    assert "Ray" not in c.stdout and runs["C_files"] == ["global_step_4"]


def test_another_config_is_not_resumed(relaunches):
    ckpt, runs = relaunches
    d = runs["D"]
    assert d.returncode == 2
    lines = d.stderr.strip().splitlines()[-2:]
    assert lines[0].startswith(f"error: {ckpt / 'global_step_4'}: saved by a launch with another config "
                               f"({ckpt / 'launch_config.1.yaml'}); this launch differs in 1 setting(s)")
    assert lines[0].endswith("to resume this save with the new values anyway set RESUME_WITH_CHANGES=1)")
    assert lines[1] == "  actor_rollout_ref.actor.optim.lr: 0.0001 -> 0.001 (saved -> now)"  # the tiny demo's lr
