"""The CPU path's checkpoint engine ``object_store`` (trainer-to-rollout weight push across pools),
driven as verl's ``CheckpointEngineManager`` drives it: prepare -> build_topology ->
init_process_group -> send (rank 0) / walk (other trainer ranks) || receive (every rollout worker)."""

import pytest
import ray
import torch

from recipe.cpu.checkpoint_engine import BACKEND, ObjectStoreCheckpointEngine


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _engines(actors: int, rollouts: int):
    trainer = [ObjectStoreCheckpointEngine(bucket_size=1 << 20, is_master=rank == 0) for rank in range(actors)]
    rollout = [ObjectStoreCheckpointEngine(bucket_size=1 << 20) for _ in range(rollouts)]
    metadata = [engine.prepare() for engine in trainer + rollout]
    actor_kwargs, rollout_kwargs = ObjectStoreCheckpointEngine.build_topology(actors, rollouts, metadata)
    for side, kwargs in ((trainer, actor_kwargs), (rollout, rollout_kwargs)):
        for i, engine in enumerate(side):
            engine.init_process_group(**{key: values[i] for key, values in kwargs.items()})
    return trainer, rollout


def test_registered_under_its_backend_name():
    from verl.checkpoint_engine import CheckpointEngineRegistry

    assert CheckpointEngineRegistry.get(BACKEND) is ObjectStoreCheckpointEngine


async def _push(trainer, weights):
    walked = []

    def generator(record):
        for name, tensor in weights.items():
            record.append(name)
            yield name, tensor

    for engine in trainer:
        await engine.send_weights(generator(walked))
    return walked


@pytest.mark.slow
def test_every_rollout_worker_receives_rank_0s_tensors_and_every_rank_walks(local_ray):
    import asyncio

    weights = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1.5, -2.0])}
    trainer, rollout = _engines(actors=2, rollouts=2)
    walked = asyncio.run(_push(trainer, weights))
    assert walked == ["a", "b", "a", "b"]  # both trainer ranks drained the (collective) generator
    for engine in rollout:
        received = dict(engine.receive_weights(global_steps=3))
        assert received.keys() == weights.keys()
        for name, tensor in weights.items():
            torch.testing.assert_close(received[name], tensor, rtol=0, atol=0)
    # the next push has a new key: a receiver never reads the previous push's tensors
    trainer2, rollout2 = _engines(actors=1, rollouts=1)
    asyncio.run(_push(trainer2, {"a": torch.zeros(2, 3), "b": torch.zeros(2)}))
    assert dict(rollout2[0].receive_weights())["a"].abs().sum() == 0
    for engine in trainer + rollout:
        engine.finalize()
        assert engine.role is None


def test_roles_are_enforced():
    engine = ObjectStoreCheckpointEngine()
    with pytest.raises(RuntimeError, match="receive_weights on a worker of role None"):
        next(engine.receive_weights())
    with pytest.raises(ValueError, match="trainer rank 0 must be the master"):
        ObjectStoreCheckpointEngine.build_topology(1, 1, [{"is_master": False}, {"is_master": False}])
