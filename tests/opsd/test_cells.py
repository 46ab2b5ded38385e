"""``opsd.cells`` in the trainer's loop (``RayOPSDTrainer._training_batches`` and ``Cells``), with recording stand-ins
for verl's worker group and checkpoint manager: which batches each cell trains on, at which global steps, and the
calls that reset the student between cells. The launch itself: tests/e2e/test_probe_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer


class Recorder:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __getattr__(self, method):
        return lambda *args, **kwargs: self.calls.append((f"{self.name}.{method}", args))


def _trainer(tmp_path, *, cells, total_steps, batches_per_epoch=2, epochs=2):
    calls = []
    trainer = object.__new__(RayOPSDTrainer)
    trainer.opsd = OPSDConfig(cells=cells)
    trainer.cells = None
    trainer.config = SimpleNamespace(trainer=SimpleNamespace(total_epochs=epochs, default_local_dir=str(tmp_path)),
                                     actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(temperature=1.1)))
    trainer.async_rollout_manager = SimpleNamespace(agent_loop_workers="the agent-loop workers")
    trainer.train_dataloader = [f"b{i}" for i in range(batches_per_epoch)]
    trainer.total_training_steps, trainer.global_steps = total_steps, 1
    trainer.actor_rollout_wg = Recorder(calls, "wg")
    trainer.checkpoint_manager = Recorder(calls, "ckpt")
    trainer._init_opsd = lambda opsd: calls.append(("init_opsd", (opsd.teacher_context, opsd.loss.clip_tau)))
    return trainer, calls


def _run(trainer, *, stop_at=()):
    """Drive the generator as fit does: a step per batch, ``global_steps + 1`` after it; a stop at ``stop_at``."""
    seen = []
    for epoch, batch in trainer._training_batches(0):
        seen.append((trainer.global_steps, trainer.cells.index, epoch, batch, trainer.step_offset))
        if trainer.cells.end_early(trainer.global_steps in stop_at):
            break
        trainer.global_steps += 1
    return seen


def test_every_cell_trains_the_first_cells_batches_from_the_saved_initial_state(tmp_path):
    trainer, calls = _trainer(tmp_path, cells=[{}, {"teacher_context": "unrelated", "loss": {"clip_tau": None}}],
                              total_steps=6)
    seen = _run(trainer)
    first = [(0, "b0"), (0, "b1"), (1, "b0")]  # 3 steps per cell across verl's epochs
    assert seen == [(s, 0, e, b, 0) for s, (e, b) in zip((1, 2, 3), first)] + \
        [(s, 1, e, b, 3) for s, (e, b) in zip((4, 5, 6), first)]
    directory = str(tmp_path / "cell_start")
    assert calls == [
        ("wg.save_checkpoint", (directory, None, 0)),  # before any update
        ("wg.set_opsd_cell", (0,)), ("init_opsd", ("full_solution", 0.05)),
        ("ckpt.sleep_replicas", ()), ("wg.load_checkpoint", (directory, None)), ("ckpt.update_weights", (4,)),
        ("wg.set_opsd_cell", (1,)), ("init_opsd", ("unrelated", None)),
    ]
    assert trainer.cell_steps == 3


def test_a_cell_with_its_own_temperature_samples_and_trains_at_it(tmp_path, monkeypatch):
    import recipe.opsd.opsd_ray_trainer as module

    trainer, calls = _trainer(tmp_path, cells=[{"temperature": 0.7}, {}, {"loss": {"clip_tau": None}}, {"temperature": 1.1}],
                              total_steps=4)
    monkeypatch.setattr(module, "set_sampling_temperature",
                        lambda workers, t: calls.append(("sampling", (workers, t, trainer.config.actor_rollout_ref.rollout.temperature))))
    temperatures = []
    trainer._init_opsd = lambda opsd: temperatures.append(opsd.loss.student_temperature)
    _run(trainer)
    # the launch's 1.1 for the cells without one; a switch only where the temperature changes
    assert [c for c in calls if c[0] == "sampling"] == [("sampling", ("the agent-loop workers", 0.7, 0.7)),
                                                        ("sampling", ("the agent-loop workers", 1.1, 1.1))]
    assert temperatures == [0.7, 1.1, 1.1, 1.1]  # the loss's student temperature of each cell


def test_the_agent_loop_workers_sample_at_the_temperature_set(monkeypatch):
    """``set_sampling_temperature`` on stand-ins of verl's agent-loop workers holding verl's ``RolloutConfig``, run
    as Ray's ``__ray_call__`` runs it (the function, the worker); verl reads that config on every call."""
    import inspect

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.config import RolloutConfig

    import recipe.opsd.opsd_ray_trainer as module

    class Worker:
        def __init__(self):
            self.rollout_config = RolloutConfig(name="hf", temperature=1.1)
            self.__ray_call__ = SimpleNamespace(remote=lambda fn, *args: fn(self, *args))

    workers = [Worker(), Worker()]
    monkeypatch.setattr(module.ray, "get", lambda values: values)
    module.set_sampling_temperature(workers, 0.7)
    assert [w.rollout_config.temperature for w in workers] == [0.7, 0.7]
    assert workers[0].rollout_config.top_k == RolloutConfig(name="hf").top_k  # the rest of the config unchanged
    source = inspect.getsource(AgentLoopWorker.generate_sequences)
    assert "config = self.rollout_config" in source and "temperature=config.temperature" in source


def test_a_stop_ends_the_cell_and_the_next_cell_still_gets_every_batch(tmp_path):
    trainer, _ = _trainer(tmp_path, cells=[{}, {"loss": {"clip_tau": None}}], total_steps=6)
    seen = _run(trainer, stop_at=(1,))  # the monitor stops the first cell after its first step
    assert [(s, c, b) for s, c, _, b, _ in seen] == [(1, 0, "b0"), (4, 1, "b0"), (5, 1, "b1"), (6, 1, "b0")]
    trainer, _ = _trainer(tmp_path, cells=[{}, {}], total_steps=4)
    assert [s for s, *_ in _run(trainer, stop_at=(3,))] == [1, 2, 3]  # a stop in the last cell ends the launch


def test_cells_need_the_data_for_their_steps(tmp_path):
    trainer, _ = _trainer(tmp_path, cells=[{}, {}], total_steps=10, batches_per_epoch=2, epochs=2)
    with pytest.raises(RuntimeError, match="each cell trains 5 steps, but the data has 4 batches"):
        _run(trainer)


def test_without_cells_the_loop_is_verls_epochs(tmp_path):
    trainer, calls = _trainer(tmp_path, cells=[], total_steps=4)
    assert list(trainer._training_batches(1)) == [(1, "b0"), (1, "b1")] and calls == []
