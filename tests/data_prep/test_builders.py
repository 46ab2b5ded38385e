"""Builders on fixture files the tests write: schema, bad rows, decontamination, unrelated pairs."""

import json

import pandas as pd
import pytest

from data_prep import dapo, eval_sets, openmathreasoning, openthoughts
from data_prep.common import DEFAULT_EVAL_DIR, read_parquet_rows
from recipe.common.prompts import eval_messages, student_messages


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ot_rows(eval_a):
    good = [
        {"problem": f"Compute {i} + {i}.", "solution": f"It is {2 * i}.", "answer": str(2 * i), "cot": f"{i} doubled."}
        for i in range(1, 7)
    ]
    bad = [
        {"problem": "No solution here.", "solution": None, "answer": "1", "cot": "c"},  # row 6: missing
        {"problem": "Empty answer.", "solution": "s", "answer": "   ", "cot": "c"},  # row 7: empty
        {"problem": "Dict cot.", "solution": "s", "answer": "1", "cot": {"x": 1}},  # row 8: non-string
        {"problem": eval_a.upper().replace(" ", "   "), "solution": "s", "answer": "207", "cot": "c"},  # row 9: planted
    ]
    return good + bad


def dapo_rows(extra=()):
    rows = [
        {"id": "dapo-0", "problem": "How many primes are below 10?", "answer": "4"},
        {"id": "dapo-1", "problem": "How  many primes are BELOW 10?", "answer": "4"},  # duplicate of 0
        {"id": "dapo-2", "problem": "What is 7*6?", "answer": "42"},
        {"id": "dapo-3", "problem": "Sum of 1..10?", "answer": "55"},
        {"id": "dapo-4", "problem": "Sum of 1..11?", "answer": "66"},
        {"id": "dapo-5", "problem": "Roots of x^2-1?", "answer": "2"},
        {"id": "dapo-6", "problem": "Roots of x^{2}-1?", "answer": "3"},  # conflicting duplicate of 5
    ]
    return rows + list(extra)


def run_ot(tmp_path, eval_dir, eval_a, *extra, out="ot.parquet"):
    src = write_jsonl(tmp_path / "ot.jsonl", ot_rows(eval_a))
    pool = write_jsonl(tmp_path / "dapo.jsonl", dapo_rows())
    argv = ["--input", str(src), "--out", str(tmp_path / out), "--eval-dir", str(eval_dir), "--dapo", str(pool), *extra]
    return openthoughts.build(openthoughts.parser().parse_args(argv)), tmp_path / out


def test_openthoughts_schema_counts_and_reports(tmp_path, eval_dir, eval_texts):
    summary, out = run_ot(tmp_path, eval_dir, eval_texts[0])
    assert summary["stages"] == {
        "source_rows": 10, "before_decontamination": 7, "after_decontamination": 6, "written": 6,
    }
    assert summary["drops"] == {
        "missing_solution": 1, "empty_answer": 1, "non_string_cot": 1, "decontamination_exact": 1,
    }
    assert summary["dropped_ids"]["missing_solution"] == ["openthoughts-000006"]
    assert summary["dropped_ids"]["decontamination_exact"] == ["openthoughts-000009"]
    assert summary["second_pass_overlaps"] == 0 and summary["second_pass_rows_checked"] == 6
    report = json.loads((tmp_path / "ot.decontamination.json").read_text())
    assert report == [{"id": "openthoughts-000009", "field": "problem", "eval_id": "a-01", "reason": "exact", "overlap": 1.0}]
    assert json.loads((tmp_path / "ot.summary.json").read_text())["stages"]["written"] == 6

    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = read_parquet_rows(out)
    first = rows[0]
    assert first["data_source"] == "openthoughts_math_30k" and first["ability"] == "math"
    assert first["prompt"] == student_messages("Compute 1 + 1.")
    assert first["reward_model"] == {"style": "rule", "ground_truth": "2"}
    extra = first["extra_info"]
    assert set(extra) == {"id", "index", "split", "problem", "solution", "answer", "cot", "unrelated_problem", "unrelated_solution"}
    assert (extra["id"], extra["index"], extra["split"]) == ("openthoughts-000000", 0, "train")
    assert (extra["solution"], extra["answer"], extra["cot"]) == ("It is 2.", "2", "1 doubled.")
    # DAPO pool: the problem and its final answer (DAPO has no worked solutions)
    pool = {r["problem"]: r["answer"] for r in dapo_rows()}
    for row in rows:
        assert pool[row["extra_info"]["unrelated_problem"]] == row["extra_info"]["unrelated_solution"]
    assert summary["unrelated_pool"]["duplicate"] == 2  # dapo-1 and dapo-6 (first occurrence kept)


def test_openthoughts_unrelated_pairs_deterministic_and_never_self(tmp_path, eval_dir, eval_texts):
    _, out1 = run_ot(tmp_path, eval_dir, eval_texts[0], "--unrelated-pool", "self", "--seed", "1", out="a.parquet")
    _, out2 = run_ot(tmp_path, eval_dir, eval_texts[0], "--unrelated-pool", "self", "--seed", "1", out="b.parquet")
    _, out3 = run_ot(tmp_path, eval_dir, eval_texts[0], "--unrelated-pool", "self", "--seed", "2", out="c.parquet")
    pairs = [[(r["extra_info"]["problem"], r["extra_info"]["unrelated_problem"]) for r in read_parquet_rows(p)] for p in (out1, out2, out3)]
    assert pairs[0] == pairs[1] and pairs[0] != pairs[2]
    for run in pairs:
        assert all(problem != unrelated and unrelated for problem, unrelated in run)
    solutions = {r["extra_info"]["problem"]: r["extra_info"]["solution"] for r in read_parquet_rows(out1)}
    for row in read_parquet_rows(out1):
        assert row["extra_info"]["unrelated_solution"] == solutions[row["extra_info"]["unrelated_problem"]]


def test_openthoughts_strict_names_row_and_no_overwrite(tmp_path, eval_dir, eval_texts):
    with pytest.raises(ValueError, match=r"row 'openthoughts-000006': field 'solution'.*missing"):
        run_ot(tmp_path, eval_dir, eval_texts[0], "--strict")
    run_ot(tmp_path, eval_dir, eval_texts[0])
    before = (tmp_path / "ot.parquet").read_bytes()
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_ot(tmp_path, eval_dir, eval_texts[0], "--seed", "3")
    assert (tmp_path / "ot.parquet").read_bytes() == before
    run_ot(tmp_path, eval_dir, eval_texts[0], "--seed", "3", "--overwrite")


def test_openthoughts_configurable_columns(tmp_path, eval_dir):
    rows = [{"question": "Q?", "reference": "R.", "final": 5, "trace": "T."}]
    src = write_jsonl(tmp_path / "x.jsonl", rows)
    argv = ["--input", str(src), "--out", str(tmp_path / "x.parquet"), "--eval-dir", str(eval_dir),
            "--problem-key", "question", "--solution-key", "reference", "--answer-key", "final", "--cot-key", "trace",
            "--unrelated-pool", "none"]
    openthoughts.build(openthoughts.parser().parse_args(argv))
    extra = read_parquet_rows(tmp_path / "x.parquet")[0]["extra_info"]
    assert (extra["problem"], extra["solution"], extra["answer"], extra["cot"]) == ("Q?", "R.", "5", "T.")
    assert extra["unrelated_problem"] == "" and extra["unrelated_solution"] == ""
    with pytest.raises(ValueError, match="no column 'problem'"):
        openthoughts.build(openthoughts.parser().parse_args(["--input", str(src), "--out", str(tmp_path / "y.parquet"), "--eval-dir", str(eval_dir)]))


def test_dapo_dedup_conflicts_and_decontamination(tmp_path, eval_dir, eval_texts):
    src = write_jsonl(tmp_path / "d.jsonl", dapo_rows([{"id": "dapo-7", "problem": eval_texts[1], "answer": "1"},
                                                        {"id": "dapo-8", "problem": "", "answer": "1"}]))
    summary = dapo.build(dapo.parser().parse_args(["--input", str(src), "--out", str(tmp_path / "d.parquet"), "--eval-dir", str(eval_dir)]))
    assert summary["drops"] == {"duplicate": 1, "conflicting_duplicate": 2, "decontamination_exact": 1, "empty_problem": 1}
    assert summary["dropped_ids"]["conflicting_duplicate"] == ["dapo-5", "dapo-6"]
    rows = read_parquet_rows(tmp_path / "d.parquet")
    assert [r["extra_info"]["id"] for r in rows] == ["dapo-0", "dapo-2", "dapo-3", "dapo-4"]
    assert rows[1]["reward_model"]["ground_truth"] == "42" and rows[1]["prompt"] == student_messages("What is 7*6?")


def test_openmathreasoning_split_and_length_buckets(tmp_path, eval_dir, tokenizer_dir):
    rows = [
        {"problem": "P0?", "generated_solution": "<think>\nthink 0\n</think>\n\nshort", "expected_answer": "1"},
        {"problem": "P1?", "generated_solution": "<think>t</think>" + "x" * 40, "expected_answer": "2"},
        {"problem": "P2?", "generated_solution": "no think block", "expected_answer": "3"},
        {"problem": "P3?", "generated_solution": "<think>a</think>b</think>c", "expected_answer": "4"},
        {"problem": "P4?", "generated_solution": "<think>\n\n</think>sol", "expected_answer": "5"},
        {"problem": "P5?", "generated_solution": "<think>t</think>sol", "expected_answer": "x^2"},
    ]
    src = write_jsonl(tmp_path / "omr.jsonl", rows)
    base = ["--input", str(src), "--eval-dir", str(eval_dir), "--unrelated-pool", "none"]
    summary = openmathreasoning.build(openmathreasoning.parser().parse_args(base + ["--out", str(tmp_path / "all.parquet")]))
    assert summary["drops"] == {"no_think_close": 1, "multiple_think_close": 1, "empty_cot": 1}
    out = read_parquet_rows(tmp_path / "all.parquet")
    assert [(r["extra_info"]["cot"], r["extra_info"]["solution"]) for r in out] == [("think 0", "short"), ("t", "x" * 40), ("t", "sol")]
    # char tokenizer: "short" = 5 tokens, "x"*40 = 40 tokens, "sol" = 3 tokens; bounds inclusive
    summary = openmathreasoning.build(openmathreasoning.parser().parse_args(
        base + ["--out", str(tmp_path / "b.parquet"), "--tokenizer", str(tokenizer_dir), "--solution-tokens", "4:40"]))
    assert summary["drops"]["solution_tokens_outside_4:40"] == 1
    assert summary["dropped_ids"]["solution_tokens_outside_4:40"] == ["omr-000005"]
    assert [r["extra_info"]["problem"] for r in read_parquet_rows(tmp_path / "b.parquet")] == ["P0?", "P1?"]
    summary = openmathreasoning.build(openmathreasoning.parser().parse_args(
        base + ["--out", str(tmp_path / "c.parquet"), "--tokenizer", str(tokenizer_dir), "--solution-tokens", "3:5",
                "--integer-answers-only"]))
    assert summary["drops"]["non_integer_answer"] == 1 and summary["drops"]["solution_tokens_outside_3:5"] == 1
    assert [r["extra_info"]["problem"] for r in read_parquet_rows(tmp_path / "c.parquet")] == ["P0?"]
    # nothing in 6..39 tokens: an error, not an empty file
    with pytest.raises(ValueError, match="no rows left"):
        openmathreasoning.build(openmathreasoning.parser().parse_args(
            base + ["--out", str(tmp_path / "d.parquet"), "--tokenizer", str(tokenizer_dir), "--solution-tokens", "6:39"]))
    assert not (tmp_path / "d.parquet").exists()


def test_eval_sets_from_repo_data(tmp_path):
    summary = eval_sets.build(DEFAULT_EVAL_DIR, tmp_path / "eval", overwrite=False)
    assert summary["total_rows"] == 120
    assert set(summary["sets"]) == {"aime2024", "aime2025", "aime2026", "hmmt_feb_2025"}
    rows = read_parquet_rows(tmp_path / "eval" / "hmmt_feb_2025.parquet")
    assert len(rows) == 30
    first = rows[0]
    assert first["data_source"] == "hmmt_feb_2025" and first["extra_info"]["split"] == "test"
    assert first["prompt"] == eval_messages(first["extra_info"]["problem"])
    assert first["reward_model"]["ground_truth"] == "103" and first["extra_info"]["id"] == "hmmt-feb-2025-01"
    with pytest.raises(FileExistsError):
        eval_sets.build(DEFAULT_EVAL_DIR, tmp_path / "eval", overwrite=False)


def test_eval_sets_bad_row_is_an_error(tmp_path):
    d = tmp_path / "ev"
    d.mkdir()
    write_jsonl(d / "x.jsonl", [{"id": "x-1", "problem": "P", "answer": ""}])
    with pytest.raises(ValueError, match="row 'x-1': field 'answer'"):
        eval_sets.build(d, tmp_path / "out", overwrite=False)


def test_sft_export_round_trips_generated_solution(tmp_path, eval_dir, tokenizer_dir):
    from transformers import AutoTokenizer

    from data_prep import sft

    generated = "<think>\nI think.\n</think>\n\nThe answer is $\\boxed{1}$."
    rows = [
        {"problem": "P0?", "generated_solution": generated, "expected_answer": "1"},
        {"problem": "P1?", "generated_solution": "<think>\n" + "t" * 300 + "\n</think>\n\nS.", "expected_answer": "2"},
    ]
    src = write_jsonl(tmp_path / "omr.jsonl", rows)
    openmathreasoning.build(openmathreasoning.parser().parse_args(
        ["--input", str(src), "--eval-dir", str(eval_dir), "--unrelated-pool", "none", "--out", str(tmp_path / "omr.parquet")]))
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    full = tok.apply_chat_template([{"role": "user", "content": "P0?"}, {"role": "assistant", "content": generated}], tokenize=False)
    cap = len(tok(full, add_special_tokens=False)["input_ids"])
    summary = sft.build(sft.parser().parse_args(
        ["--input", str(tmp_path / "omr.parquet"), "--tokenizer", str(tokenizer_dir), "--max-length", str(cap),
         "--out", str(tmp_path / "sft.parquet")]))
    assert summary["drops"] == {f"sequence_over_{cap}": 1} and summary["dropped_ids"][f"sequence_over_{cap}"] == ["omr-000001"]
    frame = pd.read_parquet(tmp_path / "sft.parquet")
    messages = [dict(m) for m in frame.iloc[0]["messages"]]
    assert messages[1] == {"role": "assistant", "content": "The answer is $\\boxed{1}$.", "reasoning_content": "I think."}
    # rendering the split record gives back exactly the source generated_solution
    assert tok.apply_chat_template(messages, tokenize=False) == full
    # verl's MultiTurnSFTDataset renders turn by turn: the concatenation equals the whole render
    per_turn = "".join(tok.apply_chat_template([m], tokenize=False) for m in messages)
    assert per_turn == full


@pytest.mark.slow
def test_load_errors_name_the_source(tmp_path, monkeypatch):
    from data_prep.common import load_records
    from recipe.common.cli import InputError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such input file"):
        load_records(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match=r"x.txt: unknown file type '.txt'"):
        (tmp_path / "x.txt").write_text("a")
        load_records(str(tmp_path / "x.txt"))
    with pytest.raises(InputError, match=r"no-such-org/no-such-dataset: could not load dataset.*local"):
        load_records("no-such-org/no-such-dataset")


def test_malformed_jsonl_line_is_named_by_file_and_line(tmp_path):
    from data_prep.common import load_records
    from recipe.common.cli import InputError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "a", "answer": "1"}\n\n{"problem": "b", "answer": 2,}\n')
    with pytest.raises(InputError) as info:
        load_records(str(bad))
    assert str(info.value).startswith(f"{bad}:3: not valid JSON")
    bad.write_text('{"problem": "a"}\n["not", "an", "object"]\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: expected a JSON object, got list"):
        load_records(str(bad))


def test_local_formats_and_limit(tmp_path):
    from data_prep.common import load_records

    rows = [{"problem": f"P{i}", "answer": i} for i in range(5)]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "a.parquet")
    (tmp_path / "a.csv").write_text("problem,answer\n" + "".join(f"P{i},{i}\n" for i in range(5)))
    write_jsonl(tmp_path / "a.jsonl", rows)
    for name in ("a.json", "a.parquet", "a.csv", "a.jsonl"):
        source = load_records(str(tmp_path / name), limit=3)
        assert source.columns == ["problem", "answer"] and len(source.rows) == 3, name
        assert [str(r["answer"]) for r in source.rows] == ["0", "1", "2"], name
    assert len(load_records(str(tmp_path / "a.parquet")).rows) == 5
