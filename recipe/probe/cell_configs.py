"""``probe.cells``: several short OPSD runs in one launch (the probe's cells), each cell's block and temperature.

A launch of ``recipe.probe.main_cells`` with ``+probe.cells=[...]`` trains trainer.total_training_steps / len(cells)
steps of each cell from the initial student (weights, optimizer and RNG restored; the first cell's batches replayed:
``recipe.probe.trainer``). A cell sets ``teacher_context`` / ``teacher_mode`` / ``loss`` fields over the launch's
``opsd:`` block, and ``temperature`` (its rollout's sampling and its loss's student temperature), e.g.
``[{loss: {clip_tau: null}}, {teacher_context: unrelated, temperature: 0.7}]``. Metric ``opsd/cell`` is the cell's
index; a monitor stop ends the cell, not the launch. No checkpoints.

Pure: the OPSD config dataclasses only; no verl or Ray import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from recipe.opsd.core.config import OPSDConfig

# what one of probe.cells may set (cell_configs)
CELL_FIELDS = ("teacher_context", "teacher_mode", "loss", "temperature")


def cells_of(config) -> list:
    """``probe.cells`` of the composed hydra ``config`` as plain values; [] without the block."""
    from omegaconf import OmegaConf

    cells = OmegaConf.select(config, "probe.cells", default=None)
    cells = OmegaConf.to_container(cells, resolve=True) if OmegaConf.is_config(cells) else cells
    if cells is None:
        return []
    if not isinstance(cells, list):
        raise ValueError(f"probe.cells must be a list of cells, e.g. [{{teacher_context: unrelated}}], got {cells!r}")
    return cells


def cell_configs(base: OPSDConfig, cells: Sequence) -> list[OPSDConfig]:
    """The block of each of ``cells``: ``base`` with the cell's ``teacher_context`` / ``teacher_mode`` / ``loss`` fields
    in place, validated like ``base``; a cell's ``temperature`` is its ``loss.student_temperature`` (and its
    rollout's, ``cell_temperatures``). A cell that sets another field is refused, naming it: the student's prompts
    and the teacher's weights are the launch's, shared by its cells."""
    out = []
    for index, cell in enumerate(cells):
        if not isinstance(cell, Mapping):
            raise ValueError(f"probe.cells[{index}] must be a mapping, e.g. {{teacher_context: unrelated}}, got {cell!r}")
        other = sorted(set(cell) - set(CELL_FIELDS))
        if other:
            raise ValueError(f"probe.cells[{index}] sets {other}; a cell sets only {list(CELL_FIELDS)}")
        loss = cell.get("loss") or {}
        if not isinstance(loss, Mapping):
            raise ValueError(f"probe.cells[{index}].loss must be a mapping of opsd.loss fields, got {loss!r}")
        temperature = cell.get("temperature")
        if temperature is not None:
            if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
                raise ValueError(f"probe.cells[{index}].temperature must be a number > 0 (the cell's sampling and "
                                 f"loss temperature), got {temperature!r}")
            if loss.get("student_temperature", temperature) != temperature:
                raise ValueError(f"probe.cells[{index}] sets temperature {temperature} and loss.student_temperature "
                                 f"{loss['student_temperature']}: temperature sets both; drop one")
            loss = {**loss, "student_temperature": float(temperature)}
        try:  # a mapping as loss: OPSDConfig builds and validates it as the opsd.loss block
            out.append(dataclasses.replace(
                base, teacher_context=cell.get("teacher_context", base.teacher_context),
                teacher_mode=cell.get("teacher_mode", base.teacher_mode),
                loss={**dataclasses.asdict(base.loss), **loss}))
        except ValueError as err:
            raise ValueError(f"probe.cells[{index}]: {err}") from None
    return out


def cell_temperatures(cells: Sequence[Mapping], *, launch: float) -> list[float]:
    """Each cell's rollout sampling temperature: its ``temperature``, else ``launch`` (the launch's
    ``actor_rollout_ref.rollout.temperature``)."""
    return [float(launch if cell.get("temperature") is None else cell["temperature"]) for cell in cells]


def check_cells(base: OPSDConfig, cells: Sequence) -> list[OPSDConfig]:
    """``cell_configs``, refusing what a launch of cells cannot run: no cell, an EMA teacher (not reset between
    cells) and monitor rollbacks (a rollback relaunches the whole launch)."""
    if not cells:
        raise ValueError("probe.cells is empty: a launch of cells (recipe.probe.main_cells) trains at least one; "
                         "an ordinary run is recipe.opsd.main_opsd")
    configs = cell_configs(base, cells)  # each cell's block is validated like the block itself
    if base.teacher.kind_flags.follows_student:
        raise ValueError("probe.cells: every cell starts from the initial student, but an EMA teacher "
                         "(opsd.teacher.kind=ema) is not reset between cells; use frozen_initial")
    if base.diagnostics.monitor.rollback_on:
        raise ValueError("probe.cells: a rollback relaunches the whole launch; with cells set "
                         "opsd.diagnostics.monitor.rollback_on=[] (a stop ends the cell, the next one starts)")
    return configs
