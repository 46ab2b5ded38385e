"""The probe's cells on verl (``recipe.probe.main_cells``): the OPSD trainer, worker and task runner, subclassed.

``CellsTrainer`` trains each of ``probe.cells`` (``recipe.probe.cell_configs``) for its steps from the initial
student on the first cell's batches (``Cells``); ``CellsWorker`` switches the workers' loss to a cell's
(``set_opsd_cell``); ``set_sampling_temperature`` sets verl's agent-loop workers' temperature for a cell with its
own; ``CellsTaskRunner`` is ``recipe.opsd.main_opsd.OPSDTaskRunner`` building both. Everything else is the OPSD
recipe's synchronous run.
"""

from __future__ import annotations

import os
import shutil
from functools import partial

import ray

from verl.single_controller.base.decorator import Dispatch, register

from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.main_opsd import OPSDTaskRunner
from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer
from recipe.opsd.worker import OPSDActorRolloutRefWorker
from recipe.probe.cell_configs import cell_configs, cell_temperatures, cells_of


class CellsTrainer(RayOPSDTrainer):
    """``RayOPSDTrainer`` over ``probe.cells``: each cell's steps in turn (``_training_batches``), metric
    ``opsd/cell``, a stop that ends a cell but not the launch (``_after_step``)."""

    cells: Cells | None = None  # the cells' schedule, set up by _training_batches

    def _training_batches(self, current_epoch: int):
        """``(epoch, batch_dict)`` of every step: the first cell's batches (drawn from verl's epochs over the
        dataloader) and the same batches again for every later cell, each cell started from the initial student
        (``Cells``)."""
        dataloader = super()._training_batches(current_epoch)
        self.cells = Cells(self, directory=os.path.join(self.config.trainer.default_local_dir, "cell_start"))
        first = []
        for index in range(len(self.cells.configs)):
            self.cells.start(index)
            for step in range(self.cells.steps):
                if index == 0:
                    first.append(next(dataloader, None))
                    if first[-1] is None:
                        raise RuntimeError(f"probe.cells: each cell trains {self.cells.steps} steps, but the data has "
                                           f"{step} batches (trainer.total_epochs x batches per epoch)")
                if not self.cells.stopped:  # a cell the monitor stopped skips its other steps
                    self.global_steps = self.cells.first_step + step
                    yield first[step]

    def _after_step(self, stop: bool, metrics: dict) -> bool:
        metrics["opsd/cell"] = self.cells.index
        return self.cells.end_early(stop)  # a stop ends the cell; the launch goes on to the next

    def _finish_run(self, *, stop: bool) -> None:
        self.cells.close()
        super()._finish_run(stop=stop)


class Cells:
    """``probe.cells`` on a ``CellsTrainer``: several short runs in one launch (the compatibility probe's cells).

    Before the first cell the actor's state (weights, optimizer, learning-rate schedule, RNG) is saved with verl's
    worker checkpoint call under ``directory``; every later cell loads it back, pushes those weights to the rollout
    and switches the trainer's and the workers' ``opsd`` block to its own (``cell_configs``, ``set_opsd_cell``),
    with a new collapse monitor whose windows count the cell's steps. A cell with its own ``temperature`` sets
    verl's agent-loop workers' sampling temperature (``set_sampling_temperature``). The trainer replays the first
    cell's batches (``CellsTrainer._training_batches``).
    """

    def __init__(self, trainer: CellsTrainer, *, directory: str):
        self.trainer, self.directory = trainer, directory
        self.specs = cells_of(trainer.config)  # the cells as the launch gives them
        self.configs = cell_configs(trainer.opsd, self.specs)
        launch_temperature = float(trainer.config.actor_rollout_ref.rollout.temperature)
        self.temperatures = cell_temperatures(self.specs, launch=launch_temperature)
        self.sampling_temperature = launch_temperature
        self.steps = trainer.total_training_steps // len(self.configs)
        self.index, self.first_step, self.stopped = -1, 1, False
        trainer.actor_rollout_wg.save_checkpoint(directory, None, 0, max_ckpt_to_keep=None)

    def start(self, index: int) -> None:
        trainer = self.trainer
        if index > 0:
            trainer.checkpoint_manager.sleep_replicas()
            trainer.actor_rollout_wg.load_checkpoint(self.directory, None, del_local_after_load=False)
            trainer.checkpoint_manager.update_weights(trainer.global_steps)
        trainer.actor_rollout_wg.set_opsd_cell(index)
        trainer._init_opsd(self.configs[index])
        if self.temperatures[index] != self.sampling_temperature:
            self.sampling_temperature = self.temperatures[index]
            trainer.config.actor_rollout_ref.rollout.temperature = self.sampling_temperature
            set_sampling_temperature(trainer.async_rollout_manager.agent_loop_workers, self.sampling_temperature)
        trainer.step_offset, trainer.segment_steps = index * self.steps, self.steps
        self.index, self.first_step, self.stopped = index, index * self.steps + 1, False
        print(f"[opsd] cell {index + 1}/{len(self.configs)}: steps {self.first_step}-{self.first_step + self.steps - 1}, "
              f"{self.specs[index]}", flush=True)

    def end_early(self, stop: bool) -> bool:
        """A stop (collapse monitor, non-finite guard) ends this cell when another follows: False then."""
        if not stop or self.index == len(self.configs) - 1:
            return stop
        self.stopped = True
        print(f"[opsd] cell {self.index + 1} stopped at step {self.trainer.global_steps}; the next cell starts", flush=True)
        return False

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def set_sampling_temperature(agent_loop_workers, temperature: float) -> None:
    """The sampling temperature of verl's agent-loop workers (read from their ``rollout_config`` on every
    ``generate_sequences``; verl fixes it when the worker starts): set on each worker through Ray's ``__ray_call__``."""

    def apply(worker, value):
        import dataclasses

        worker.rollout_config = dataclasses.replace(worker.rollout_config, temperature=value)
        return worker.rollout_config.temperature

    served = ray.get([worker.__ray_call__.remote(apply, float(temperature)) for worker in agent_loop_workers])
    if served != [float(temperature)] * len(agent_loop_workers):
        raise RuntimeError(f"agent-loop workers sample at {served}, not {temperature}")


class CellsWorker(OPSDActorRolloutRefWorker):
    """The OPSD worker that can switch to a cell's block; ``cells`` (``probe.cells``) is set on the subclass that
    ``CellsTaskRunner`` builds."""

    cells: list | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_opsd_cell(self, index: int) -> None:
        """``probe.cells[index]`` (``cell_configs``) is this worker's block from the next update on: its loss
        settings and objective; the teacher's weights and head stay."""
        if self.actor is None:
            return
        self.opsd = cell_configs(OPSDConfig.from_hydra(self.opsd_config), self.cells)[index]
        current = self.actor.loss_fn
        self.objective = self.opsd.loss.build_objective()
        self.actor.set_loss_fn(partial(current.func, **{**current.keywords, "loss_config": self.opsd.loss,
                                                        "objective": self.objective}))


class CellsTaskRunner(OPSDTaskRunner):
    """``OPSDTaskRunner`` with ``CellsTrainer`` and a ``CellsWorker`` that holds the launch's ``probe.cells``."""

    def trainer_class(self) -> type:
        return CellsTrainer

    def worker_base(self, config) -> type:
        return type("OPSDCellsWorker", (CellsWorker,), {"cells": cells_of(config)})
