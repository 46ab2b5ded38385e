"""``probe.cells``: each cell's block and the launch's checks before Ray (``recipe.probe.cell_configs``,
``recipe.probe.main_cells``), and the trainer's loop (``CellsTrainer._training_batches`` and ``Cells``) with recording
stand-ins for verl's worker group and checkpoint manager: which batches each cell trains on, at which global steps,
and the calls that reset the student between cells. The launch itself: tests/e2e/test_probe_e2e.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer
from recipe.opsd.startup import prepare_config
from recipe.probe.cell_configs import cell_temperatures, cells_of
from recipe.probe.main_cells import OPSD_CONFIG_DIR, prepare_cells
from recipe.probe.trainer import CellsTrainer


class Recorder:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __getattr__(self, method):
        return lambda *args, **kwargs: self.calls.append((f"{self.name}.{method}", args))


def _trainer(tmp_path, *, cells, total_steps, batches_per_epoch=2, epochs=2, cls=CellsTrainer):
    calls = []
    trainer = object.__new__(cls)
    trainer.opsd = OPSDConfig()
    trainer.cells = None
    trainer.config = OmegaConf.create({"trainer": {"total_epochs": epochs, "default_local_dir": str(tmp_path)},
                                       "actor_rollout_ref": {"rollout": {"temperature": 1.1}}, "probe": {"cells": cells}})
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
    assert trainer.segment_steps == 3


def test_a_cell_with_its_own_temperature_samples_and_trains_at_it(tmp_path, monkeypatch):
    import recipe.probe.trainer as module

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

    import recipe.probe.trainer as module

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
    trainer, calls = _trainer(tmp_path, cells=[], total_steps=4, cls=RayOPSDTrainer)
    assert list(trainer._training_batches(1)) == [(1, "b0"), (1, "b1")] and calls == []


def _compose(overrides=()):
    with initialize_config_dir(config_dir=OPSD_CONFIG_DIR, version_base=None):
        return compose(config_name="opsd_trainer", overrides=list(overrides))


def _prepared(overrides):
    """What the cells' start-up checks validate: the launch's ``opsd:`` block, then its ``probe.cells``."""
    cfg = _compose(overrides)
    opsd = prepare_config(cfg)
    return cfg, opsd, prepare_cells(cfg, opsd)


CELLS_RUN = ["trainer.total_training_steps=4", "trainer.save_freq=-1", "trainer.resume_mode=disable"]


def test_cells_are_the_block_with_each_cells_fields_and_their_launch_is_checked_before_ray():
    _, opsd, (first, second) = _prepared([*CELLS_RUN, "opsd.loss.beta=0.5",
                                          "+probe.cells=[{loss:{clip_tau:null}},{teacher_context:unrelated,teacher_mode:no_think}]"])
    assert (first.teacher_context, first.loss.clip_tau, first.loss.beta) == ("full_solution", None, 0.5)
    assert (second.teacher_context, second.teacher_mode, second.loss.clip_tau, second.loss.beta) == (
        "unrelated", "no_think", 0.05, 0.5)
    # the block itself is unchanged, and holds no cells (they are the probe's own block)
    assert opsd.loss.clip_tau == 0.05 and "cells" not in {f.name for f in dataclasses.fields(OPSDConfig)}
    cfg, _, warm = _prepared([*CELLS_RUN, "+probe.cells=[{temperature:0.7},{}]"])
    assert [c.loss.student_temperature for c in warm] == [0.7, 1.1]
    assert cell_temperatures(cells_of(cfg), launch=0.9) == [0.7, 0.9]  # a cell without one samples at the launch's
    one_cell = "+probe.cells=[{loss:{clip_tau:null}},{}]"
    for overrides, message in (
        (["trainer.total_training_steps=5", one_cell], r"total_training_steps \(5\) must be a multiple of the 2 cells"),
        ([*CELLS_RUN, "trainer.save_freq=2", one_cell], "save_freq=-1 and trainer.resume_mode=disable"),
        ([*CELLS_RUN, "+probe.cells=[{student_mode:no_think}]"], r"cells\[0\] sets \['student_mode'\]; a cell sets only"),
        ([*CELLS_RUN, "+probe.cells=[{},{loss:{clip_tau:-1}}]"], r"probe.cells\[1\]: opsd.loss.clip_tau"),
        ([*CELLS_RUN, "+probe.cells=[{},{loss:{tau:1}}]"], r"probe.cells\[1\]: unknown field\(s\) \['opsd.loss.tau'\]"),
        ([*CELLS_RUN, "+probe.cells=[{},{temperature:0}]"], r"probe.cells\[1\].temperature must be a number > 0"),
        ([*CELLS_RUN, "+probe.cells=[{temperature:0.7,loss:{student_temperature:0.5}},{}]"], "temperature sets both"),
        ([*CELLS_RUN, "opsd.teacher.kind=ema", "opsd.teacher.ema_decay=0.5", one_cell], "EMA teacher"),
        ([*CELLS_RUN, "opsd.diagnostics.monitor.rollback_on=[length]", one_cell], "rollback_on=\\[\\]"),
    ):
        with pytest.raises(ValueError, match=message):
            _prepared(overrides)


def test_the_launcher_starts_a_launch_of_cells_on_their_entry_point_and_checks_them_before_ray(launch_inputs, tmp_path):
    """``probe.cells_recipe`` through the launcher: the probe's own block composes as hydra composes it (verl's
    config checks take it), the command starts the cells' entry point, and a bad cell stops the plan with the line
    the launch would print."""
    from recipe.launch.config import Settings, compose, get_recipe
    from recipe.launch.run import plan
    from recipe.probe.probe import cells_recipe

    recipe = cells_recipe(get_recipe("opsd"))
    settings = Settings(device="cpu", model_path=str(launch_inputs.model), train_files=str(launch_inputs.train),
                        ckpt_dir=str(tmp_path / "run"))
    cells = "+probe.cells=[{loss:{clip_tau:null}},{teacher_context:unrelated,temperature:0.7}]"
    launch = plan(recipe, settings, ["+demo=tiny", *CELLS_RUN, cells], environ=launch_inputs.env)
    assert launch.command[1:3] == ["-m", "recipe.probe.main_cells"] and cells in launch.command
    assert OmegaConf.to_container(launch.config) == OmegaConf.to_container(compose(recipe, launch.overrides.as_list()))
    assert cells_of(launch.config) == [{"loss": {"clip_tau": None}}, {"teacher_context": "unrelated", "temperature": 0.7}]
    with pytest.raises(ValueError, match=r"^config: probe.cells\[1\]: opsd.loss.clip_tau"):
        plan(recipe, settings, ["+demo=tiny", *CELLS_RUN, "+probe.cells=[{},{loss:{clip_tau:-1}}]"], environ=launch_inputs.env)
