"""The toy task: seeded multi-step addition problems in the record schema of the real datasets.

A problem adds ``num_operands`` integers of ``digits`` digits each (the difficulty knob).
Its reference solution is the chain of partial sums, one line per step, ending in
``\\boxed{}``; the CoT field is the same chain without the boxed line, the answer is the
integer. Example (3 operands, 2 digits)::

    problem  = "Compute 12+34+57."
    cot      = "12+34=46\\n46+57=103"
    solution = "12+34=46\\n46+57=103\\n\\boxed{103}"
    answer   = "103"

Each record also carries an unrelated problem-solution pair (another training problem,
never the same one) for the ``unrelated`` teacher context, so one record holds every field
``recipe.common.prompts.build_prompt_pair`` needs. Splits are disjoint by construction: the
generator draws distinct operand tuples and assigns the first ``n_heldout`` to ``heldout``.

Pure stdlib: ``make_records`` is deterministic given ``seed`` (a private ``random.Random``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DATA_SOURCE = "toy_arith"
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class TaskConfig:
    """Difficulty and size of the toy task.

    num_operands: how many numbers are added (>= 2); the solution has num_operands - 1 lines.
    digits: digits of every operand (>= 1); operands are drawn uniformly from [10^(d-1), 10^d).
    n_train / n_heldout: number of distinct problems in each split.
    seed: seed of the private RNG; the same config gives the same records.
    """

    num_operands: int = 3
    digits: int = 2
    n_train: int = 4096
    n_heldout: int = 256
    seed: int = 0

    def __post_init__(self):
        for name, low in (("num_operands", 2), ("digits", 1), ("n_train", 2), ("n_heldout", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"TaskConfig.{name} must be an integer >= {low}, got {value!r}")
        low, high = _operand_range(self.digits)
        pool = (high - low) ** self.num_operands
        if self.n_train + self.n_heldout > pool // 2:
            raise ValueError(
                f"TaskConfig: n_train + n_heldout = {self.n_train + self.n_heldout} distinct problems requested, "
                f"but only {pool} exist with num_operands={self.num_operands}, digits={self.digits}; "
                f"ask for at most half of them"
            )


def _operand_range(digits: int) -> tuple[int, int]:
    low = 1 if digits == 1 else 10 ** (digits - 1)
    return low, 10**digits


def solve(operands: tuple[int, ...]) -> dict[str, str]:
    """Problem, CoT, solution and answer strings for one tuple of operands."""
    if len(operands) < 2:
        raise ValueError(f"solve: need at least 2 operands, got {operands!r}")
    lines, total = [], operands[0]
    for value in operands[1:]:
        lines.append(f"{total}+{value}={total + value}")
        total += value
    cot = "\n".join(lines)
    return {
        "problem": "Compute " + "+".join(str(v) for v in operands) + ".",
        "cot": cot,
        "solution": cot + f"\n\\boxed{{{total}}}",
        "answer": str(total),
    }


def make_records(config: TaskConfig) -> dict[str, list[dict[str, str]]]:
    """``{"train": [...], "heldout": [...]}``: records with the ``extra_info`` fields of the data schema.

    Keys of every record: id, index, split, problem, solution, answer, cot,
    unrelated_problem, unrelated_solution (all strings except ``index``).
    """
    rng = random.Random(config.seed)
    low, high = _operand_range(config.digits)
    total = config.n_train + config.n_heldout
    seen: set[tuple[int, ...]] = set()
    draws: list[tuple[int, ...]] = []
    while len(draws) < total:
        operands = tuple(rng.randrange(low, high) for _ in range(config.num_operands))
        if operands not in seen:
            seen.add(operands)
            draws.append(operands)
    split_draws = {"heldout": draws[: config.n_heldout], "train": draws[config.n_heldout :]}
    # Unrelated pairs come from the training pool, shifted by a random non-zero offset, so a
    # record is never paired with itself.
    train_solved = [solve(ops) for ops in split_draws["train"]]
    records: dict[str, list[dict[str, str]]] = {}
    for split in SPLITS:
        rows = []
        for index, operands in enumerate(split_draws[split]):
            fields = train_solved[index] if split == "train" else solve(operands)
            partner = rng.randrange(len(train_solved))
            if split == "train" and partner == index:
                partner = (partner + 1) % len(train_solved)
            unrelated = train_solved[partner]
            rows.append(
                {
                    "id": f"{DATA_SOURCE}-{config.num_operands}x{config.digits}-s{config.seed}-{split}-{index}",
                    "index": index,
                    "split": split,
                    **fields,
                    "unrelated_problem": unrelated["problem"],
                    "unrelated_solution": unrelated["solution"],
                }
            )
        records[split] = rows
    return records
