"""Checkpoint engine ``object_store``: the CPU path's trainer-to-rollout weight push between separate
resource pools (verl's one-step-off and fully-async trainers) through Ray's object store, no NCCL.

``recipe.async_rl.config`` selects it on the CPU (``actor_rollout_ref.rollout.checkpoint_engine.backend=
object_store`` and ``...custom_backend_module=recipe.cpu.checkpoint_engine``: verl imports the module in
every process that builds an engine); the receiving adapter is ``recipe.cpu.rollout.HFServerAdapter``.
Why not verl's own backends, and the payload's size: docs/cpu_path.md.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Generator

import ray
import torch

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "object_store"
MAILBOX_NAME = "opsd_weight_mailbox"


class WeightMailbox:
    """Ray actor: the newest push's object reference, by key; ``take`` waits until it is there."""

    def __init__(self):
        self._pushes: dict[str, asyncio.Future] = {}

    def _slot(self, key: str) -> asyncio.Future:
        if key not in self._pushes:
            self._pushes[key] = asyncio.get_running_loop().create_future()
        return self._pushes[key]

    async def put(self, key: str, refs: list) -> None:
        # the previous push is complete (the manager awaits every worker before the next): drop it
        for old in [k for k in self._pushes if k != key]:
            del self._pushes[old]
        self._slot(key).set_result(refs)

    async def take(self, key: str) -> list:
        return await self._slot(key)


_MAILBOX = []  # this process's handle: a named actor lives while its creator holds a handle


def mailbox():
    """The job's mailbox actor (created on first use by the process that builds the topology, which
    keeps it alive; no CPU reserved)."""
    if not _MAILBOX:
        _MAILBOX.append(ray.remote(WeightMailbox).options(name=MAILBOX_NAME, get_if_exists=True, num_cpus=0).remote())
    return _MAILBOX[0]


@CheckpointEngineRegistry.register(BACKEND)
class ObjectStoreCheckpointEngine(CheckpointEngine):
    """verl ``CheckpointEngine`` over Ray's object store.

    verl 0.9.1 calls it through ``CheckpointEngineManager.update_weights`` (``verl/checkpoint_engine/base.py``):
    ``send_weights`` on the trainer workers, ``receive_weights`` on the rollout workers. Trainer rank 0
    collects the full tensors (every rank walks the generator: FSDP's ``full_tensor`` is a collective),
    ``ray.put``-s them as one object and hands the reference to the ``WeightMailbox`` actor under this
    push's key (``build_topology``: one key per push); every rollout worker takes the reference from the
    mailbox and yields the tensors to its server adapter.
    """

    def __init__(self, bucket_size: int = 0, is_master: bool = False, **kwargs) -> None:
        self.is_master = is_master
        self.key: str | None = None
        self.role: str | None = None

    def prepare(self) -> dict:
        return {"is_master": self.is_master}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """Trainer rank 0 sends, the other trainer ranks only walk their generator, every rollout
        worker receives; all under one fresh key."""
        if not metadata or not metadata[0].get("is_master"):
            raise ValueError("object_store checkpoint engine: trainer rank 0 must be the master")
        mailbox()  # exists before either side asks for it
        key = uuid.uuid4().hex
        actor = {"key": [key] * actor_wg_world_size, "role": ["send"] + ["walk"] * (actor_wg_world_size - 1)}
        rollout = {"key": [key] * rollout_world_size, "role": ["receive"] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, *, key: str, role: str) -> None:
        self.key, self.role = key, role

    def finalize(self) -> None:
        self.key, self.role = None, None

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None):
        if self.role not in ("send", "walk"):
            raise RuntimeError(f"object_store checkpoint engine: send_weights on a worker of role {self.role!r}")
        named_tensors = []
        async for name, tensor in ensure_async_iterator(weights):
            if self.role == "send":
                named_tensors.append((name, tensor.detach().to("cpu", copy=True)))
        if self.role == "send":
            await mailbox().put.remote(self.key, [ray.put(named_tensors)])
        return {}

    def receive_weights(self, global_steps: int | None = None) -> Generator[tuple[str, torch.Tensor], None, None]:
        """A plain generator (the HF server adapter iterates it synchronously); blocks until trainer
        rank 0 has put this push's tensors."""
        if self.role != "receive":
            raise RuntimeError(f"object_store checkpoint engine: receive_weights on a worker of role {self.role!r}")
        (ref,) = ray.get(mailbox().take.remote(self.key))
        yield from ray.get(ref)
