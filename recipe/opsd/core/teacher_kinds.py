"""Teacher kinds of OPSD (``opsd.teacher.kind``) and their pure parts (torch / stdlib; no verl or ray).

Which weights score the student's rollouts under the privileged prompt:

- ``frozen_initial`` (default, the paper: "a frozen copy pi_theta0 of the initial student as the
  teacher"): verl's reference slot loaded from the student's checkpoint, never updated.
- ``checkpoint``: another model (``opsd.teacher.path``: a directory or a Hub id) with the
  student's tokenizer, frozen: the paper's cross-model rows ("A parenthetical teacher denotes a
  cross-model experiment") and the SFT-10 no-privilege control with the pre-SFT model as teacher.
- ``ema``: a second copy that starts as the initial student and follows it,
  ``teacher <- d * teacher + (1 - d) * student`` after every optimizer step (``ema_update_``);
  ``d = 1`` is ``frozen_initial``.
- ``live``: the current student's weights (the actor module itself, no second copy) score the
  privileged prompt, without gradient.

``zero_loss_reason`` names the one setting where the loss is identically zero whatever the data:
teacher weights = the student's, same prompt (context ``none``), same mode and temperature.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

TEACHER_KINDS = ("frozen_initial", "checkpoint", "ema", "live")
# kinds whose teacher is a second copy of the weights in verl's reference slot
SECOND_COPY_KINDS = ("frozen_initial", "checkpoint", "ema")
# kind checkpoint: the config.json keys the teacher must share with the student (with its tokenizer:
# the loss compares the two distributions over one vocabulary); any architecture otherwise
TEACHER_SAME_KEYS = ("vocab_size",)
# kind ema: the folder of every checkpoint (global_step_<s>/) holding the EMA teacher's state
EMA_TEACHER_DIR = "opsd_ema_teacher"


@torch.no_grad()
def ema_update_(teacher: torch.Tensor, student: torch.Tensor, *, decay: float) -> torch.Tensor:
    """``teacher <- decay * teacher + (1 - decay) * student`` in place (in the teacher's dtype and
    device); returns ``teacher``. ``decay == 1`` leaves the teacher bit-identical (``t * 1 + s * 0``)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"EMA decay must be in [0, 1], got {decay!r}")
    if teacher.shape != student.shape:
        raise ValueError(f"EMA of tensors of different shapes: teacher {tuple(teacher.shape)}, student {tuple(student.shape)}")
    student = student.detach().to(device=teacher.device, dtype=teacher.dtype)
    return teacher.mul_(decay).add_(student, alpha=1.0 - decay)


def ema_update_all_(pairs: Iterable[tuple[str, torch.Tensor, torch.Tensor]], *, decay: float) -> int:
    """``ema_update_`` over ``(name, teacher, student)`` triples; returns how many were updated.
    All shapes are checked first (a mismatch names the tensor and updates nothing)."""
    pairs = list(pairs)
    for name, teacher, student in pairs:
        if teacher.shape != student.shape:
            raise ValueError(
                f"{name}: EMA of tensors of different shapes: teacher {tuple(teacher.shape)}, student {tuple(student.shape)}"
            )
    for _, teacher, student in pairs:
        ema_update_(teacher, student, decay=decay)
    return len(pairs)


def _same_path(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return os.path.normpath(a) == os.path.normpath(b)


def zero_loss_reason(
    *,
    kind: str,
    teacher_path: str | None,
    student_path: str,
    teacher_context: str,
    student_mode,
    teacher_mode,
    student_temperature: float,
    teacher_temperature: float,
) -> str | None:
    """Why the OPSD loss is identically zero for this setting, or None.

    The teacher's weights are the student's (``frozen_initial``, ``ema`` and ``live`` start from the
    student; ``checkpoint`` with the student's own path), its prompt is the student's (context
    ``none``), in the same mode and at the same temperature: then pT = pS at every position, the
    divergence and its gradient are 0, the student never moves and neither does the teacher.
    """
    same_weights = kind != "checkpoint" or (teacher_path is not None and _same_path(teacher_path, student_path))
    if not same_weights or teacher_context != "none" or student_mode != teacher_mode:
        return None
    if float(student_temperature) != float(teacher_temperature):
        return None
    weights = "the student's own checkpoint" if kind == "checkpoint" else f"the student itself (kind {kind})"
    return (
        f"the teacher is {weights} ({student_path}), its prompt is the student's (opsd.teacher_context=none), "
        f"in the same mode ({student_mode}) at the same temperature ({student_temperature}): the OPSD loss is "
        "identically 0 and nothing trains"
    )
