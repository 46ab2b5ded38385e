"""verl's vLLM rollout adapter with a guarded weight push (every device, ``rollout.name=vllm``).

``recipe.rollout.extension`` points verl's ``_ROLLOUT_REGISTRY`` entry ``("vllm", "async")`` here;
verl imports this module only in the trainer workers of a vLLM run (so only where vllm is
installed). ``GuardedvLLMServerAdapter`` is verl's ``ServerAdapter`` whose push cannot hang: the
receiver's ``collective_rpc`` future is registered for the sender, whose waits are bounded and
liveness-checked (``recipe.rollout.weight_push``). ``SyncCheckedvLLMServerAdapter`` adds the
weight-sync probe after every push (``recipe.rollout.sync_probe``; registered only by the external
module ``recipe.rollout.sync_check``, which the first-hour GPU check loads).
"""

from __future__ import annotations

import os

from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer, vllm_rollout
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from recipe.rollout.weight_push import GuardedSocket, check_receiver, track_receiver, weight_sync_timeout_s


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
    """verl's vLLM ``ServerAdapter`` whose weight push raises or times out instead of hanging."""

    async def _execute_method(self, method, non_block=False, timeout=None, args=(), kwargs=None):
        result = await super()._execute_method(method, non_block=non_block, timeout=timeout, args=args, kwargs=kwargs)
        if method == "update_weights_from_ipc" and non_block and result is not None:
            track_receiver(self.zmq_handle, result)
        return result


class SyncCheckedvLLMServerAdapter(GuardedvLLMServerAdapter):
    """The guarded adapter plus the weight-sync probe after every push, logged to ``OPSD_SYNC_CHECK_LOG``
    (``recipe.rollout.sync_check``): the rollout's log-probs of a fixed probe against a float32 forward of
    exactly the pushed tensors (``recipe.rollout.sync_probe``)."""

    async def update_weights(self, weights, global_steps=None, **kwargs):
        from recipe.rollout import sync_probe
        from recipe.rollout.sync_check import LOG_ENV

        log_path = os.environ.get(LOG_ENV)
        pushed: dict = {}
        if log_path:
            weights = sync_probe.tee_weights(weights, pushed)
        await super().update_weights(weights, global_steps=global_steps, **kwargs)
        if log_path and self._ensure_server_handle():
            await sync_probe.probe_and_log(server=self.server_handle, hf_config=self.model_config.hf_config,
                                           pushed=pushed, global_steps=global_steps, replica_rank=self.replica_rank,
                                           log_path=log_path)
