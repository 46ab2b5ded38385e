"""Toy data files: RL rows in the verl schema, SFT mix shares, held-out rows, context benchmark."""

import pytest

from recipe.common.prompts import BOXED_INSTRUCTION, build_prompt_pair, eval_messages, student_messages
from recipe.models.tiny import build_char_tokenizer
from recipe.toy.data import DEFAULT_SFT_MIX, check_mix, heldout_jsonl_rows, prompt_phrases, rl_rows, sft_rows
from recipe.toy.student import StudentConfig, context_benchmark_rows
from recipe.toy.task import DATA_SOURCE, TaskConfig, make_records


@pytest.fixture(scope="module")
def records():
    return make_records(TaskConfig(n_train=2000, n_heldout=8, seed=1))


def test_rl_rows_schema(records):
    rows = rl_rows(records["heldout"])
    assert len(rows) == 8
    for row, record in zip(rows, records["heldout"]):
        assert row["data_source"] == DATA_SOURCE and row["ability"] == "math"
        assert row["prompt"] == student_messages(record["problem"])
        assert row["reward_model"] == {"style": "rule", "ground_truth": record["answer"]}
        assert row["extra_info"]["problem"] == record["problem"]
        assert row["extra_info"]["solution"] == record["solution"]
        assert row["extra_info"]["split"] == "heldout" and row["extra_info"]["index"] == record["index"]
        # one parquet serves every teacher context
        for context in ("full_solution", "answer_only", "unrelated", "none"):
            build_prompt_pair(context, row["extra_info"])


def test_sft_mix_shares_and_turns(records):
    rows = sft_rows(records["train"], seed=0)
    assert rows == sft_rows(records["train"], seed=0)
    assert [r["sft_kind"] for r in rows] != [r["sft_kind"] for r in sft_rows(records["train"], seed=1)]
    n = len(rows)
    for kind, share in DEFAULT_SFT_MIX.items():
        # binomial: 4 standard deviations of the share at n = 2000
        assert abs(sum(r["sft_kind"] == kind for r in rows) / n - share) < 4 * (share * (1 - share) / n) ** 0.5
    for row in rows:
        record = row["extra_info"]
        user, assistant = row["messages"]
        assert assistant == {"role": "assistant", "content": record["solution"]}
        expected = {
            "problem": student_messages(record["problem"]),
            "eval": eval_messages(record["problem"]),
            "full_solution": build_prompt_pair("full_solution", record)[1],
            "answer_only": build_prompt_pair("answer_only", record)[1],
        }[row["sft_kind"]]
        assert [user] == expected


def test_sft_assistant_turn_renders_no_think(records):
    row = sft_rows(records["train"][:1])[0]
    tokenizer = build_char_tokenizer()
    text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
    prompt = tokenizer.apply_chat_template(row["messages"][:1], tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
    assert text.startswith(prompt)
    assert text[len(prompt):] == row["extra_info"]["solution"] + "<|im_end|>\n"


def test_single_kind_mix_and_bad_mix(records):
    rows = sft_rows(records["train"][:50], mix={"full_solution": 1.0})
    assert {r["sft_kind"] for r in rows} == {"full_solution"}
    with pytest.raises(ValueError, match="unknown kinds"):
        check_mix({"cot": 1.0})
    with pytest.raises(ValueError, match="sum to 1"):
        check_mix({"problem": 0.5, "eval": 0.4})


def test_heldout_rows_and_full_solution_benchmark_is_the_teacher_prompt(records):
    plain = heldout_jsonl_rows(records["heldout"])
    assert plain[0] == {"id": records["heldout"][0]["id"], "problem": records["heldout"][0]["problem"],
                        "answer": records["heldout"][0]["answer"]}
    with_context = context_benchmark_rows(records["heldout"])
    for row, record in zip(with_context, records["heldout"]):
        assert eval_messages(row["problem"]) == build_prompt_pair("full_solution", record)[1]
        assert record["solution"] in row["problem"]


def test_student_config_hash_is_stable_and_sensitive():
    assert StudentConfig().digest() == StudentConfig().digest()
    assert StudentConfig(sft_steps=7).digest() != StudentConfig().digest()
    with pytest.raises(ValueError, match="sft_steps"):
        StudentConfig(sft_steps=0)


def test_prompt_phrases_are_the_builders_literal_texts(records):
    phrases = prompt_phrases()
    assert "Problem: " in phrases
    assert "\n\n" + BOXED_INSTRUCTION in phrases
    assert all(any(c.isalpha() for c in p) for p in phrases) and len(set(phrases)) == len(phrases)
    # Every literal text of a real full-solution prompt is covered; the fields are not.
    record = records["train"][0]
    content = build_prompt_pair("full_solution", record)[1][0]["content"]
    rest = content
    for phrase in phrases:
        rest = rest.replace(phrase, "")
    assert rest == record["problem"] + record["solution"]


def test_phrase_tokenizer_shortens_prompts_and_keeps_text_and_fields(records):
    plain, phrased = build_char_tokenizer(), build_char_tokenizer(phrases=prompt_phrases())
    record = records["train"][0]
    for context in ("full_solution", "answer_only", "unrelated", "none"):
        for messages in build_prompt_pair(context, record):
            text = plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
            ids = phrased.encode(text, add_special_tokens=False)
            assert phrased.decode(ids) == text
            assert len(ids) < len(plain.encode(text, add_special_tokens=False))
    full = plain.apply_chat_template(build_prompt_pair("full_solution", record)[1], tokenize=False)
    tokens = phrased.tokenize(full)
    assert len(tokens) < 80  # 622 characters at the time of writing
    # Field values (the problem, the reference's digits) stay one token per character.
    assert "".join(tokens).count(record["answer"]) >= 2
    assert all(len(t) == 1 for t in phrased.tokenize(record["solution"]))
    # The response side is unchanged: the solution tokenizes like the plain tokenizer.
    assert phrased.encode(record["solution"], add_special_tokens=False) == plain.encode(
        record["solution"], add_special_tokens=False)
    with pytest.raises(ValueError, match="phrases"):
        build_char_tokenizer(phrases=["ab", "ab"])
