"""verl external module of every OPSD / GRPO launch (GPU and CPU): the guarded vLLM weight push.

The launcher (``recipe.launch.verl_env``) lists this module in ``VERL_USE_EXTERNAL_MODULES``, which
verl imports in the driver and in every Ray worker (``verl/__init__.py``), and forwards that
variable to the workers of every node through Ray's ``runtime_env``. By hand::

    VERL_USE_EXTERNAL_MODULES=recipe.rollout.extension python -m verl.trainer.main_ppo ...

On import it points verl's rollout registry entry ``("vllm", "async")`` at
``recipe.rollout.vllm_adapter.GuardedvLLMServerAdapter`` (verl's ``ServerAdapter`` whose weight
push raises the rollout server's error, or times out, instead of hanging the trainer forever:
``recipe.rollout.weight_push``; docs/vllm_cpu.md). verl resolves the entry lazily when a trainer
worker builds its rollout (``verl/workers/rollout/base.py:96-111``), so nothing of vLLM is imported
here. It does nothing when vLLM is not installed, and it leaves an entry alone that is not verl's
own (a user's module listed earlier registered its adapter on purpose).
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
    when the entry is neither verl's adapter nor the guarded one.
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
