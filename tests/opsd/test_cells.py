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
    trainer.config = SimpleNamespace(trainer=SimpleNamespace(total_epochs=epochs, default_local_dir=str(tmp_path)))
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
