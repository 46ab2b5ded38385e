"""The toy task: seeded multi-step addition problems in the record schema of the real datasets.

A problem adds ``num_operands`` integers of ``digits`` digits each (the difficulty knob); the solution is
the chain of partial sums ending in ``\\boxed{}``, the CoT the same chain without the boxed line, the
answer the integer. Each record also carries an unrelated training problem-solution pair (the
``unrelated`` teacher context). Pure stdlib: ``make_records`` is deterministic given ``seed``, its splits
disjoint. Example (3 operands, 2 digits)::

    problem  = "Compute 12+34+57."
    solution = "12+34=46\\n46+57=103\\n\\boxed{103}"      # cot: without the boxed line; answer: "103"
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
    max_operand: if set, operands are drawn uniformly from [min_operand, max_operand] instead of the
        ``digits`` range (``digits`` is then unused and must stay 1).
    min_operand: the smallest operand with ``max_operand`` (default 1).
    wording: ``"compact"`` (the toy world's ``Compute 12+34.``, solution ``12+34=46`` lines then
        ``\\boxed{46}``) or ``"sentence"`` (``What is 12 + 34?``, solution ``12 + 34 = 46`` lines,
        a blank line, then ``So, the answer is \\boxed{46}.``: the wording a chat model such as
        SmolLM2 answers in, docs/real_model.md §4).
    """

    num_operands: int = 3
    digits: int = 2
    n_train: int = 4096
    n_heldout: int = 256
    seed: int = 0
    max_operand: int | None = None
    wording: str = "compact"
    min_operand: int | None = None

    def __post_init__(self):
        for name, low in (("num_operands", 2), ("digits", 1), ("n_train", 2), ("n_heldout", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"TaskConfig.{name} must be an integer >= {low}, got {value!r}")
        if self.max_operand is not None:
            if isinstance(self.max_operand, bool) or not isinstance(self.max_operand, int) or self.max_operand < 2:
                raise ValueError(f"TaskConfig.max_operand must be None or an integer >= 2, got {self.max_operand!r}")
            if self.digits != 1:
                raise ValueError(f"TaskConfig: max_operand={self.max_operand} replaces the digits range; "
                                 f"leave digits at 1, got {self.digits}")
        if self.min_operand is not None and (self.max_operand is None or isinstance(self.min_operand, bool)
                                             or not isinstance(self.min_operand, int)
                                             or not 1 <= self.min_operand < self.max_operand):
            raise ValueError(f"TaskConfig.min_operand must be an integer in [1, max_operand) with max_operand set, "
                             f"got {self.min_operand!r} (max_operand {self.max_operand!r})")
        if self.wording not in WORDINGS:
            raise ValueError(f"TaskConfig.wording must be one of {WORDINGS}, got {self.wording!r}")
        low, high = self.operand_range
        pool = (high - low) ** self.num_operands
        if self.n_train + self.n_heldout > pool // 2:
            raise ValueError(
                f"TaskConfig: n_train + n_heldout = {self.n_train + self.n_heldout} distinct problems requested, "
                f"but only {pool} exist with num_operands={self.num_operands}, operands in [{low}, {high}); "
                f"ask for at most half of them"
            )

    def key(self) -> dict:
        """The fields that name this task in cache digests: ``min_operand`` only when set, so the digests of tasks
        that leave it unset are those made before it existed."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.min_operand is None:
            del fields["min_operand"]
        return fields

    @property
    def operand_range(self) -> tuple[int, int]:
        """Operands are drawn from ``[low, high)``."""
        if self.max_operand is not None:
            return self.min_operand or 1, self.max_operand + 1
        return (1 if self.digits == 1 else 10 ** (self.digits - 1)), 10**self.digits

    @property
    def variant(self) -> str:
        """``-max{max_operand}`` and ``-{wording}`` where they are not the defaults ("" for the toy world's
        tasks): appended to record ids and cache directory names."""
        suffix = "" if self.max_operand is None else f"-max{self.max_operand}"
        suffix = suffix if self.min_operand is None else f"-min{self.min_operand}{suffix}"
        return suffix if self.wording == "compact" else f"{suffix}-{self.wording}"


WORDINGS = ("compact", "sentence")


def solve(operands: tuple[int, ...], *, wording: str = "compact") -> dict[str, str]:
    """Problem, CoT, solution and answer strings for one tuple of operands in ``wording``."""
    if len(operands) < 2:
        raise ValueError(f"solve: need at least 2 operands, got {operands!r}")
    if wording not in WORDINGS:
        raise ValueError(f"solve: wording must be one of {WORDINGS}, got {wording!r}")
    plus = "+" if wording == "compact" else " + "
    equals = "=" if wording == "compact" else " = "
    lines, total = [], operands[0]
    for value in operands[1:]:
        lines.append(f"{total}{plus}{value}{equals}{total + value}")
        total += value
    cot = "\n".join(lines)
    terms = plus.join(str(v) for v in operands)
    if wording == "compact":
        problem, final = f"Compute {terms}.", f"\n\\boxed{{{total}}}"
    else:
        problem, final = f"What is {terms}?", f"\n\nSo, the answer is \\boxed{{{total}}}."
    return {"problem": problem, "cot": cot, "solution": cot + final, "answer": str(total)}


def make_records(config: TaskConfig) -> dict[str, list[dict[str, str]]]:
    """``{"train": [...], "heldout": [...]}``: records with the ``extra_info`` fields of the data schema.

    Keys of every record: id, index, split, problem, solution, answer, cot,
    unrelated_problem, unrelated_solution (all strings except ``index``): every field
    ``recipe.common.prompts.build_prompt_pair`` needs. The splits are disjoint by construction: distinct
    operand tuples are drawn, the first ``n_heldout`` go to ``heldout``; a record's unrelated pair is
    another training problem, never its own.
    """
    rng = random.Random(config.seed)
    low, high = config.operand_range
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
    train_solved = [solve(ops, wording=config.wording) for ops in split_draws["train"]]
    records: dict[str, list[dict[str, str]]] = {}
    for split in SPLITS:
        rows = []
        for index, operands in enumerate(split_draws[split]):
            fields = train_solved[index] if split == "train" else solve(operands, wording=config.wording)
            partner = rng.randrange(len(train_solved))
            if split == "train" and partner == index:
                partner = (partner + 1) % len(train_solved)
            unrelated = train_solved[partner]
            rows.append(
                {
                    "id": f"{DATA_SOURCE}-{config.num_operands}x{config.digits}-s{config.seed}{config.variant}-{split}-{index}",
                    "index": index,
                    "split": split,
                    **fields,
                    "unrelated_problem": unrelated["problem"],
                    "unrelated_solution": unrelated["solution"],
                }
            )
        records[split] = rows
    return records
