"""Pre-flight gate of an OPSD run: student and teacher renderings of a few training rows agree
where they must (pure: stdlib + the prompt, chat and teacher-input modules; no verl, ray or model).

The most frequent complaint in the peers' issues is a student/teacher template or thinking-mode
mismatch that trains silently on the wrong signal (docs/opsd_recipe.md, "Pre-flight gate"). For
each of a few rows (``extra_info`` of the training parquet), rendered with the project's one
prompt builder (``prompts.build_prompt_pair``) and renderer (``chat.render_ids``, as the trainer's
``TeacherInputs`` renders the teacher and verl's agent loop the student):

1. the rollout prompt -- the parquet ``prompt`` messages rendered in ``student_mode`` -- is the
   student message of ``teacher_context`` (a parquet built for another context runs another
   experiment);
2. ``none`` control: the teacher input of context ``none`` rendered in the student's mode, spliced
   with the same response tokens by the trainer's own splice (``chat.splice_teacher_inputs``), is
   the student's input token for token with the same position ids, so the frozen model gives
   identical logits and the divergence on those tokens is exactly zero; any difference is
   something other than the privileged context (a renderer or splice bug);
3. reasoning-mode tokens: each side's generation prompt (the rendered text after the last user
   message) is the one its mode gives on a neutral probe message, so a template whose think switch
   depends on the content (a reference solution holding ``/no_think``, a length rule, ...) fails,
   and with equal modes the two sides' generation prompts are equal;
4. EOS: the token that closes an assistant turn is the same for both renderings and is one the
   rollout stops at (``eos_ids``).

A failure raises ``PreflightError`` whose message is the readable diff of the two renderings
(``rendering_diff``); success returns a ``PreflightReport`` whose ``summary()`` is the one log line.
The gate needs the tokenizer only (seconds at any model size); why the model-level divergence of
the first response positions is not part of it yet: docs/opsd_recipe.md, "Pre-flight gate".

Example::

    report = run_preflight(rows, teacher_context="full_solution", student_mode="think",
                           teacher_mode="think", tokenizer=tok, eos_ids={tok.eos_token_id})
    print(report.summary())
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["PreflightError", "PreflightReport", "rendering_diff", "generation_suffix", "turn_end_text",
           "check_row", "run_preflight"]

# a neutral user message: the generation prompt of a mode is what the template appends after it
PROBE_MESSAGE = "PREFLIGHT PROBE"
# the assistant reply rendered to find the token that closes an assistant turn
PROBE_REPLY = "PREFLIGHT REPLY"
# response tokens of the none control (the reference solution's first tokens, teacher-forced)
CONTROL_RESPONSE_TOKENS = 8
# longest diff shown (lines); the rest is counted
MAX_DIFF_LINES = 60


class PreflightError(ValueError):
    """A pre-flight check failed; the message names the row and the check and holds the diff."""


def rendering_diff(student_text: str, teacher_text: str, *, student_label: str = "student",
                   teacher_label: str = "teacher", max_lines: int = MAX_DIFF_LINES) -> str:
    """Unified line diff of two renderings (special tokens visible, line ends shown as ``\\n``)."""
    def visible(text: str) -> list[str]:  # every line end shown as \\n, so a lone newline differs visibly
        return text.replace("\n", "\\n\n").splitlines()

    lines = list(difflib.unified_diff(visible(student_text), visible(teacher_text), fromfile=student_label,
                                      tofile=teacher_label, n=2, lineterm=""))
    shown = lines[:max_lines]
    if len(lines) > max_lines:
        shown.append(f"... ({len(lines) - max_lines} more diff lines)")
    return "\n".join(shown) if shown else "(the two renderings are identical as text)"


def _render_text(messages, tokenizer, mode, *, add_generation_prompt: bool = True) -> str:
    kwargs = {} if mode is None else {"enable_thinking": mode == "think"}
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def generation_suffix(messages: Sequence[Mapping], tokenizer, mode) -> str:
    """The generation prompt: what ``add_generation_prompt`` adds to the rendering (role header and
    any reasoning-mode tokens such as an empty ``<think></think>`` block); for a template whose
    rendering without it is not a prefix, the text after the last message's content."""
    from recipe.common.chat import render

    text = render(messages, tokenizer, mode)
    without = _render_text(messages, tokenizer, mode, add_generation_prompt=False)
    if text.startswith(without):
        return text[len(without):]
    at = text.rfind(messages[-1]["content"])
    return text[at + len(messages[-1]["content"]):] if at >= 0 else text


def turn_end_text(messages: Sequence[Mapping], tokenizer, mode) -> str | None:
    """What the template writes right after an assistant reply (the turn's end, e.g. ``<|im_end|>\\n``);
    None if the template does not render the reply verbatim."""
    conversation = [*messages, {"role": "assistant", "content": PROBE_REPLY}]
    text = _render_text(conversation, tokenizer, mode, add_generation_prompt=False)
    at = text.rfind(PROBE_REPLY)
    return None if at < 0 else text[at + len(PROBE_REPLY):]


def _first_token(text: str, tokenizer) -> int | None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    return int(ids[0]) if ids else None


def _token_name(tokenizer, token_id) -> str:
    return "none" if token_id is None else f"{tokenizer.convert_ids_to_tokens(int(token_id))!r} (id {token_id})"


@dataclass
class PreflightReport:
    """What the gate checked; ``summary()`` is the line the trainer prints."""

    rows: int
    teacher_context: str
    student_mode: str | None
    teacher_mode: str | None
    turn_end: str
    student_suffix: str
    teacher_suffix: str
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        modes = "/".join("native" if mode is None else mode for mode in (self.student_mode, self.teacher_mode))
        line = (f"[opsd] preflight: ok ({self.rows} rows, context {self.teacher_context}, modes {modes}): rollout "
                f"prompts are the context's student message; none control gives identical inputs (divergence 0); "
                f"generation prompts student {self.student_suffix!r} teacher {self.teacher_suffix!r}; turn end "
                f"{self.turn_end}; {self.seconds:.2f} s")
        return "\n".join([line, *(f"[opsd] preflight note: {note}" for note in self.notes)])


def check_row(extra_info: Mapping, *, rollout_messages: Sequence[Mapping] | None, teacher_context: str,
              student_mode, teacher_mode, tokenizer, eos_ids, row: int = 0) -> dict:
    """The four checks on one row (module docstring); raises ``PreflightError`` with the diff.

    ``rollout_messages``: the parquet ``prompt`` (chat messages verl renders for the rollout); None
    skips check 1. Returns the row's ``student_suffix``, ``teacher_suffix`` and ``turn_end`` text.
    """
    import torch

    from recipe.common.chat import render, render_ids, splice_teacher_inputs
    from recipe.common.prompts import build_prompt_pair

    where = f"row {row} (id={extra_info.get('id')!r})"
    student_messages, teacher_messages = build_prompt_pair(teacher_context, dict(extra_info))
    student_text = render(student_messages, tokenizer, student_mode)
    teacher_text = render(teacher_messages, tokenizer, teacher_mode)
    student_ids = render_ids(student_messages, tokenizer, student_mode)

    # 1. the rollout prompt is the context's student message
    if rollout_messages is not None:
        rollout_messages = [{"role": m["role"], "content": m["content"]} for m in rollout_messages]
        if render_ids(rollout_messages, tokenizer, student_mode) != student_ids:
            raise PreflightError(
                f"{where}: the parquet `prompt` the student rolls out from is not the student message of "
                f"opsd.teacher_context={teacher_context!r} in opsd.student_mode={student_mode!r}; rebuild the parquet "
                f"for this context (python -m data_prep.length_filter --teacher-context ...).\n"
                + rendering_diff(render(rollout_messages, tokenizer, student_mode), student_text,
                                 student_label="parquet prompt (rollout)", teacher_label=f"student message of {teacher_context}")
            )

    # 2. none control: the teacher path with no privilege gives the student's exact input
    none_student, none_teacher = build_prompt_pair("none", dict(extra_info))
    control_student = render_ids(none_student, tokenizer, student_mode)
    control_teacher = render_ids(none_teacher, tokenizer, student_mode)
    response = _control_response(extra_info, tokenizer)
    response_BR = torch.tensor([response], dtype=torch.long)
    spliced = splice_teacher_inputs([control_teacher], response_BR, torch.ones_like(response_BR),
                                    pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0))
    keep = spliced["attention_mask_BT"][0].bool()
    teacher_input = spliced["input_ids_BT"][0][keep].tolist()
    teacher_positions = spliced["position_ids_BT"][0][keep].tolist()
    student_input = control_student + response
    if teacher_input != student_input or teacher_positions != list(range(len(student_input))):
        raise PreflightError(
            f"{where}: none control: the teacher input of context 'none' is not the student's input token for token "
            f"({len(teacher_input)} vs {len(student_input)} tokens; positions "
            f"{'equal' if teacher_positions == list(range(len(student_input))) else 'differ'}), so the divergence "
            "would not be zero without privilege.\n"
            + rendering_diff(tokenizer.decode(student_input), tokenizer.decode(teacher_input),
                             student_label="student input (none)", teacher_label="teacher input (none)")
        )

    # 3. reasoning-mode tokens: each side's generation prompt is its mode's
    probe = [{"role": "user", "content": PROBE_MESSAGE}]
    suffixes = {"student": generation_suffix(student_messages, tokenizer, student_mode),
                "teacher": generation_suffix(teacher_messages, tokenizer, teacher_mode)}
    expected = {"student": generation_suffix(probe, tokenizer, student_mode),
                "teacher": generation_suffix(probe, tokenizer, teacher_mode)}
    modes = {"student": student_mode, "teacher": teacher_mode}
    for side in ("student", "teacher"):
        if suffixes[side] != expected[side]:
            raise PreflightError(
                f"{where}: the {side}'s generation prompt {suffixes[side]!r} is not what opsd.{side}_mode="
                f"{modes[side]!r} renders ({expected[side]!r}): the chat template switches the reasoning mode on the "
                f"prompt's content. Student and teacher renderings:\n" + rendering_diff(student_text, teacher_text)
            )
    if student_mode == teacher_mode and suffixes["student"] != suffixes["teacher"]:  # pragma: no cover - implied by 3
        raise PreflightError(f"{where}: equal modes, different generation prompts\n"
                             + rendering_diff(student_text, teacher_text))

    # 4. EOS: the same turn end on both sides, one the rollout stops at
    ends = {"student": turn_end_text(student_messages, tokenizer, student_mode),
            "teacher": turn_end_text(teacher_messages, tokenizer, teacher_mode)}
    if None in ends.values():  # the template rewrites an assistant reply: the turn end cannot be located
        return {"student_suffix": suffixes["student"], "teacher_suffix": suffixes["teacher"],
                "turn_end": "not checked (the template does not render an assistant reply verbatim)"}
    end_ids = {side: _first_token(text, tokenizer) for side, text in ends.items()}
    if end_ids["student"] != end_ids["teacher"]:
        raise PreflightError(
            f"{where}: an assistant turn ends with {_token_name(tokenizer, end_ids['student'])} in the student's "
            f"rendering and {_token_name(tokenizer, end_ids['teacher'])} in the teacher's.\n"
            + rendering_diff(ends["student"], ends["teacher"], student_label="student turn end", teacher_label="teacher turn end")
        )
    eos_ids = {int(i) for i in eos_ids}
    if end_ids["student"] not in eos_ids:
        raise PreflightError(
            f"{where}: an assistant turn ends with {_token_name(tokenizer, end_ids['student'])}, which is not an EOS "
            f"the rollout stops at ({', '.join(_token_name(tokenizer, i) for i in sorted(eos_ids)) or 'none'}): "
            "rollouts would run to the length cap. Fix the tokenizer's eos_token / generation_config.json"
        )
    return {"student_suffix": suffixes["student"], "teacher_suffix": suffixes["teacher"],
            "turn_end": _token_name(tokenizer, end_ids["student"])}


def _control_response(extra_info: Mapping, tokenizer) -> list[int]:
    """The none control's response tokens: the first tokens of the reference solution (or the problem)."""
    text = extra_info.get("solution") or extra_info.get("answer") or extra_info.get("problem") or "x"
    ids = tokenizer(str(text), add_special_tokens=False)["input_ids"][:CONTROL_RESPONSE_TOKENS]
    return [int(i) for i in ids] or [int(tokenizer.eos_token_id)]


def run_preflight(rows: Sequence[Mapping], *, teacher_context: str, student_mode, teacher_mode, tokenizer,
                  eos_ids, rollout_prompts: Sequence | None = None) -> PreflightReport:
    """``check_row`` on every row; a ``PreflightReport`` (or the first row's ``PreflightError``)."""
    if not rows:
        raise PreflightError("no training rows to check (data.train_files is empty)")
    start = time.perf_counter()
    seen = None
    for index, info in enumerate(rows):
        messages = None if rollout_prompts is None else rollout_prompts[index]
        try:
            result = check_row(info, rollout_messages=messages, teacher_context=teacher_context,
                               student_mode=student_mode, teacher_mode=teacher_mode, tokenizer=tokenizer,
                               eos_ids=eos_ids, row=index)
        except PreflightError:
            raise
        except ValueError as err:  # a field the context needs, a mode the template cannot render
            raise PreflightError(f"row {index} (id={info.get('id')!r}): {err}") from None
        seen = seen or result
    notes = []
    if student_mode != teacher_mode:
        notes.append(f"student_mode={student_mode!r} and teacher_mode={teacher_mode!r} differ on purpose: the "
                     f"teacher's generation prompt is {seen['teacher_suffix']!r}, the student's {seen['student_suffix']!r}")
    return PreflightReport(rows=len(rows), teacher_context=teacher_context, student_mode=student_mode,
                           teacher_mode=teacher_mode, turn_end=seen["turn_end"], student_suffix=seen["student_suffix"],
                           teacher_suffix=seen["teacher_suffix"], seconds=time.perf_counter() - start, notes=notes)

