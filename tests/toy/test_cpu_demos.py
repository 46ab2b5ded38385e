"""The CPU demos: each is a preset + a builder; the no-argument run passes each key once, two hops to verl."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.launch.config import RECIPES, Override, Settings, get_recipe
from recipe.launch.run import StepProgress, plan
from recipe.launch import __main__ as launcher
from recipe.toy.cpu_demos import DEMOS, TrainingFailed, before_after_table, get_demo, unbuilt

REPO_ROOT = Path(__file__).resolve().parents[2]


def cpu_plan(recipe, demo, tmp_path, argv=(), **settings):
    settings = Settings(device="cpu", cache_dir=str(tmp_path), cpu_demo=demo, **settings)
    build = get_demo(demo).load()(recipe, settings, build=False)  # a dry run: what it would build is not checked
    return plan(get_recipe(recipe), settings, list(argv), demo=build.inputs, environ={},
                pending=unbuilt(build.inputs)), build


def test_every_demo_has_a_builder_and_a_preset_per_recipe():
    for demo in DEMOS.values():
        assert callable(demo.load())
        assert [r for r in RECIPES if demo.name in get_recipe(r).presets("demo")], demo.name
    assert set(get_recipe("opsd").presets("demo")) == set(DEMOS)
    with pytest.raises(ValueError, match="CPU_DEMO='huge' is not one of"):
        get_demo("huge")


@pytest.mark.parametrize("failure, line, code", [
    (TrainingFailed("error: /ckpt: the disk is full (free space)", exit_code=1), "error: /ckpt: the disk is full (free space)", 1),
    (TrainingFailed("opsd training failed (exit 3); the end of train.log:\nboom", exit_code=3),
     "[launch] opsd training failed (exit 3); the end of train.log:\nboom", 3),
    (RuntimeError("the evaluation failed"), "[launch] the evaluation failed", 1)])
def test_a_failed_demo_prints_its_line_and_exits_with_the_trainers_code(failure, line, code, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(launcher, "run_demo", fail)
    monkeypatch.setattr(os, "environ", {"DEVICE": "cpu"})
    assert launcher.main(["opsd"]) == code
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.slow
def test_no_argument_run_is_one_launch_of_verl_with_each_key_once(tmp_path):
    launch, build = cpu_plan("opsd", "toy", tmp_path)
    assert launch.command[1:3] == ["-m", "recipe.opsd.main_opsd"]  # run_opsd.sh -> recipe.launch -> this
    args = [a for a in launch.command if "=" in a and not a.startswith("--")]
    keys = [Override.parse(a).key for a in args]
    assert len(keys) == len(set(keys)) and launch.overrides.replaced == []
    assert [a for a in args if Override.parse(a).is_group] == ["+demo=toy", "+platform=cpu"]
    cfg = launch.config
    assert cfg.actor_rollout_ref.model.path.endswith("/student") and cfg.actor_rollout_ref.rollout.name == "hf"
    assert (cfg.trainer.total_training_steps, cfg.trainer.save_freq, cfg.data.train_batch_size) == (150, 150, 64)
    assert cfg.opsd.loss.clip_tau is None and (cfg.opsd.student_mode, cfg.opsd.teacher_mode) == ("no_think", "no_think")
    assert cfg.trainer.resume_mode == "disable" and str(launch.ckpt_dir).startswith(str(tmp_path / "toy"))
    assert build.evaluate is not None and build.before_dir.name == "none"
    assert not any(tmp_path.iterdir())  # build=False: nothing made


@pytest.mark.slow
def test_steps_is_one_key_and_the_checkpoint_follows(tmp_path):
    launch, _ = cpu_plan("opsd", "toy", tmp_path, steps=30)
    assert (launch.config.trainer.total_training_steps, launch.config.trainer.save_freq) == (30, 30)
    assert "trainer.save_freq" not in launch.overrides


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "steps", "batch"), [("opsd", 4, 4), ("grpo", 4, 4), ("sft", 3, 8)])
def test_tiny_demo_of_every_recipe(recipe, steps, batch, tmp_path):
    launch, build = cpu_plan(recipe, "tiny", tmp_path)
    cfg = launch.config
    assert (cfg.trainer.total_training_steps, cfg.data.train_batch_size) == (steps, batch)
    assert cfg.trainer.device == "cpu" and build.evaluate is None
    assert str(launch.ckpt_dir) == str(tmp_path / "checkpoints" / recipe / cfg.trainer.experiment_name)


@pytest.mark.slow
def test_given_model_and_data_replace_what_the_demo_builds(tmp_path, launch_inputs):
    model, train = str(launch_inputs.model), str(launch_inputs.train)
    launch, _ = cpu_plan("grpo", "tiny", tmp_path, model_path=model, train_files=train)
    assert launch.config.actor_rollout_ref.model.path == model
    assert launch.config.data.train_files == launch.config.data.val_files == train
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.path=/my/model \(MODEL_PATH\): no such model"):
        cpu_plan("grpo", "tiny", tmp_path, model_path="/my/model", train_files=train)  # what is given is checked


def test_before_after_table_and_progress(capsys):
    table = before_after_table({"greedy (%)": "8.6", "length": "20.1"}, {"greedy (%)": "92.6", "length": "19.9"},
                               recipe="opsd", steps=150, record={"wall_time_s": 240}, step_times=[3.0, 1.0, 1.0])
    assert table.splitlines()[:4] == ["| held-out metric | before | after 150 OPSD steps |", "|---|---|---|",
                                      "| greedy (%) | 8.6 | 92.6 |", "| length | 20.1 | 19.9 |"]
    assert "240 s wall time, 1.67 s/step (1.00 after step 1)" in table
    progress = StepProgress("opsd", {"opsd/loss": "loss"}, total=4, every_s=3600, startup_every_s=0)
    progress("Started a local Ray instance.")  # before step 1: a start-up heartbeat
    for step in (1, 2, 3, 4):
        progress(f"(TaskRunner pid=1) step:{step} - opsd/loss:np.float64(0.{step}) - other:x")
    progress("no step here")  # after step 1: no heartbeat
    # the recipe's own messages pass through, with Ray's prefix and colours removed
    progress("\x1b[36m(OPSDTaskRunner pid=7)\x1b[0m [opsd] step 3: non-finite loss or gradient norm, update skipped")
    progress("[opsd] stopped: step 3: 2 consecutive steps")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[opsd] starting up (")
    assert out[1:] == ["[opsd] step 1/4: loss=0.1", "[opsd] step 4/4: loss=0.4",  # first, last, and every every_s
                       "[opsd] step 3: non-finite loss or gradient norm, update skipped",
                       "[opsd] stopped: step 3: 2 consecutive steps"]


def test_progress_skips_a_steps_lines_without_progress_values(capsys):
    """verl prints the validation (step 0) and the OPSD pre-flight report (with step 1) before step 1's values:
    no empty ``[opsd] step 1/N:`` line, and step 1's values are shown when they come."""
    progress = StepProgress("opsd", {"opsd/loss": "loss"}, total=4, every_s=3600, startup_every_s=3600)
    progress("(TaskRunner pid=1) step:0 - val-core/toy/reward/mean@1:np.float64(0.1)")
    progress("(TaskRunner pid=1) step:1 - opsd/preflight/fwd_kl:np.float64(0.4) - opsd/preflight/rows:8")
    progress("(TaskRunner pid=1) step:1 - opsd/loss:np.float64(0.25) - timing_s/step:np.float64(2.0)")
    assert capsys.readouterr().out.splitlines() == ["[opsd] step 1/4: loss=0.25"]


@pytest.mark.slow
def test_no_argument_dry_run_prints_the_config_once_and_builds_nothing(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable, "DEVICE": "cpu",
           "OPSD_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", "recipe/opsd/run_opsd.sh", "--dry-run"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("effective config") == 1 and "CPU demo toy" in proc.stdout
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_dry_run_says_when_model_path_replaces_the_demo_model(tmp_path):
    from recipe.models.tiny import build_tiny_model

    model = tmp_path / "my_model"
    build_tiny_model(model)  # a real model directory: the dry run runs the launch's start-up checks
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable, "DEVICE": "cpu",
           "OPSD_CACHE": str(tmp_path / "cache"), "MODEL_PATH": str(model)}
    proc = subprocess.run(["bash", "recipe/opsd/run_opsd.sh", "--dry-run"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"[launch] MODEL_PATH={model} replaces what the demo would build" in proc.stdout
    assert "[launch] TRAIN_FILES=" not in proc.stdout


@pytest.mark.slow
def test_sft_runs_the_tiny_demo_by_default_and_an_absent_demo_stops_before_building(tmp_path):
    """SFT has no toy preset: without CPU_DEMO it runs the tiny demo; CPU_DEMO=toy is refused before the
    toy student (minutes of SFT) is built."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable, "DEVICE": "cpu",
           "OPSD_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", "recipe/sft/run_sft.sh", "--dry-run"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CPU demo tiny" in proc.stdout and "experiment_name: sft_cpu_tiny" in proc.stdout
    proc = subprocess.run(["bash", "recipe/sft/run_sft.sh"], cwd=REPO_ROOT, env={**env, "CPU_DEMO": "toy"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "error: the sft recipe has no CPU demo 'toy' (CPU_DEMO: one of ['tiny'])", proc.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_a_tiny_run_on_two_ranks_keeps_its_own_checkpoints(tmp_path):
    """verl's FSDP checkpoints are per world size: the 2-rank run must not resume the 1-rank run's checkpoint."""
    one, _ = cpu_plan("grpo", "tiny", tmp_path)
    two, _ = cpu_plan("grpo", "tiny", tmp_path, cpu_num_ranks=2)
    assert two.ckpt_dir == tmp_path / "checkpoints" / "grpo" / "tiny_2_ranks" != one.ckpt_dir
    assert two.config.trainer.n_gpus_per_node == 2
