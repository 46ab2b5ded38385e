"""recipe.rollout.sync_check: the first-hour GPU check's weight-sync probe is an opt-in external module."""

import importlib.util
from pathlib import Path

from recipe.rollout import extension, sync_check
from recipe.tools.gpu_check import probe_environment


def test_registers_the_sync_checked_adapter_over_verls_or_the_guarded_one(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    for before in (extension.VERL_VLLM_ADAPTER, extension.GUARDED_VLLM_ADAPTER):
        registry = {extension.VLLM_ROLLOUT: before}
        assert sync_check.register_sync_checked_adapter(registry) is True
        assert registry == {extension.VLLM_ROLLOUT: sync_check.SYNC_CHECKED_VLLM_ADAPTER}
    users = {extension.VLLM_ROLLOUT: "my.pkg.MyAdapter"}
    assert sync_check.register_sync_checked_adapter(users) is False and users[extension.VLLM_ROLLOUT] == "my.pkg.MyAdapter"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    registry = {extension.VLLM_ROLLOUT: extension.VERL_VLLM_ADAPTER}
    assert sync_check.register_sync_checked_adapter(registry) is False  # no vLLM: nothing changes


def test_the_adapter_path_names_a_subclass_of_the_guarded_adapter():
    module, _, name = sync_check.SYNC_CHECKED_VLLM_ADAPTER.rpartition(".")
    source = Path(importlib.util.find_spec(module).origin).read_text()
    assert f"class {name}(GuardedvLLMServerAdapter):" in source


def test_gpu_check_loads_the_module_after_the_users_and_names_the_log(tmp_path):
    log = tmp_path / "probe.jsonl"
    assert probe_environment(log) == {"VERL_USE_EXTERNAL_MODULES": sync_check.MODULE, sync_check.LOG_ENV: str(log)}
    env = probe_environment(log, {"VERL_USE_EXTERNAL_MODULES": "my.mod"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"my.mod,{sync_check.MODULE}"
    again = probe_environment(log, env)
    assert again["VERL_USE_EXTERNAL_MODULES"] == env["VERL_USE_EXTERNAL_MODULES"]  # listed once
