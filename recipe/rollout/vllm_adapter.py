"""verl's vLLM rollout adapter with a guarded weight push (every device, ``rollout.name=vllm``).

``recipe.rollout.extension`` points verl's ``_ROLLOUT_REGISTRY`` entry ``("vllm", "async")`` here;
verl imports this module only in the trainer workers of a vLLM run (so only where vllm is
installed). ``GuardedvLLMServerAdapter`` is verl's ``ServerAdapter`` plus:

- the push cannot hang: the receiver's ``collective_rpc`` future is registered for the sender,
  whose waits are bounded and liveness-checked (``recipe.rollout.weight_push``);
- ``OPSD_VLLM_ROLLOUT_SKIP_WEIGHT_SYNC=1`` (negative control for tests) drops every push after the
  initial one (step 0: the engine starts on dummy weights, ``rollout.load_format: dummy``), so the
  rollout keeps serving the initial weights;
- ``OPSD_ROLLOUT_SYNC_PROBE_LOG=<jsonl>`` (test hook): after every push the rollout samples a
  fixed probe and its log-probs are compared with a float32 Hugging Face forward of the weights
  the trainer pushed (``recipe.rollout.sync_probe``).
"""

from __future__ import annotations

import logging
import os

from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer, vllm_rollout
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from recipe.rollout import sync_probe
from recipe.rollout.weight_push import GuardedSocket, check_receiver, track_receiver, weight_sync_timeout_s

logger = logging.getLogger(__name__)

SKIP_WEIGHT_SYNC_ENV = "OPSD_VLLM_ROLLOUT_SKIP_WEIGHT_SYNC"


class GuardedBucketedWeightSender(bucketed_weight_transfer.BucketedWeightSender):
    """verl's sender whose ZMQ waits are bounded and tied to the receiver's liveness."""

    def _init_socket(self):
        super()._init_socket()
        handle = self.zmq_handle
        self.socket = GuardedSocket(
            self.socket, label=handle, timeout_s=weight_sync_timeout_s(), check_receiver=lambda: check_receiver(handle)
        )


# verl's ServerAdapter.update_weights builds its sender from this module-level name
# (verl/workers/rollout/vllm_rollout/vllm_rollout.py:43,234).
vllm_rollout.BucketedWeightSender = GuardedBucketedWeightSender


class GuardedvLLMServerAdapter(ServerAdapter):
    """verl's vLLM ``ServerAdapter`` with a guarded push and two test hooks (module docstring)."""

    async def _execute_method(self, method, non_block=False, timeout=None, args=(), kwargs=None):
        result = await super()._execute_method(method, non_block=non_block, timeout=timeout, args=args, kwargs=kwargs)
        if method == "update_weights_from_ipc" and non_block and result is not None:
            track_receiver(self.zmq_handle, result)
        return result

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        probe_log = os.environ.get(sync_probe.PROBE_LOG_ENV)
        skip = os.environ.get(SKIP_WEIGHT_SYNC_ENV, "0") == "1" and (global_steps or 0) > 0
        pushed = None
        if probe_log:
            pushed = {}
            weights = sync_probe.tee_weights(weights, pushed)
        if skip:
            for _ in weights:  # every rank drains the generator: FSDP full_tensor() is a collective
                pass
            logger.warning("%s=1: rollout weights NOT updated at step %s (negative control)", SKIP_WEIGHT_SYNC_ENV, global_steps)
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
