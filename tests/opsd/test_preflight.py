"""The pre-flight gate on hand-written chat templates (character-level tokenizer, no download).

Behaviour: the tiny model's own template passes in every mode pair; a template whose think switch
reacts to the prompt's content fails with a diff of the two renderings; a turn end that is not an
EOS, a parquet prompt of another context and a broken none control fail naming the row.
"""

from pathlib import Path

import pytest

import recipe.common.chat as chat
from recipe.models.tiny import build_char_tokenizer
from recipe.opsd.core.preflight import PreflightError, rendering_diff, run_preflight

ROWS = [
    {"id": "r0", "index": 0, "problem": "Compute 2+3.", "solution": "2+3=5\n\\boxed{5}", "answer": "5"},
    {"id": "r1", "index": 1, "problem": "Compute 4+4.", "solution": "4+4=8\n\\boxed{8}", "answer": "8"},
]
EOS = {2}  # <|im_end|> of build_char_tokenizer

CHATML_TURNS = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + END + '\\n' }}{% endfor %}"
)
# The think switch also fires on the prompt's content: the teacher's reference block turns thinking off.
CONTENT_SWITCH = (
    "{% set END = '<|im_end|>' %}" + CHATML_TURNS
    + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if (enable_thinking is defined and enable_thinking is false) or 'Reference' in messages[-1]['content'] %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)
# Well-behaved switch, but an assistant turn ends with <|endoftext|>, which is not the tokenizer's EOS.
WRONG_TURN_END = (
    "{% set END = '<|endoftext|>' %}" + CHATML_TURNS
    + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)


def _run(tokenizer, context="full_solution", student_mode="think", teacher_mode="think", rollout_prompts=None):
    return run_preflight(ROWS, teacher_context=context, student_mode=student_mode, teacher_mode=teacher_mode,
                         tokenizer=tokenizer, eos_ids=EOS, rollout_prompts=rollout_prompts)


@pytest.mark.parametrize("student_mode,teacher_mode", [("think", "think"), ("no_think", "no_think"),
                                                        ("think", "no_think"), ("no_think", "think")])
@pytest.mark.parametrize("context", ["full_solution", "answer_only", "concise_to_detailed"])
def test_the_tiny_models_template_passes(context, student_mode, teacher_mode):
    from recipe.common.prompts import build_prompt_pair

    tok = build_char_tokenizer()  # the tiny model's own template (chat_templates/qwen3.jinja)
    rollout = [build_prompt_pair(context, row)[0] for row in ROWS]
    report = _run(tok, context, student_mode, teacher_mode, rollout_prompts=rollout)
    summary = report.summary()
    assert summary.startswith(f"[opsd] preflight: ok (2 rows, context {context}, modes {student_mode}/{teacher_mode})")
    assert "'<|im_end|>' (id 2)" in summary
    no_think_suffix = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert report.student_suffix.endswith(no_think_suffix) == (student_mode == "no_think")
    assert report.teacher_suffix.endswith(no_think_suffix) == (teacher_mode == "no_think")
    # modes that differ on purpose are allowed, and said so
    assert ("differ on purpose" in summary) == (student_mode != teacher_mode)


def test_a_think_switch_that_differs_between_student_and_teacher_fails_with_the_diff():
    tok = build_char_tokenizer(chat_template=CONTENT_SWITCH)
    with pytest.raises(PreflightError) as info:
        _run(tok)
    message = str(info.value)
    assert message.startswith("row 0 (id='r0'): the teacher's generation prompt")
    assert "opsd.teacher_mode='think'" in message
    # the diff: student and teacher labels, the reference block added, the teacher's think block added
    assert "--- student" in message and "+++ teacher" in message
    assert "+=== Reference Solution Begin ===\\n" in message
    assert "+<think>\\n" in message and "+</think>\\n" in message
    # without a reference in the prompt the same template is consistent
    report = _run(tok, context="concise_to_detailed")
    assert report.rows == 2


def test_a_turn_end_that_is_not_an_eos_fails():
    tok = build_char_tokenizer(chat_template=WRONG_TURN_END)
    with pytest.raises(PreflightError, match=r"ends with '<\|endoftext\|>' \(id 0\), which is not an EOS the rollout "
                                             r"stops at \('<\|im_end\|>' \(id 2\)\)"):
        _run(tok)


def test_a_parquet_prompt_of_another_context_fails_with_the_diff():
    from recipe.common.prompts import build_prompt_pair

    tok = build_char_tokenizer()
    rollout = [build_prompt_pair("concise_to_detailed", row)[0] for row in ROWS]
    with pytest.raises(PreflightError) as info:
        _run(tok, "full_solution", rollout_prompts=rollout)
    message = str(info.value)
    assert "row 0 (id='r0'): the parquet `prompt` the student rolls out from is not the student message" in message
    assert "-Write a concise solution" in message


def test_a_none_control_that_differs_fails(monkeypatch):
    """The control compares the trainer's own splice of the teacher input with the student input: a
    splice that shifted the positions (here: one extra left pad counted as a position) is caught."""
    real = chat.splice_teacher_inputs

    def shifted(*args, **kwargs):
        out = real(*args, **kwargs)
        out["position_ids_BT"] = out["position_ids_BT"] + 1
        return out

    monkeypatch.setattr(chat, "splice_teacher_inputs", shifted)
    with pytest.raises(PreflightError, match=r"row 0 \(id='r0'\): none control: .* positions differ"):
        _run(build_char_tokenizer())


def test_a_row_without_the_contexts_field_or_a_mode_the_template_lacks_names_the_row():
    with pytest.raises(PreflightError, match=r"row 0 \(id='r0'\): teacher context 'unrelated' needs .*'unrelated_problem'"):
        _run(build_char_tokenizer(), context="unrelated")
    plain = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|im_end|>' }}{% endfor %}"
    with pytest.raises(PreflightError, match=r"row 0 \(id='r0'\): mode='think' was asked for, but .* no enable_thinking"):
        _run(build_char_tokenizer(chat_template=plain))
    # the same template in its native mode passes
    assert _run(build_char_tokenizer(chat_template=plain), student_mode="native", teacher_mode="native").rows == 2


def test_a_template_that_rewrites_the_content_still_gets_its_generation_prompt_checked():
    """A template that upper-cases the content: the generation prompt is what add_generation_prompt adds."""
    upper = CONTENT_SWITCH.replace("m['content'] + END", "m['content']|upper + END")
    tok = build_char_tokenizer(chat_template=upper)
    with pytest.raises(PreflightError, match="the teacher's generation prompt '<\\|im_start\\|>assistant\\\\n<think>"):
        _run(tok)


def test_a_template_that_rewrites_replies_skips_the_turn_end_check_and_says_so():
    lower = WRONG_TURN_END.replace("m['content'] + END", "m['content']|lower + END")
    report = _run(build_char_tokenizer(chat_template=lower))  # the wrong turn end is not visible any more
    assert "turn end not checked (the template does not render an assistant reply verbatim)" in report.summary()


def test_rendering_diff_shows_line_ends_and_is_capped():
    diff = rendering_diff("a\nb\n", "a\nc\n")
    assert diff.splitlines() == ["--- student", "+++ teacher", "@@ -1,2 +1,2 @@", " a\\n", "-b\\n", "+c\\n"]
    # a difference in a trailing newline alone is visible
    assert "-x" in rendering_diff("x", "x\n") and "+x\\n" in rendering_diff("x", "x\n")
    long = rendering_diff("\n".join(map(str, range(200))), "\n".join(map(str, range(1, 201))), max_lines=10)
    assert len(long.splitlines()) == 11 and long.splitlines()[-1].startswith("... (")
    assert rendering_diff("same", "same") == "(the two renderings are identical as text)"



# --- the driver's gate (main_opsd.preflight_gate): the composed config, a parquet and a tokenizer directory
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "opsd" / "config")


def _gate(tmp_path, template=None, overrides=()):
    from hydra import compose, initialize_config_dir

    from recipe.opsd.startup import preflight_gate, prepare_config
    from recipe.toy.demo import write_tiny_data

    model_dir = tmp_path / "model"
    build_char_tokenizer(chat_template=template).save_pretrained(model_dir)
    data = write_tiny_data(tmp_path / "data")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="opsd_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data['train']}", *overrides])
    return preflight_gate(cfg, prepare_config(cfg))


def test_the_driver_gate_reads_the_first_rows_and_the_tokenizer(tmp_path):
    line = _gate(tmp_path, overrides=["opsd.teacher_mode=no_think"])
    assert line.startswith("[opsd] preflight: ok (4 rows, context full_solution, modes think/no_think)")
    with pytest.raises(PreflightError, match="the teacher's generation prompt"):
        _gate(tmp_path / "switch", template=CONTENT_SWITCH)


def test_the_driver_gate_skips_what_it_cannot_read_and_says_so(tmp_path):
    from hydra import compose, initialize_config_dir

    from recipe.opsd.startup import preflight_gate, prepare_config

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="opsd_trainer", overrides=[
            f"actor_rollout_ref.model.path={tmp_path / 'model'}", "data.train_files=hdfs://cluster/train.parquet"])
    assert preflight_gate(cfg, prepare_config(cfg)).startswith(
        "[opsd] preflight: skipped (cannot read the `prompt` and `extra_info` columns of hdfs://cluster/train.parquet")


@pytest.mark.parametrize("value", ["maybe", "1"])
def test_preflight_must_be_a_bool(value):
    from recipe.opsd.core.config import OPSDConfig

    assert OPSDConfig().diagnostics.preflight is True
    assert OPSDConfig(diagnostics={"preflight": False}).diagnostics.preflight is False
    with pytest.raises(ValueError, match="opsd.diagnostics.preflight must be true or false"):
        OPSDConfig(diagnostics={"preflight": value})
