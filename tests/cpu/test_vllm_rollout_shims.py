"""recipe.cpu.vllm_rollout_shims without vLLM (its effect on a vLLM-CPU engine: tests/e2e/test_vllm_cpu_e2e.py)."""

import sys

from recipe.cpu import vllm_rollout_shims as shims


def test_keep_cpu_linear_weights_needs_vllm_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert shims.keep_cpu_linear_weights() is False
