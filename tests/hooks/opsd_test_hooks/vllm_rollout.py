"""verl's vLLM rollout (the guarded adapter) with the test hooks of ``opsd_test_hooks.rollout``."""

from __future__ import annotations

import logging
import os

from opsd_test_hooks.rollout import PROBE_LOG_ENV, SKIP_WEIGHT_SYNC_ENV, skip_weight_sync
from recipe.rollout import sync_probe
from recipe.rollout.vllm_adapter import GuardedvLLMServerAdapter

logger = logging.getLogger(__name__)


class HookedvLLMServerAdapter(GuardedvLLMServerAdapter):
    """The guarded adapter plus the sync probe (``OPSD_TEST_SYNC_PROBE_LOG``) and the negative control
    (``OPSD_TEST_SKIP_WEIGHT_SYNC=1``: pushes after step 0 dropped; the engine starts on dummy weights,
    ``rollout.load_format: dummy``, so step 0's push still happens)."""

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        probe_log = os.environ.get(PROBE_LOG_ENV)
        pushed = None
        if probe_log:
            pushed = {}
            weights = sync_probe.tee_weights(weights, pushed)
        if skip_weight_sync(global_steps):
            for _ in weights:  # every rank drains the generator: FSDP full_tensor() is a collective
                pass
            logger.warning("%s=1: rollout weights NOT updated at step %s (negative control)", SKIP_WEIGHT_SYNC_ENV,
                           global_steps)
            if self._ensure_server_handle() and global_steps is not None:
                await self.server_handle.set_global_steps.remote(global_steps)
        else:
            await super().update_weights(weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
        if probe_log and self._ensure_server_handle():
            await sync_probe.probe_and_log(
                server=self.server_handle,
                hf_config=self.model_config.hf_config,
                pushed=pushed,
                global_steps=global_steps,
                replica_rank=self.replica_rank,
                log_path=probe_log,
            )
