"""verl external module of a launch that checks the rollout's weight sync (``scripts/gpu_check.py``).

Listed in ``VERL_USE_EXTERNAL_MODULES`` after ``recipe.rollout.extension`` (the launcher keeps a
user's modules after its own and forwards the list to every Ray worker), it points verl's rollout
registry entry ``("vllm", "async")`` at ``recipe.rollout.vllm_adapter.SyncCheckedvLLMServerAdapter``:
the guarded adapter that, after every weight push, compares the rollout's log-probs of a fixed probe
with a float32 forward of the pushed tensors and appends one JSON line to ``OPSD_SYNC_CHECK_LOG``
(``recipe.rollout.sync_probe``). verl resolves the entry lazily, so nothing of vLLM is imported here;
without vLLM it does nothing. No other launch loads it.
"""

from __future__ import annotations

import importlib.util

from recipe.rollout.extension import GUARDED_VLLM_ADAPTER, VERL_VLLM_ADAPTER, VLLM_ROLLOUT

MODULE = "recipe.rollout.sync_check"
LOG_ENV = "OPSD_SYNC_CHECK_LOG"
SYNC_CHECKED_VLLM_ADAPTER = "recipe.rollout.vllm_adapter.SyncCheckedvLLMServerAdapter"


def register_sync_checked_adapter(registry: dict | None = None) -> bool:
    """Point ``("vllm", "async")`` at the sync-checked adapter (over verl's or the guarded one); True when it is.

    ``registry``: verl's ``_ROLLOUT_REGISTRY`` unless given (tests). No-op (False) without vLLM.
    """
    if importlib.util.find_spec("vllm") is None:
        return False
    if registry is None:
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY as registry
    if registry.get(VLLM_ROLLOUT) not in (VERL_VLLM_ADAPTER, GUARDED_VLLM_ADAPTER, SYNC_CHECKED_VLLM_ADAPTER):
        return False
    registry[VLLM_ROLLOUT] = SYNC_CHECKED_VLLM_ADAPTER
    return True


register_sync_checked_adapter()
