"""verl external module of every OPSD / GRPO launch (GPU and CPU): the guarded vLLM weight push.

The launcher (``recipe.launch.verl_env``) lists it in ``VERL_USE_EXTERNAL_MODULES``, which verl imports
in the driver and every Ray worker. On import it points verl's rollout entry ``("vllm", "async")`` at
``recipe.rollout.vllm_adapter.GuardedvLLMServerAdapter`` (docs/vllm_cpu.md#the-guarded-weight-push);
verl resolves the entry lazily (``verl/workers/rollout/base.py:96-111``), so nothing of vLLM is imported
here. By hand::

    VERL_USE_EXTERNAL_MODULES=recipe.rollout.extension python -m verl.trainer.main_ppo ...
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)

VLLM_ROLLOUT = ("vllm", "async")
VERL_VLLM_ADAPTER = "verl.workers.rollout.vllm_rollout.ServerAdapter"
GUARDED_VLLM_ADAPTER = "recipe.rollout.vllm_adapter.GuardedvLLMServerAdapter"


def register_guarded_vllm_adapter(registry: dict | None = None) -> bool:
    """Point ``("vllm", "async")`` at the guarded adapter; True when the entry is (now) the guarded one.

    ``registry``: verl's ``_ROLLOUT_REGISTRY`` unless given (tests). No-op (False) without vLLM or
    when the entry is neither verl's adapter nor the guarded one (a user's module listed earlier
    registered its adapter on purpose).
    """
    if importlib.util.find_spec("vllm") is None:
        return False
    if registry is None:
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY as registry
    current = registry.get(VLLM_ROLLOUT)
    if current not in (VERL_VLLM_ADAPTER, GUARDED_VLLM_ADAPTER):
        logger.warning("rollout %s is %s (not verl's): the guarded weight push is not installed", VLLM_ROLLOUT, current)
        return False
    registry[VLLM_ROLLOUT] = GUARDED_VLLM_ADAPTER
    return True


register_guarded_vllm_adapter()
