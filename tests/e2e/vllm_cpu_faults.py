"""Fault injection for tests/e2e/test_vllm_cpu_e2e.py, loaded as a verl external module.

    PYTHONPATH=tests/e2e VERL_USE_EXTERNAL_MODULES=vllm_cpu_faults CPU_ROLLOUT=vllm ... run_grpo.sh

Imported in every verl process after ``recipe.cpu.plugin`` and ``recipe.rollout.extension`` (the
launcher lists the user's modules after its own):

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
