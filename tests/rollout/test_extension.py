"""recipe.rollout.extension: rollout ``vllm`` resolves to the guarded adapter where vLLM is installed, else nothing changes."""

import importlib.util
import subprocess
import sys

import pytest

from recipe.rollout import extension


def _verl_registry() -> dict:
    return {extension.VLLM_ROLLOUT: extension.VERL_VLLM_ADAPTER, ("sglang", "async"): "verl.sglang.ServerAdapter"}


def test_registers_the_guarded_adapter_where_vllm_is_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    registry = _verl_registry()
    assert extension.register_guarded_vllm_adapter(registry) is True
    assert registry == {extension.VLLM_ROLLOUT: extension.GUARDED_VLLM_ADAPTER, ("sglang", "async"): "verl.sglang.ServerAdapter"}
    assert extension.register_guarded_vllm_adapter(registry) is True  # idempotent


def test_no_op_without_vllm(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    registry = _verl_registry()
    assert extension.register_guarded_vllm_adapter(registry) is False
    assert registry == _verl_registry()


def test_a_users_own_adapter_is_left_alone(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    registry = {extension.VLLM_ROLLOUT: "my.pkg.MyAdapter"}
    assert extension.register_guarded_vllm_adapter(registry) is False
    assert registry == {extension.VLLM_ROLLOUT: "my.pkg.MyAdapter"}


def test_the_guarded_adapter_path_names_a_class_of_the_adapter_module():
    module, _, name = extension.GUARDED_VLLM_ADAPTER.rpartition(".")
    assert importlib.util.find_spec(module) is not None
    source = open(importlib.util.find_spec(module).origin).read()
    assert f"class {name}(ServerAdapter):" in source


@pytest.mark.slow
@pytest.mark.parametrize("vllm_installed", [False, True])
def test_verl_imports_it_from_the_environment(tmp_path, vllm_installed):
    """As on a GPU node: ``import verl`` with the module listed, in a fresh interpreter (no CPU plugin)."""
    fake = tmp_path / "vllm"
    if vllm_installed:  # an importable (empty) vllm package: the registration needs only its presence
        fake.mkdir()
        (fake / "__init__.py").write_text("")
    code = ("import verl\nfrom verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"
            "print(_ROLLOUT_REGISTRY[('vllm', 'async')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"VERL_USE_EXTERNAL_MODULES": "recipe.rollout.extension", "PYTHONPATH": str(tmp_path),
                              "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip().splitlines()[-1] == (
        extension.GUARDED_VLLM_ADAPTER if vllm_installed else extension.VERL_VLLM_ADAPTER)
