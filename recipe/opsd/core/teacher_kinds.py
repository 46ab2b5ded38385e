"""Teacher kinds of OPSD (``opsd.teacher.kind``): which weights score the student's rollouts under the
privileged prompt, one ``TeacherKind`` entry each in ``TEACHER_KINDS``, and their pure parts (torch /
stdlib; no verl or ray): the EMA update and ``zero_loss_reason``.

The glue reads a kind's flags (``teacher_kind(name).follows_student``), never its name: a new kind is
one entry here, plus any new behaviour behind a new flag. What each kind is for, with the paper's
wording: docs/opsd_recipe.md "Teacher kinds".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TeacherKind:
    """One value of ``opsd.teacher.kind`` as the flags the glue reads.

    second_copy: the teacher is its own copy of the weights in verl's reference slot; False: the
        actor module itself scores the privileged prompt, without gradient.
    loads_path: that copy loads ``opsd.teacher.path`` (required, else refused): another model with the
        student's vocabulary (``TEACHER_SAME_KEYS``), whose own tokenizer renders the teacher prompts.
    follows_student: the copy moves toward the student after every optimizer step (``ema_update_``,
        ``opsd.teacher.ema_decay`` required, else refused): fp32 copy, float32 head, state saved with
        every checkpoint (``EMA_TEACHER_DIR``) and restored on resume.
    starts_as_student: the teacher's weights are the student's before the first update of a fresh run.
    is_student: the teacher's weights are the current student's at every step.
    lora_base_weights: with LoRA the teacher is the actor's base weights, adapters disabled (no second
        copy); a second-copy kind without it needs full-parameter training (``needs_full_parameters``).
    """

    name: str
    second_copy: bool
    loads_path: bool = False
    follows_student: bool = False
    starts_as_student: bool = False
    is_student: bool = False
    lora_base_weights: bool = False

    @property
    def needs_full_parameters(self) -> bool:
        """A second full copy of the weights, which LoRA training does not have (refused with LoRA)."""
        return self.second_copy and not self.lora_base_weights

    def uses_reference_slot(self, *, lora: bool) -> bool:
        """Whether verl's reference slot holds the teacher (``Role.ActorRolloutRef``): a second copy,
        except under LoRA for a kind whose teacher is then the actor's base weights."""
        return self.second_copy and not (lora and self.lora_base_weights)


TEACHER_KINDS = {kind.name: kind for kind in (
    # the paper: "a frozen copy pi_theta0 of the initial student as the teacher", never updated
    TeacherKind("frozen_initial", second_copy=True, starts_as_student=True, lora_base_weights=True),
    # another frozen model: the paper's cross-model rows and the SFT-10 no-privilege control
    TeacherKind("checkpoint", second_copy=True, loads_path=True),
    # teacher <- d * teacher + (1 - d) * student after every optimizer step; d = 1 is frozen_initial
    TeacherKind("ema", second_copy=True, follows_student=True, starts_as_student=True),
    # the current student's own weights score the privileged prompt
    TeacherKind("live", second_copy=False, starts_as_student=True, is_student=True),
)}
DEFAULT_TEACHER_KIND = "frozen_initial"
# kind loads_path: the config.json keys the teacher must share with the student (with its tokenizer:
# the loss compares the two distributions over one vocabulary); any architecture otherwise
TEACHER_SAME_KEYS = ("vocab_size",)
# kind follows_student: the folder of every checkpoint (global_step_<s>/) holding the teacher's state
EMA_TEACHER_DIR = "opsd_ema_teacher"


def teacher_kind(name: str) -> TeacherKind:
    """The registered kind ``name``; a ValueError naming ``opsd.teacher.kind`` and the allowed values."""
    if name not in TEACHER_KINDS:
        raise ValueError(f"opsd.teacher.kind must be one of {list(TEACHER_KINDS)}, got {name!r}")
    return TEACHER_KINDS[name]


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

    The teacher's weights are the student's (a kind that ``starts_as_student``, or one that
    ``loads_path`` given the student's own path), its prompt is the student's (context ``none``), in
    the same mode and at the same temperature: then pT = pS at every position, the divergence and its
    gradient are 0, the student never moves and neither does the teacher.
    """
    flags = teacher_kind(kind)
    own_checkpoint = flags.loads_path and teacher_path is not None and _same_path(teacher_path, student_path)
    if not (flags.starts_as_student or own_checkpoint) or teacher_context != "none" or student_mode != teacher_mode:
        return None
    if float(student_temperature) != float(teacher_temperature):
        return None
    weights = "the student's own checkpoint" if own_checkpoint else f"the student itself (kind {kind})"
    return (
        f"the teacher is {weights} ({student_path}), its prompt is the student's (opsd.teacher_context=none), "
        f"in the same mode ({student_mode}) at the same temperature ({student_temperature}): the OPSD loss is "
        "identically 0 and nothing trains"
    )
