"""The probe's cells: one setting of the axes the probe varies (teacher context, reasoning modes, clip, temperature,
beta, learning rate), their grid, and which cells share a launch (``probe.cells``: ``recipe.probe.cell_configs``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NONE = ("none", "null")


@dataclass(frozen=True)
class Cell:
    """One probe cell. ``beta`` / ``lr``: the loss's beta and the actor's learning rate, None = the launch's own."""

    context: str
    student_mode: str
    teacher_mode: str
    clip_tau: float | None
    temperature: float
    beta: float | None = None
    lr: float | None = None

    @property
    def name(self) -> str:
        tau = "none" if self.clip_tau is None else f"{self.clip_tau:g}"
        extra = "".join(f", {key}={value:g}" for key, value in (("beta", self.beta), ("lr", self.lr)) if value is not None)
        return f"{self.context}, {self.student_mode}:{self.teacher_mode}, tau={tau}, T={self.temperature:g}{extra}"

    @property
    def slug(self) -> str:
        return self.name.replace(", ", "_").replace(":", "-").replace("=", "")

    def overrides(self) -> list[str]:
        tau = "null" if self.clip_tau is None else f"{self.clip_tau:g}"
        out = [f"opsd.teacher_context={self.context}", f"opsd.student_mode={self.student_mode}",
               f"opsd.teacher_mode={self.teacher_mode}", f"opsd.loss.clip_tau={tau}",
               f"actor_rollout_ref.rollout.temperature={self.temperature:g}",
               f"opsd.loss.student_temperature={self.temperature:g}"]
        if self.beta is not None:
            out.append(f"opsd.loss.beta={self.beta:g}")
        if self.lr is not None:
            out.append(f"actor_rollout_ref.actor.optim.lr={self.lr:g}")
        return out


def grid(*, contexts, modes, clip_taus, temperatures) -> list[Cell]:
    """Every combination; ``modes`` as ``student:teacher``, a clip tau of ``none`` / ``null`` = no clip."""
    cells = []
    for context in contexts:
        for pair in modes:
            student, sep, teacher = pair.partition(":")
            if not sep:
                raise ValueError(f"--modes {pair!r} must be student:teacher, e.g. think:think or native:native")
            for tau in clip_taus:
                for temperature in temperatures:
                    clip = None if str(tau).lower() in NONE else float(tau)
                    cells.append(Cell(context, student, teacher, clip, float(temperature)))
    return cells


def launch_groups(cells: Sequence[Cell]) -> list[list[Cell]]:
    """The cells that share a launch (``probe.cells``): the same student prompts (student mode; a context that
    changes the student prompt: that context) and learning rate (the optimizer's, restored for every cell). In the
    order of ``cells``."""
    from recipe.common.prompts import student_style

    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        key = (cell.student_mode, cell.context if student_style(cell.context) is not None else None, cell.lr)
        groups.setdefault(key, []).append(cell)
    return list(groups.values())


def cells_override(cells: Sequence[Cell]) -> str:
    """``+probe.cells=[...]``: each cell's teacher context, teacher mode, clip tau, beta and temperature (sampling and
    loss); the learning rate is the launch's (``launch_groups``)."""
    items = []
    for cell in cells:
        tau = "null" if cell.clip_tau is None else f"{cell.clip_tau:g}"
        beta = "" if cell.beta is None else f",beta:{cell.beta:g}"
        items.append(f"{{teacher_context:{cell.context},teacher_mode:{cell.teacher_mode},loss:{{clip_tau:{tau}{beta}}},"
                     f"temperature:{cell.temperature:g}}}")
    return f"+probe.cells=[{','.join(items)}]"
