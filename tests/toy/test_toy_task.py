"""Toy task generator: determinism, disjoint splits, schema, solutions graded correct by the one grader."""

import pytest

from recipe.common.grader import grade
from recipe.toy.task import DATA_SOURCE, TaskConfig, make_records, solve

FIELDS = {"id", "index", "split", "problem", "solution", "answer", "cot", "unrelated_problem", "unrelated_solution"}


def small(**kwargs):
    return TaskConfig(**{"n_train": 64, "n_heldout": 16, **kwargs})


def test_solve_hand_written_example():
    assert solve((12, 34, 57)) == {
        "problem": "Compute 12+34+57.",
        "cot": "12+34=46\n46+57=103",
        "solution": "12+34=46\n46+57=103\n\\boxed{103}",
        "answer": "103",
    }


def test_same_seed_same_records_other_seed_differs():
    assert make_records(small(seed=3)) == make_records(small(seed=3))
    assert make_records(small(seed=3))["train"] != make_records(small(seed=4))["train"]


def test_splits_sizes_disjoint_and_schema():
    records = make_records(small())
    assert len(records["train"]) == 64 and len(records["heldout"]) == 16
    train_problems = {r["problem"] for r in records["train"]}
    held_problems = {r["problem"] for r in records["heldout"]}
    assert len(train_problems) == 64 and len(held_problems) == 16
    assert not train_problems & held_problems
    for split, rows in records.items():
        for index, row in enumerate(rows):
            assert set(row) == FIELDS
            assert row["split"] == split and row["index"] == index
            assert row["id"].startswith(DATA_SOURCE) and split in row["id"]
            assert row["unrelated_problem"] != row["problem"]
            assert row["unrelated_problem"] in train_problems
    assert len({r["id"] for rows in records.values() for r in rows}) == 80


@pytest.mark.parametrize("num_operands,digits", [(2, 1), (3, 2), (4, 3)])
def test_difficulty_knob_and_solutions_graded_correct(num_operands, digits):
    records = make_records(small(num_operands=num_operands, digits=digits, n_train=20, n_heldout=5))
    for row in records["train"] + records["heldout"]:
        operands = [int(v) for v in row["problem"][len("Compute "):-1].split("+")]
        assert len(operands) == num_operands
        assert all(len(str(v)) == digits for v in operands)
        assert row["answer"] == str(sum(operands))
        assert row["cot"].count("\n") == num_operands - 2
        assert grade(row["solution"], row["answer"], mode="evaluation").acc
        assert not grade(row["solution"], str(sum(operands) + 1), mode="evaluation").acc


@pytest.mark.parametrize("field,value", [("num_operands", 1), ("digits", 0), ("n_train", 1), ("n_heldout", 0), ("digits", 2.0)])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TaskConfig(**{field: value})


def test_config_rejects_more_problems_than_exist():
    with pytest.raises(ValueError, match="distinct problems"):
        TaskConfig(num_operands=2, digits=1, n_train=40, n_heldout=5)


def test_solve_sentence_wording_hand_written_example():
    assert solve((7, 16, 2), wording="sentence") == {
        "problem": "What is 7 + 16 + 2?",
        "cot": "7 + 16 = 23\n23 + 2 = 25",
        "solution": "7 + 16 = 23\n23 + 2 = 25\n\nSo, the answer is \\boxed{25}.",
        "answer": "25",
    }
    assert grade(solve((7, 16), wording="sentence")["solution"], "23", mode="evaluation").acc
    with pytest.raises(ValueError, match="wording must be one of"):
        solve((1, 2), wording="chat")


def test_max_operand_draws_from_one_to_max_inclusive_in_either_wording():
    task = small(num_operands=2, digits=1, max_operand=19, n_train=150, n_heldout=30, wording="sentence")
    records = make_records(task)
    operands = set()
    for row in records["train"] + records["heldout"]:
        a, b = (int(v) for v in row["problem"][len("What is "):-1].split(" + "))
        operands |= {a, b}
        assert row["answer"] == str(a + b) and row["solution"].endswith(f"So, the answer is \\boxed{{{a + b}}}.")
        assert row["unrelated_solution"].startswith(row["unrelated_problem"][len("What is "):-1])
        assert row["id"].startswith(f"{DATA_SOURCE}-2x1-s0-max19-sentence-")
    assert min(operands) == 1 and max(operands) == 19
    assert task.operand_range == (1, 20) and small().operand_range == (10, 100)
    # The toy world's ids and records are what they were before the knobs existed.
    assert make_records(small())["train"][0]["id"] == f"{DATA_SOURCE}-3x2-s0-train-0"
    # min_operand moves the low end: [20, 99], ids say so
    task = small(num_operands=2, digits=1, min_operand=20, max_operand=99, n_train=150, n_heldout=30, wording="sentence")
    rows = make_records(task)["train"] + make_records(task)["heldout"]
    drawn = {int(v) for row in rows for v in row["problem"][len("What is "):-1].split(" + ")}
    assert task.operand_range == (20, 100) and min(drawn) >= 20 and max(drawn) <= 99
    assert rows[0]["id"].startswith(f"{DATA_SOURCE}-2x1-s0-min20-max99-sentence-")
    # cache digests name a task by key(): min_operand only when set (the students built before it keep their caches)
    assert "min_operand" not in small().key() and task.key()["min_operand"] == 20


@pytest.mark.parametrize("kwargs,match", [
    ({"max_operand": 1}, "max_operand must be None or an integer >= 2"),
    ({"max_operand": 19, "digits": 2}, "max_operand=19 replaces the digits range; leave digits at 1"),
    ({"wording": "chat"}, r"wording must be one of \('compact', 'sentence'\)"),
    ({"min_operand": 5}, "min_operand must be an integer in \\[1, max_operand\\) with max_operand set"),
    ({"digits": 1, "max_operand": 19, "min_operand": 19}, "min_operand must be an integer in"),
    ({"num_operands": 2, "digits": 1, "max_operand": 9, "n_train": 40}, r"only 81 exist .* operands in \[1, 10\)"),
])
def test_config_rejects_bad_task_knobs_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small(**kwargs)
