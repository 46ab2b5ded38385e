"""The ``hf`` CPU rollout with the test hooks of ``opsd_test_hooks.rollout`` (imported lazily by verl)."""

from __future__ import annotations

import hashlib
import json
import logging
import os

import torch

from opsd_test_hooks.rollout import REQUESTS_LOG_ENV, SKIP_WEIGHT_SYNC_ENV, WEIGHTS_LOG_ENV, skip_weight_sync
from recipe.cpu.rollout import HFReplica, HFRolloutServer, HFServerAdapter

logger = logging.getLogger(__name__)


def weights_fingerprint(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """``{name: sha256 of the tensor's float32 bytes}`` (16 hex digits): equal iff bit-identical."""
    digests = {}
    for name, tensor in sorted(state_dict.items()):
        data = tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        digests[name] = hashlib.sha256(data).hexdigest()[:16]
    return digests


class LoggedHFRolloutServer(HFRolloutServer):
    """The server, logging the fingerprint of what it serves after every load (``OPSD_TEST_ROLLOUT_WEIGHTS_LOG``)
    and the sampling temperature of every request (``OPSD_TEST_ROLLOUT_REQUESTS_LOG``)."""

    async def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps=None):
        await super().load_weights(state_dict, global_steps)
        log_path = os.environ.get(WEIGHTS_LOG_ENV)
        if log_path:
            record = {
                "replica": self.replica_rank,
                "global_steps": global_steps,
                "num_weight_updates": self.num_weight_updates,
                "sha256": weights_fingerprint(self.model.state_dict()),
            }
            with open(log_path, "a") as log_file:
                log_file.write(json.dumps(record) + "\n")

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, **kwargs):
        log_path = os.environ.get(REQUESTS_LOG_ENV)
        if log_path:
            record = {"num_weight_updates": self.num_weight_updates, "temperature": sampling_params.get("temperature")}
            with open(log_path, "a") as log_file:
                log_file.write(json.dumps(record) + "\n")
        return await super().generate(prompt_ids, sampling_params, request_id, image_data, video_data, **kwargs)

    def weights_snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the served weights."""
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}

    def stats(self) -> dict[str, int]:
        """Number of generate batches and weight updates served."""
        return {"num_batches": self.num_batches, "num_weight_updates": self.num_weight_updates}


class HookedHFReplica(HFReplica):
    server_class = LoggedHFRolloutServer


class HookedHFServerAdapter(HFServerAdapter):
    """The trainer-side adapter; drops pushes after step 0 with ``OPSD_TEST_SKIP_WEIGHT_SYNC=1``."""

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps=None, peft_config=None,
                             **kwargs):
        if not skip_weight_sync(global_steps):
            return await super().update_weights(weights, wire_format=wire_format, global_steps=global_steps,
                                                peft_config=peft_config, **kwargs)
        for _ in weights:  # every rank drains the generator: FSDP full_tensor() is a collective
            pass
        logger.warning("%s=1: rollout weights NOT updated at step %s (negative control)", SKIP_WEIGHT_SYNC_ENV,
                       global_steps)
        if self.is_sender:
            await self._server_handle().set_global_steps.remote(global_steps)
