"""Per-template prompt-length filtering: exact token counts with a character tokenizer."""

import json

import pytest
from transformers import AutoTokenizer

from data_prep import length_filter
from data_prep.common import Counts, make_row, read_parquet_rows
from data_prep.length_filter import filter_rows, parse_context_spec
from recipe.common.chat import render, render_ids
from recipe.common.prompts import build_prompt_pair, student_messages


def record(i, *, problem="P?", solution="S.", cot="", answer="1"):
    return {"id": f"r{i}", "index": i, "problem": problem, "solution": solution, "answer": answer, "cot": cot,
            "unrelated_problem": "U?", "unrelated_solution": "V."}


def rows_of(records):
    return [make_row(r, data_source="t", split="train", prompt=student_messages(r["problem"])) for r in records]


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def n_tokens(tok, messages, mode):
    return len(render_ids(messages, tok, mode))


def test_counts_are_rendered_token_counts(tok):
    student, teacher = build_prompt_pair("full_solution", record(0))
    # character tokenizer: specials are 1 token each, every other character 1 token
    text = render(student, tok, "no_think")
    specials = text.count("<|im_start|>") + text.count("<|im_end|>") + text.count("<think>") + text.count("</think>")
    plain = len(text) - sum(len(s) * text.count(s) for s in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"))
    assert n_tokens(tok, student, "no_think") == specials + plain
    assert length_filter.token_counts(tok, [text]) == [n_tokens(tok, student, "no_think")]


def test_caps_drop_never_truncate_and_count_per_reason(tok):
    short, long_solution, long_problem = record(0), record(1, solution="x" * 400), record(2, problem="P" * 700 + "?")
    rows = rows_of([short, long_solution, long_problem])
    s_len = n_tokens(tok, build_prompt_pair("full_solution", short)[0], "no_think")
    t_len = n_tokens(tok, build_prompt_pair("full_solution", short)[1], "think")
    t_len_long = n_tokens(tok, build_prompt_pair("full_solution", long_solution)[1], "think")
    cap = t_len + 10
    assert t_len_long > cap and s_len < cap
    assert n_tokens(tok, build_prompt_pair("full_solution", long_problem)[0], "no_think") > cap
    counts = Counts()
    kept = filter_rows(rows, tok, student_mode="no_think", teacher_mode="think",
                       teacher_contexts=[("full_solution", cap)], max_prompt_length=cap, counts=counts)
    assert [r["extra_info"]["id"] for r in kept] == ["r0"]
    assert kept[0] == rows[0]  # untouched, not truncated
    assert dict(counts.drops) == {f"student_prompt_over_{cap}": 1, f"teacher_full_solution_prompt_over_{cap}": 1}
    assert counts.dropped_ids[f"teacher_full_solution_prompt_over_{cap}"] == ["r1"]
    assert counts.notes["kept_prompt_tokens"]["full_solution"] == {"max": t_len, "mean": float(t_len)}
    # a cap equal to the length keeps the row (<=)
    exact = filter_rows(rows[:1], tok, student_mode="no_think", teacher_mode="think",
                        teacher_contexts=[("full_solution", t_len)], max_prompt_length=s_len, counts=Counts())
    assert len(exact) == 1
    assert filter_rows(rows[:1], tok, student_mode="no_think", teacher_mode="think",
                       teacher_contexts=[("full_solution", t_len - 1)], max_prompt_length=s_len, counts=Counts()) == []


def test_modes_change_the_count(tok):
    rows = rows_of([record(0)])
    s_think = n_tokens(tok, rows[0]["prompt"], "think")
    assert n_tokens(tok, rows[0]["prompt"], "no_think") == s_think + 6  # <think>\n\n</think>\n\n
    assert len(filter_rows(rows, tok, student_mode="think", teacher_mode="think", teacher_contexts=[],
                           max_prompt_length=s_think, counts=Counts())) == 1
    counts = Counts()
    assert filter_rows(rows, tok, student_mode="no_think", teacher_mode="think", teacher_contexts=[],
                       max_prompt_length=s_think, counts=counts) == []
    assert dict(counts.drops) == {f"student_prompt_over_{s_think}": 1}


def test_joint_contexts_keep_identical_rows(tok):
    recs = [record(0, cot="c" * 50), record(1, cot="c" * 900), record(2, cot="")]
    counts = Counts()
    kept = filter_rows(rows_of(recs), tok, student_mode="think", teacher_mode="think",
                       teacher_contexts=[parse_context_spec("full_solution"), parse_context_spec("cot_solution:800")],
                       counts=counts)
    assert [r["extra_info"]["id"] for r in kept] == ["r0"]
    assert dict(counts.drops) == {"teacher_cot_solution_prompt_over_800": 1, "teacher_cot_solution_missing_field": 1}
    with pytest.raises(ValueError, match="row 'r2'.*'cot'"):
        filter_rows(rows_of(recs), tok, student_mode="think", teacher_mode="think",
                    teacher_contexts=[("cot_solution", 8192)], counts=Counts(), strict=True)


def test_instruction_only_context_rewrites_student_prompt(tok):
    rows = rows_of([record(0)])
    kept = filter_rows(rows, tok, student_mode="think", teacher_mode="think",
                       teacher_contexts=[("concise_to_detailed", 1024)], counts=Counts())
    assert kept[0]["prompt"] == build_prompt_pair("concise_to_detailed", rows[0]["extra_info"])[0]
    assert kept[0]["prompt"] != rows[0]["prompt"]
    with pytest.raises(ValueError, match="different student messages"):
        filter_rows(rows, tok, student_mode="think", teacher_mode="think",
                    teacher_contexts=[("concise_to_detailed", 1024), ("full_solution", 1024)], counts=Counts())


def test_context_spec_defaults():
    assert parse_context_spec("full_solution") == ("full_solution", 1024)
    assert parse_context_spec("cot_solution") == ("cot_solution", 8192)
    assert parse_context_spec("answer_only:300") == ("answer_only", 300)
    with pytest.raises(ValueError, match="not one of"):
        parse_context_spec("solution")
    with pytest.raises(ValueError, match="positive integer"):
        parse_context_spec("unrelated:-5")


def test_cli_end_to_end(tmp_path, tokenizer_dir):
    import pandas as pd

    src = tmp_path / "in.parquet"
    pd.DataFrame(rows_of([record(0), record(1, solution="y" * 2000)])).to_parquet(src, index=False)
    out = tmp_path / "out.parquet"
    argv = ["--input", str(src), "--tokenizer", str(tokenizer_dir), "--student-mode", "no_think",
            "--teacher-mode", "think", "--teacher-context", "full_solution", "--out", str(out)]
    assert length_filter.main(argv) == 0
    assert [r["extra_info"]["id"] for r in read_parquet_rows(out)] == ["r0"]
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["drops"] == {"teacher_full_solution_prompt_over_1024": 1}
    assert summary["teacher_contexts"] == {"full_solution": 1024} and summary["student_mode"] == "no_think"
    with pytest.raises(FileExistsError):
        length_filter.main(argv)


def test_cli_native_mode_for_a_template_without_switch(tmp_path, tokenizer_dir, tok):
    """A ChatML template without enable_thinking (SmolLM2's shape): native mode counts the template's own
    rendering; think is refused with the chat module's error."""
    import pandas as pd

    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    src = tmp_path / "in.parquet"
    pd.DataFrame(rows_of([record(0), record(1, solution="y" * 2000)])).to_parquet(src, index=False)
    common = ["--input", str(src), "--tokenizer", str(tokenizer_dir), "--chat-template", str(template),
              "--teacher-context", "full_solution"]
    out = tmp_path / "out.parquet"
    assert length_filter.main([*common, "--student-mode", "native", "--teacher-mode", "native", "--out", str(out)]) == 0
    assert [r["extra_info"]["id"] for r in read_parquet_rows(out)] == ["r0"]
    kept = json.loads((tmp_path / "out.summary.json").read_text())["kept_prompt_tokens"]
    native_tok = length_filter.load_tokenizer(str(tokenizer_dir), template)
    student, teacher = build_prompt_pair("full_solution", record(0))
    assert kept["student"]["max"] == len(render_ids(student, native_tok, "native"))
    assert kept["full_solution"]["max"] == len(render_ids(teacher, native_tok, "native"))
    with pytest.raises(ValueError, match="no enable_thinking switch"):
        length_filter.main([*common, "--student-mode", "native", "--teacher-mode", "think", "--out", str(tmp_path / "b.parquet")])


def test_verl_rl_dataset_reads_filtered_parquet_and_agrees_on_length(tmp_path, tokenizer_dir, tok):
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    recs = [record(i, problem="Q" * n + "?") for i, n in enumerate((10, 300, 800, 1500))]
    src = tmp_path / "in.parquet"
    pd.DataFrame(rows_of(recs)).to_parquet(src, index=False)
    out = tmp_path / "out.parquet"
    assert length_filter.main(["--input", str(src), "--tokenizer", str(tokenizer_dir), "--student-mode", "no_think",
                               "--max-prompt-length", "1000", "--out", str(out)]) == 0
    kept = read_parquet_rows(out)
    assert [r["extra_info"]["id"] for r in kept] == ["r0", "r1", "r2"]
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1000, "filter_overlong_prompts": True,
                               "apply_chat_template_kwargs": {"enable_thinking": False}, "filter_overlong_prompts_workers": 1})
    # verl's own overlong filter, same mode and cap: keeps exactly our rows of the unfiltered file
    assert len(RLHFDataset(data_files=[str(src)], tokenizer=tok, config=config)) == 3
    dataset = RLHFDataset(data_files=[str(out)], tokenizer=tok, config=config)
    assert len(dataset) == 3
    item = dataset[1]
    assert item["raw_prompt"] == kept[1]["prompt"] and item["index"] == 1
    assert item["extra_info"]["problem"] == "Q" * 300 + "?"
