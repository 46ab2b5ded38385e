"""Unrelated pairs: deduplicated pool, deterministic assignment, never the target problem."""

import pytest

from data_prep.decontaminate import EvalIndex, EvalItem
from data_prep.unrelated import Pair, assign_unrelated, build_pool


def test_pool_dedup_decontamination_and_missing_solution(eval_texts):
    eval_a, _ = eval_texts
    records = [
        {"id": "1", "problem": "What is 1+1?", "solution": "2"},
        {"id": "2", "problem": "what is 1 + 1 ?", "solution": "2"},  # same after normalisation
        {"id": "3", "problem": "What is 2+3?", "solution": ""},
        {"id": "4", "problem": eval_a, "solution": "x"},
        {"id": "5", "problem": "What is 4+4?", "solution": "8"},
    ]
    pool, counts = build_pool(records, index=EvalIndex([EvalItem("a", eval_a)]))
    assert [p.id for p in pool] == ["1", "5"]
    assert counts == {"input": 5, "duplicate": 1, "no_solution": 1, "contaminated": 1, "pool": 2}


def test_assignment_never_the_target_and_deterministic():
    pool = [Pair("p0", "Same problem?", "s0"), Pair("p1", "Other problem?", "s1")]
    for seed in range(20):
        records = [{"id": "r", "problem": "same  PROBLEM?"}]
        assign_unrelated(records, pool, seed=seed)
        assert (records[0]["unrelated_problem"], records[0]["unrelated_solution"]) == ("Other problem?", "s1")
    many = [Pair(f"p{i}", f"Problem {i}?", f"s{i}") for i in range(50)]
    runs = []
    for seed in (7, 7, 8):
        records = [{"id": str(i), "problem": f"Target {i}?"} for i in range(10)]
        assign_unrelated(records, many, seed=seed)
        runs.append([r["unrelated_id"] for r in records])
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert len(set(runs[0])) == 10  # a permutation: no repeats while the pool lasts


def test_assignment_errors():
    with pytest.raises(ValueError, match="empty"):
        assign_unrelated([{"id": "r", "problem": "x"}], [], seed=0)
    with pytest.raises(ValueError, match="row 'r'"):
        assign_unrelated([{"id": "r", "problem": "Same?"}], [Pair("p", "same ?", "s")], seed=0)
