"""opsd_test_hooks.rollout: loaded through verl's external modules, it points verl's rollout registries at
the hooked rollouts (and only where each rollout exists); ``launch_env`` composes the variables."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opsd_test_hooks import HOOKS_DIR, launch_env
from opsd_test_hooks.rollout import HF_ADAPTER, VLLM_ADAPTER, skip_weight_sync

REGISTRY = ("import json, verl\nfrom verl.workers.rollout.base import _ROLLOUT_REGISTRY as r\n"
            "print(json.dumps({'vllm': r[('vllm', 'async')], 'hf': r.get(('hf', 'async'))}))")


def test_launch_env_appends_modules_and_puts_the_hooks_first_on_the_path():
    env = launch_env("opsd_test_hooks.rollout", environ={"PYTHONPATH": "/a", "VERL_USE_EXTERNAL_MODULES": "my.ext"},
                     OPSD_TEST_SKIP_WEIGHT_SYNC=1)
    assert env == {"PYTHONPATH": os.pathsep.join([HOOKS_DIR, "/a"]),
                   "VERL_USE_EXTERNAL_MODULES": "my.ext,opsd_test_hooks.rollout", "OPSD_TEST_SKIP_WEIGHT_SYNC": "1"}
    assert Path(HOOKS_DIR, "opsd_test_hooks", "rollout.py").is_file()


def test_skip_weight_sync_keeps_the_start_up_push(monkeypatch):
    monkeypatch.setenv("OPSD_TEST_SKIP_WEIGHT_SYNC", "1")
    assert [skip_weight_sync(step) for step in (None, 0, 1, 2)] == [False, False, True, True]
    monkeypatch.delenv("OPSD_TEST_SKIP_WEIGHT_SYNC")
    assert not skip_weight_sync(3)


@pytest.mark.slow
@pytest.mark.parametrize("vllm_installed", [False, True])
def test_verl_imports_the_hook_after_the_guarded_push(tmp_path, vllm_installed):
    """As a GPU launch lists it (no CPU plugin): the hook's adapter replaces the guarded one where vLLM exists."""
    if vllm_installed:  # an importable (empty) vllm package: the registrations need only its presence
        (tmp_path / "vllm").mkdir()
        (tmp_path / "vllm" / "__init__.py").write_text("")
    env = launch_env("opsd_test_hooks.rollout", environ={"PYTHONPATH": str(tmp_path),
                                                          "VERL_USE_EXTERNAL_MODULES": "recipe.rollout.extension"})
    out = subprocess.run([sys.executable, "-c", REGISTRY], capture_output=True, text=True, check=True,
                         env={**env, "PATH": "/usr/bin:/bin"})
    registry = json.loads(out.stdout.strip().splitlines()[-1])
    assert registry == {"vllm": VLLM_ADAPTER if vllm_installed else "verl.workers.rollout.vllm_rollout.ServerAdapter",
                        "hf": None}


@pytest.mark.slow
def test_on_the_cpu_path_the_hf_rollout_is_hooked():
    env = launch_env("opsd_test_hooks.rollout", environ={"VERL_USE_EXTERNAL_MODULES": "recipe.cpu.plugin"})
    out = subprocess.run([sys.executable, "-c", REGISTRY], capture_output=True, text=True, check=True,
                         env={**env, "PATH": "/usr/bin:/bin", "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"})
    assert json.loads(out.stdout.strip().splitlines()[-1])["hf"] == HF_ADAPTER


def test_when_imported_patches_a_module_after_its_import(tmp_path):
    """A hook that changes a project module waits until that module is fully imported (it may be imported
    by verl while the module itself is being imported)."""
    (tmp_path / "target_mod.py").write_text("VALUE = 1\n")
    (tmp_path / "hook_mod.py").write_text(
        "from opsd_test_hooks import when_imported\n"
        "def patch(module):\n    module.VALUE += 10\n"
        "when_imported('target_mod', patch)\n")
    code = "import hook_mod, target_mod\nprint(target_mod.VALUE)\nimport opsd_test_hooks\n" \
           "opsd_test_hooks.when_imported('target_mod', hook_mod.patch)\nprint(target_mod.VALUE)"
    env = launch_env(environ={"PYTHONPATH": str(tmp_path)})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["11", "21"]  # after its import, then at once (already imported)
