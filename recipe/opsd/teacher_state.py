"""verl glue: the teacher's own state on the workers -- the EMA teacher's update, save and restore,
and float64 fingerprints of sharded parameters -- on the local FSDP2 shards, without gathering.

Kind ``ema`` (``recipe.opsd.core.teacher_kinds``): after every optimizer step of the actor,
teacher <- d * teacher + (1 - d) * student on the local shards of verl's reference copy (same
sharding as the actor's) and on the teacher head copy the loss reads (the actor's full lm_head, head
scale folded in); a skipped step (non-finite gradient norm: verl leaves the student unchanged)
leaves the teacher unchanged too. Its state is saved with every checkpoint
(``global_step_<s>/opsd_ema_teacher/rank_<r>.pt``) and restored on resume (verl restores the actor
only).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from verl.utils.device import get_device_id

from recipe.common.heads import output_logit_scale
from recipe.opsd.core.teacher_kinds import EMA_TEACHER_DIR, ema_update_, ema_update_all_
from recipe.opsd.engine import unwrap_causal_lm


# kind ema: the teacher's state in every checkpoint (global_step_<s>/opsd_ema_teacher/rank_<r>.pt)
EMA_HEAD_KEY = "__opsd_teacher_head__"


def ema_teacher_file(folder, *, rank: int) -> Path:
    return Path(folder) / EMA_TEACHER_DIR / f"rank_{rank}.pt"


def local(param):
    return param.to_local() if isinstance(param, DTensor) else param


def sharded_param_sums(params, *, block: int = 1 << 22) -> list[float]:
    """float64 (sum, sum of squares) over ``params`` without gathering them.

    Each rank sums its local FSDP2 shards, ``block`` elements at a time (no float64 copy of a whole
    parameter: memory O(block)), then the sums are all-reduced over the mesh dimensions a parameter
    is sharded on (replicated dimensions hold copies and are not added). Every rank must call this
    with the same parameters in the same order (FSDP modules do).
    """
    totals: dict[tuple, torch.Tensor] = {}
    with torch.no_grad():
        for param in params:
            local, groups = param, ()
            if isinstance(param, DTensor):
                local = param.to_local()
                mesh = param.device_mesh
                groups = tuple(mesh.get_group(dim) for dim, p in enumerate(param.placements) if p.is_shard())
            acc = totals.setdefault(groups, torch.zeros(2, dtype=torch.float64, device=local.device))
            if acc.device != local.device:
                acc = totals[groups] = acc.to(local.device)
            for part in local.detach().reshape(-1).split(block):
                part = part.double()
                acc += torch.stack([part.sum(), (part * part).sum()])
    total = torch.zeros(2, dtype=torch.float64)
    for groups, acc in totals.items():
        acc = acc.to(get_device_id())
        for group in groups:
            torch.distributed.all_reduce(acc, group=group)
        total += acc.cpu()
    return total.tolist()


def fsdp2_lazy_init(module) -> None:
    """Run FSDP2's lazy initialisation now, with the LoRA adapters trainable (idempotent).

    FSDP2 fixes each parameter group's gradient reduce dtype at its lazy init (the module's first
    forward) from the parameters that require grad at that moment. With LoRA the actor's first
    forward is the teacher's, under peft's ``disable_adapter`` (adapters' requires_grad False), which
    would leave the adapters' bf16 gradients un-cast at the first backward ("attempting to assign a
    gradient with dtype BFloat16 to a tensor with grad_dtype Float"). ``_lazy_init`` is FSDP2's own
    (private) entry point for this; re-check it on a torch upgrade.
    """
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is not None:
        get_state()._lazy_init()


def ema_teacher_step(*, teacher_module, student_module, teacher_head_VH, hf_config, decay: float, grad_norm) -> None:
    """teacher <- d * teacher + (1 - d) * student on the local shards and on the head copy (module docstring)."""
    if not math.isfinite(float(grad_norm)):
        return
    student = dict(student_module.named_parameters())
    pairs = []
    for name, teacher_param in teacher_module.named_parameters():
        if name not in student:
            raise RuntimeError(f"EMA teacher: the student has no parameter {name!r}")
        student_param = student[name]
        if isinstance(teacher_param, DTensor) != isinstance(student_param, DTensor) or (
            isinstance(teacher_param, DTensor) and teacher_param.placements != student_param.placements
        ):
            raise RuntimeError(f"EMA teacher: {name!r} is sharded differently in the teacher and the student")
        pairs.append((name, local(teacher_param).data, local(student_param).data))
    ema_update_all_(pairs, decay=decay)
    head = unwrap_causal_lm(student_module).get_output_embeddings().weight
    with torch.no_grad():
        head_VH = head.full_tensor() if isinstance(head, DTensor) else head
        ema_update_(teacher_head_VH, head_VH.detach() * output_logit_scale(hf_config), decay=decay)


def save_ema_teacher(folder, *, teacher_module, teacher_head_VH) -> None:
    """This rank's local shards of the EMA teacher and its head copy, to ``<folder>/opsd_ema_teacher/rank_<r>.pt``."""
    state = {name: local(param).detach().cpu().clone() for name, param in teacher_module.named_parameters()}
    state[EMA_HEAD_KEY] = teacher_head_VH.detach().cpu().clone()
    path = ema_teacher_file(folder, rank=torch.distributed.get_rank())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def load_ema_teacher(folder, *, teacher_module, teacher_head_VH) -> None:
    """Restore what :func:`save_ema_teacher` wrote for this rank."""
    path = ema_teacher_file(folder, rank=torch.distributed.get_rank())
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the checkpoint has no EMA teacher state (opsd.teacher.kind=ema)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    with torch.no_grad():
        for name, param in teacher_module.named_parameters():
            local(param).copy_(state[name])
        teacher_head_VH.copy_(state[EMA_HEAD_KEY])
