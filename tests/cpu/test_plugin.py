"""recipe.cpu.plugin / recipe.cpu.rollout without Ray (the server's weights log: the test hook
``opsd_test_hooks.rollout``).

The plugin patches process-global state (torch.distributed.init_process_group, FSDP2's
CPUOffloadPolicy, verl's registries), so every check that loads it runs in a fresh
subprocess and reports back as JSON.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opsd_test_hooks import launch_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, *, env: dict[str, str], timeout: float = 120) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    full_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_normalize_backend():
    from recipe.cpu.plugin import normalize_backend

    assert normalize_backend("cpu:gloo,cpu:gloo") == "gloo"
    assert normalize_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert normalize_backend("gloo") == "gloo"
    assert normalize_backend(None) is None


@pytest.mark.slow
def test_plugin_is_inert_off_the_cpu_path():
    result = run_python(
        """
        import json, sys
        import recipe.cpu.plugin as plugin
        verl_loaded = "verl" in sys.modules
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
        from verl.workers.rollout.replica import RolloutReplicaRegistry
        import torch.distributed
        print(json.dumps({
            "verl_loaded_by_plugin": verl_loaded,
            "hf_rollout": ("hf", "async") in _ROLLOUT_REGISTRY,
            "hf_replica": "hf" in RolloutReplicaRegistry._registry,
            "init_patched": hasattr(torch.distributed.init_process_group, "_recipe_cpu_normalized"),
            "has_platform_class": hasattr(plugin, "PlatformCPU"),
        }))
        """,
        env={"VERL_USE_EXTERNAL_MODULES": "recipe.cpu.plugin"},
    )
    assert result == {
        "verl_loaded_by_plugin": False,
        "hf_rollout": False,
        "hf_replica": False,
        "init_patched": False,
        "has_platform_class": False,
    }


CPU_ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "VERL_USE_EXTERNAL_MODULES": "recipe.cpu.plugin",
}


@pytest.mark.slow
def test_plugin_registers_cpu_platform_engine_rollout_and_shims():
    result = run_python(
        """
        import json, os, warnings
        import torch, torch.distributed
        import verl
        from verl.utils.device import get_device_name, get_nccl_backend, get_device_id, get_torch_device
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.replica import get_rollout_replica_class
        from verl.workers.engine import EngineRegistry
        import recipe.cpu.plugin as plugin

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29631")
        torch.distributed.init_process_group(backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}",
                                             rank=0, world_size=1)
        backend = torch.distributed.get_backend()
        torch.distributed.destroy_process_group()
        from torch.distributed.fsdp import CPUOffloadPolicy
        from verl.utils.fsdp_utils import CPUOffloadPolicy as VerlCPUOffloadPolicy
        from verl.workers.engine.fsdp import transformer_impl
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok_other = plugin.check_verl_version("0.9.2")
            ok_same = plugin.check_verl_version("0.9.1")
        print(json.dumps({
            "device": get_device_name(),
            "backend_name": get_nccl_backend(),
            "device_id": str(get_device_id()),
            "empty_cache": get_torch_device().empty_cache() is None,
            "rng_roundtrip": bool(torch.equal(get_torch_device().get_rng_state(), torch.get_rng_state())),
            "pg_backend": backend,
            "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
            "rollout": get_rollout_class("hf", "async").__name__,
            "replica": get_rollout_replica_class("hf").__name__,
            "pin_memory": CPUOffloadPolicy(pin_memory=True).pin_memory,
            "verl_binding_pin_memory": VerlCPUOffloadPolicy(pin_memory=True).pin_memory,
            # the binding the frozen teacher's forward-only engine builds its offload policy from
            "engine_binding_pin_memory": transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory,
            "version_warning": ok_other is False and ok_same is True and "re-check the shims" in str(caught[0].message),
        }))
        """,
        env=CPU_ENV,
    )
    assert result == {
        "device": "cpu",
        "backend_name": "gloo",
        "device_id": "cpu",
        "empty_cache": True,
        "rng_roundtrip": True,
        "pg_backend": "gloo",
        "engine": "FSDPEngineWithLMHead",
        "rollout": "HFServerAdapter",
        "replica": "HFReplica",
        "pin_memory": False,
        "verl_binding_pin_memory": False,
        "engine_binding_pin_memory": False,
        "version_warning": True,
    }


@pytest.mark.slow
def test_modules_listed_after_the_plugin_import_after_the_platform_exists(tmp_path):
    # A module that resolves the platform at import time (verl.workers.engine does), listed
    # after the plugin, in a process whose first import is the plugin (verl's import-order trap).
    (tmp_path / "engine_user_ext.py").write_text(
        "import verl.workers.engine\nfrom verl.utils.device import get_device_name\nDEVICE = get_device_name()\n"
    )
    result = run_python(
        """
        import json
        import recipe.cpu.plugin
        import engine_user_ext
        print(json.dumps({"device": engine_user_ext.DEVICE}))
        """,
        env={
            **CPU_ENV,
            "VERL_USE_EXTERNAL_MODULES": "recipe.cpu.plugin,engine_user_ext",
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        },
    )
    assert result == {"device": "cpu"}


@pytest.mark.slow
def test_hf_rollout_server_batches_concurrent_requests_and_loads_weights(tmp_path):
    from recipe.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    result = run_python(
        f"""
        import asyncio, json
        import torch
        import verl
        from verl.workers.config import HFModelConfig, RolloutConfig
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
        from verl.workers.rollout.replica import RolloutReplicaRegistry
        from opsd_test_hooks.hf_rollout import LoggedHFRolloutServer, weights_fingerprint

        server = LoggedHFRolloutServer(
            RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=16, response_length=8),
            HFModelConfig(path="{model_dir}"), 0, 64,
        )
        params = {{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}}

        async def burst(n):
            return await asyncio.gather(*[
                server.generate(prompt_ids=[1, 10 + i, 11, 12], sampling_params=dict(params), request_id=str(i))
                for i in range(n)
            ])

        outputs = asyncio.run(burst(12))
        batches_after_burst = server.stats()["num_batches"]
        new = {{k: torch.randn_like(v) for k, v in server.weights_snapshot().items()}}
        asyncio.run(server.load_weights(new, global_steps=3))
        snapshot = server.weights_snapshot()
        after = asyncio.run(burst(1))[0]
        logged = [json.loads(line) for line in open("{tmp_path / 'weights.jsonl'}")]
        print(json.dumps({{
            "logged_steps": [r["global_steps"] for r in logged],
            "fingerprint_is_new": logged[-1]["sha256"] == weights_fingerprint(new),
            "batches": batches_after_burst,
            "lengths_ok": all(1 <= len(o.token_ids) <= 8 for o in outputs),
            "logprobs_ok": all(len(o.log_probs) == len(o.token_ids) for o in outputs),
            "weights_equal": all(torch.equal(snapshot[k], new[k]) for k in new),
            "updates": server.stats()["num_weight_updates"],
            "global_steps": after.extra_fields["global_steps"],
            "hooked": [_ROLLOUT_REGISTRY[("hf", "async")], RolloutReplicaRegistry.get("hf").__name__],
        }}))
        """,
        env={**CPU_ENV, **launch_env("opsd_test_hooks.rollout", environ=CPU_ENV,
                                     OPSD_TEST_ROLLOUT_WEIGHTS_LOG=str(tmp_path / "weights.jsonl"))},
    )
    assert result == {
        "logged_steps": [3],
        "fingerprint_is_new": True,
        "batches": 1,
        "lengths_ok": True,
        "logprobs_ok": True,
        "weights_equal": True,
        "updates": 1,
        "global_steps": 3,
        "hooked": ["opsd_test_hooks.hf_rollout.HookedHFServerAdapter", "HookedHFReplica"],
    }
