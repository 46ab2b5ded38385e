"""Loss-position selection for OPSD (pure torch): the paper's "selected valid response positions".

Every function returns a bool mask [B, T] that is a subset of ``response_mask_BT`` (ragged and right-padded
batches, any 0/1 or bool mask, holes included: positions are counted among a row's valid ones). The forms
of ``opsd.loss.positions`` and the paper's names for them: :func:`select_positions`. The selected positions
feed the divergence of :mod:`recipe.opsd.core.losses`.

Example::

    mask_BT = select_positions("he:0.2", response_mask_BT=response_mask_BT, entropy_BT=entropy_BT)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "PositionSpec",
    "parse_position_spec",
    "first_n",
    "final_n",
    "uniform_n",
    "entropy_fraction",
    "teacher_topk",
    "select_positions",
]

_ALLOWED = "all | first:N | uniform:N | final:N | he:Q | le:Q | advt:K  (N, K ints >= 1; Q a fraction in (0, 1), e.g. he:0.2)"


class PositionSpec(NamedTuple):
    kind: str  # all | first | uniform | final | he | le | advt
    value: int | float | None


def parse_position_spec(spec: str) -> PositionSpec:
    """Parse a position spec string; ValueError naming the spec and the allowed forms."""

    def bad(why: str) -> ValueError:
        return ValueError(f"invalid loss position spec {spec!r}: {why}; allowed: {_ALLOWED}")

    if not isinstance(spec, str):
        raise bad("not a string")
    text = spec.strip().lower()
    if text == "all":
        return PositionSpec("all", None)
    kind, sep, arg = text.partition(":")
    if not sep or kind not in ("first", "uniform", "final", "he", "le", "advt"):
        raise bad("unknown form")
    if kind in ("he", "le"):
        try:
            q = float(arg)
        except ValueError:
            raise bad(f"{kind}: needs a fraction Q") from None
        if not 0.0 < q < 1.0:
            raise bad(f"Q={arg} is not in (0, 1)")
        return PositionSpec(kind, q)
    if not arg.isdigit() or int(arg) < 1:
        raise bad(f"{kind}: needs an int >= 1")
    return PositionSpec(kind, int(arg))


def _mask(response_mask_BT: torch.Tensor) -> torch.Tensor:
    if not isinstance(response_mask_BT, torch.Tensor) or response_mask_BT.dim() != 2:
        raise ValueError(f"response_mask_BT must be a [B, T] tensor; got {getattr(response_mask_BT, 'shape', type(response_mask_BT))}")
    return response_mask_BT.bool()


def _same_shape(name: str, t, mask_BT: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.shape != mask_BT.shape:
        raise ValueError(f"{name} must be a tensor of shape {tuple(mask_BT.shape)} like response_mask_BT; got {getattr(t, 'shape', type(t))}")


def _check_count(name: str, n) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{name} must be an int >= 1; got {n!r}")


def _rank_among_valid(mask_BT: torch.Tensor, keys_BT: torch.Tensor) -> torch.Tensor:
    """Rank (0-based) of each valid position within its row when sorted by ``keys_BT``
    ascending, ties broken by position (stable); invalid positions rank after all valid."""
    keys = torch.where(mask_BT, keys_BT.to(torch.float64), torch.full_like(keys_BT, math.inf, dtype=torch.float64))
    order_BT = torch.sort(keys, dim=1, stable=True).indices
    rank_BT = torch.empty_like(order_BT)
    rank_BT.scatter_(1, order_BT, torch.arange(mask_BT.shape[1], device=mask_BT.device).expand_as(order_BT).contiguous())
    return rank_BT


def first_n(response_mask_BT: torch.Tensor, *, n: int) -> torch.Tensor:
    """The first ``n`` valid positions of each row (all of them if the row has fewer)."""
    mask = _mask(response_mask_BT)
    _check_count("n", n)
    index_BT = mask.long().cumsum(1) - 1
    return mask & (index_BT < n)


def final_n(response_mask_BT: torch.Tensor, *, n: int) -> torch.Tensor:
    """The last ``n`` valid positions of each row (all of them if the row has fewer)."""
    mask = _mask(response_mask_BT)
    _check_count("n", n)
    from_end_BT = mask.long().flip(1).cumsum(1).flip(1) - 1
    return mask & (from_end_BT < n)


def uniform_n(response_mask_BT: torch.Tensor, *, n: int, seed: int) -> torch.Tensor:
    """At most ``n`` valid positions per row, uniformly without replacement.

    Reproducible: the same ``seed`` and mask shape give the same selection (the random
    keys come from a CPU ``torch.Generator`` seeded with ``seed``).
    """
    mask = _mask(response_mask_BT)
    _check_count("n", n)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int; got {seed!r}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    keys_BT = torch.rand(mask.shape, generator=gen, dtype=torch.float64).to(mask.device)
    return mask & (_rank_among_valid(mask, keys_BT) < n)


def entropy_fraction(response_mask_BT: torch.Tensor, entropy_BT: torch.Tensor, *, fraction: float, highest: bool) -> torch.Tensor:
    """Per row, the ``ceil(fraction x valid count)`` valid positions of highest (``highest=True``)
    or lowest student entropy; ties broken by earlier position. ``fraction`` in (0, 1].

    ceil keeps at least one position in every non-empty completion (HE20 of a
    3-token completion keeps 1 token).
    """
    mask = _mask(response_mask_BT)
    _same_shape("entropy_BT", entropy_BT, mask)
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be a number in (0, 1]; got {fraction!r}")
    if not isinstance(highest, bool):
        raise ValueError(f"highest must be a bool; got {highest!r}")
    ent = entropy_BT.detach().to(torch.float64)
    if torch.isnan(ent[mask]).any():
        raise ValueError("entropy_BT has NaN at valid response positions")
    count_B1 = mask.sum(1, keepdim=True).to(torch.float64)
    # the small offset keeps products like 0.1 x 30 = 3.0000000000000004 from rounding up to 4
    keep_B1 = torch.ceil(count_B1 * fraction - 1e-9)
    return mask & (_rank_among_valid(mask, -ent if highest else ent) < keep_B1)


def teacher_topk(response_mask_BT: torch.Tensor, teacher_rank_BT: torch.Tensor, *, k: int) -> torch.Tensor:
    """Valid positions where the teacher ranks the sampled token within its top ``k``
    (``teacher_rank_BT`` = 0 for the teacher argmax; keep rank < k)."""
    mask = _mask(response_mask_BT)
    _same_shape("teacher_rank_BT", teacher_rank_BT, mask)
    _check_count("k", k)
    return mask & (teacher_rank_BT < k)


def select_positions(
    spec: str,
    *,
    response_mask_BT: torch.Tensor,
    entropy_BT: torch.Tensor | None = None,
    teacher_rank_BT: torch.Tensor | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Bool mask [B, T] of loss positions for ``spec`` (see :func:`parse_position_spec`). The paper's selections:

    - ``first:N`` / ``final:N``: the first / last N valid positions of each completion (First-256, Final-256);
    - ``uniform:N``: at most N valid positions per completion drawn uniformly without replacement, seeded
      (Uni-256);
    - ``he:Q`` / ``le:Q``: per completion, the highest / lowest Q fraction of valid positions by student
      entropy ("HE20/HE80 and LE20/LE80 retain the highest- or lowest-entropy fraction of each
      completion"); the count is ceil(Q x valid count);
    - ``advt:K``: positions where the frozen teacher ranks the sampled token among its top K (rank 0 =
      teacher argmax; AdvT4 / AdvT16).
    """
    kind, value = parse_position_spec(spec)
    mask = _mask(response_mask_BT)
    if kind == "all":
        return mask.clone()
    if kind == "first":
        return first_n(mask, n=value)
    if kind == "final":
        return final_n(mask, n=value)
    if kind == "uniform":
        return uniform_n(mask, n=value, seed=seed)
    if kind in ("he", "le"):
        if entropy_BT is None:
            raise ValueError(f"loss position spec {spec!r} needs entropy_BT (student entropy per position)")
        return entropy_fraction(mask, entropy_BT, fraction=value, highest=kind == "he")
    if teacher_rank_BT is None:
        raise ValueError(f"loss position spec {spec!r} needs teacher_rank_BT (teacher rank of the sampled token)")
    return teacher_topk(mask, teacher_rank_BT, k=value)
