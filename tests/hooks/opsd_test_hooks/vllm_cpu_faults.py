"""Fault injection for tests/e2e/test_vllm_cpu_e2e.py, loaded as a verl external module.

    launch_env("opsd_test_hooks.vllm_cpu_faults", OPSD_TEST_UNDO_KEEP_WEIGHTS="1")   # + CPU_ROLLOUT=vllm ...

Imported in every verl process after ``recipe.cpu.plugin`` and ``recipe.rollout.extension`` (the
launcher lists the user's modules after its own), and after ``opsd_test_hooks.rollout`` when a test
lists both:

- ``OPSD_TEST_UNDO_KEEP_WEIGHTS=1``: in vLLM processes, undo ``keep_cpu_linear_weights`` (vLLM-CPU
  packs the linear weights away again), so the first weight push raises on the receiving side,
  as before the fix;
- ``OPSD_TEST_UNGUARDED_PUSH=1``: resolve ``rollout.name=vllm`` to verl's own adapter again (the
  weight push without the guard: with the fault above, the trainer waits forever).
"""

import os
import sys

if os.environ.get("OPSD_TEST_UNDO_KEEP_WEIGHTS") == "1" and "vllm" in sys.modules:
    from vllm.model_executor.layers import utils as _layer_utils

    _layer_utils.dispatch_cpu_unquantized_gemm = getattr(
        _layer_utils.dispatch_cpu_unquantized_gemm, "__wrapped__", _layer_utils.dispatch_cpu_unquantized_gemm
    )

if os.environ.get("OPSD_TEST_UNGUARDED_PUSH") == "1":
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    _ROLLOUT_REGISTRY[("vllm", "async")] = "verl.workers.rollout.vllm_rollout.ServerAdapter"
