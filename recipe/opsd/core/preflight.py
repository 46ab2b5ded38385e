"""Pre-flight gate of an OPSD run: student and teacher renderings of a few training rows agree where they
must, and the divergence of the first response positions (pure: stdlib, torch and the prompt, chat, loss
and signal modules; no verl, ray or model).

The most frequent complaint in the peers' issues is a student/teacher template or thinking-mode mismatch
that trains silently on the wrong signal. ``run_preflight`` runs the four tokenizer-only checks of
``check_row`` on the driver before Ray (seconds at any model size); a failure raises ``PreflightError``
with the readable diff of the two renderings (``rendering_diff``). The workers' part, at the start of
training, scores the reference solution's first K tokens with the real models; its pure pieces live here
(``divergence_report``). What a user sees: docs/opsd_recipe.md, "Start-up checks".
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["PreflightError", "PreflightReport", "rendering_diff", "generation_suffix", "turn_end_text",
           "check_row", "run_preflight", "control_response", "position_window_edges", "window_means",
           "first_position_values", "none_control_tolerance", "teacher_is_student", "DivergenceReport",
           "divergence_report"]

# training rows the gate checks (the first rows of the first train file / of the train dataset)
GATE_ROWS = 4
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
    from recipe.common.chat import template_kwargs

    kwargs = template_kwargs(mode)
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
        modes = f"{self.student_mode}/{self.teacher_mode}"
        line = (f"[opsd] preflight: ok ({self.rows} rows, context {self.teacher_context}, modes {modes}): rollout "
                f"prompts are the context's student message; none control gives identical inputs (divergence 0); "
                f"generation prompts student {self.student_suffix!r} teacher {self.teacher_suffix!r}; turn end "
                f"{self.turn_end}; {self.seconds:.2f} s")
        return "\n".join([line, *(f"[opsd] preflight note: {note}" for note in self.notes)])


def check_row(extra_info: Mapping, *, rollout_messages: Sequence[Mapping] | None, teacher_context: str,
              student_mode, teacher_mode, tokenizer, eos_ids, row: int = 0) -> dict:
    """The four checks on one row; raises ``PreflightError`` with the diff.

    The row (``extra_info`` of the training parquet) is rendered with the project's one prompt builder
    (``prompts.build_prompt_pair``) and renderer (``chat.render_ids``, as the trainer's ``TeacherInputs``
    renders the teacher and verl's agent loop the student):

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
    response = control_response(extra_info, tokenizer, tokens=CONTROL_RESPONSE_TOKENS)
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


def control_response(extra_info: Mapping, tokenizer, *, tokens: int) -> list[int]:
    """The teacher-forced response of the gate: the first ``tokens`` tokens of the reference solution
    (or the answer, or the problem), at least one token (EOS for an empty row)."""
    text = extra_info.get("solution") or extra_info.get("answer") or extra_info.get("problem") or "x"
    ids = tokenizer(str(text), add_special_tokens=False)["input_ids"][:tokens]
    return [int(i) for i in ids] or [int(tokenizer.eos_token_id)]


def control_batch(infos: Sequence[Mapping], *, teacher_inputs, tokens: int):
    """The workers' part's rows: each row twice -- the student prompt of the configured context with its
    teacher prompt (``teacher_inputs``, a ``recipe.opsd.core.inputs.TeacherInputs``), then the none
    control (student and teacher prompt of context ``none``, both in the student's mode) -- with the
    reference solution's first ``tokens`` tokens as the response (``control_response``).

    Returns (student, teacher, responses_BR, response_mask_BR): the two sides in verl's layout
    (``chat.splice_teacher_inputs``: prompt left-padded, response right-padded), each padded to its own
    longest prompt -- the none rows sit behind more left padding on the teacher side (its context rows
    are longer), as teacher and student rows do in training.
    """
    import torch

    from recipe.common.chat import render_ids, splice_teacher_inputs
    from recipe.common.prompts import build_prompt_pair
    from recipe.opsd.core.inputs import TeacherInputs

    tokenizer, mode = teacher_inputs.tokenizer, teacher_inputs.student_mode
    none_inputs = TeacherInputs(teacher_context="none", student_mode=mode, teacher_mode=mode,
                                teacher_max_prompt_length=1 << 30, tokenizer=tokenizer)
    student_prompts, teacher_prompts, responses = [], [], []
    for context, inputs in ((teacher_inputs.teacher_context, teacher_inputs), ("none", none_inputs)):
        for info in infos:
            student_messages, _ = build_prompt_pair(context, info)
            student_prompts.append(render_ids(student_messages, tokenizer, mode))
            teacher_prompts.append(inputs.teacher_prompt_ids(info))
            responses.append(control_response(info, tokenizer, tokens=tokens))
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    width = max(len(ids) for ids in responses)
    responses_BR = torch.tensor([ids + [pad] * (width - len(ids)) for ids in responses])
    response_mask_BR = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in responses])
    student = splice_teacher_inputs(student_prompts, responses_BR, response_mask_BR, pad_token_id=pad)
    teacher = splice_teacher_inputs(teacher_prompts, responses_BR, response_mask_BR, pad_token_id=pad)
    return student, teacher, responses_BR, response_mask_BR


def run_preflight(rows: Sequence[Mapping], *, teacher_context: str, student_mode, teacher_mode, tokenizer,
                  eos_ids, rollout_prompts: Sequence | None = None) -> PreflightReport:
    """``check_row`` on every row; a ``PreflightReport`` (or the first row's ``PreflightError``), whose
    ``summary()`` is the one log line.

    Example::

        report = run_preflight(rows, teacher_context="full_solution", student_mode="think",
                               teacher_mode="think", tokenizer=tok, eos_ids={tok.eos_token_id})
        print(report.summary())
    """
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



# ----------------------------------------------------------------------------- the workers' part
# The model-level report (run on the workers at the start of training, recipe.opsd.worker
# .OPSDActorRolloutRefWorker.preflight_divergence, assembled by the trainer): the pure pieces.

# window edges of the report: positions [0, 4), [4, 16), [16, K) (those below K)
WINDOW_EDGES = (0, 4, 16)
# the none control's largest per-position divergence allowed when the teacher has the student's weights,
# by the dtype of the hidden states. Identical inputs through identical weights give bitwise-identical
# logits when both forwards run the same kernels on the same shapes (measured: exactly 0 on the CPU path,
# bf16 autocast, for frozen_initial, ema, live and LoRA). Half precision keeps a margin for GPU kernels
# that are not bitwise reproducible across batch shapes (dynamic micro-batching can pack the teacher's
# and the student's rows differently): bf16 rounding of the logits gives ~1e-4-1e-3 nats, not measured
# (no GPU here); a padding / position / template glue bug gives far more on a trained model.
NONE_CONTROL_TOLERANCE = {"float64": 1e-9, "float32": 1e-6, "bfloat16": 2e-2, "float16": 2e-2}


def position_window_edges(k: int) -> tuple[tuple[int, int], ...]:
    """The report's windows [lo, hi) over the first ``k`` response positions: (0, 4), (4, 16),
    (16, k), cut at k (k = 16: (0, 4), (4, 16); k = 3: (0, 3))."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    edges = [edge for edge in WINDOW_EDGES if edge < k] + [k]
    return tuple(zip(edges[:-1], edges[1:]))


def window_means(values_RK, mask_RK, *, windows) -> list[float]:
    """Mean (float64) of ``values_RK`` over the true entries of ``mask_RK`` whose column (response
    position) is in each window [lo, hi), pooled over rows; NaN for an empty window."""
    import torch

    from recipe.opsd.core.signals import position_windows

    if values_RK.shape != mask_RK.shape or values_RK.dim() != 2:
        raise ValueError(f"values_RK and mask_RK must be 2-D of the same shape; got {tuple(values_RK.shape)} and "
                         f"{tuple(mask_RK.shape)}")
    mask = mask_RK.bool()
    positions_RK = torch.arange(values_RK.shape[1]).expand(values_RK.shape)
    return [w["mean"] for w in position_windows(values_RK[mask], positions_RK[mask], windows=windows)]


def first_position_values(student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH, sampled_ids_N, *,
                          student_bias=None, teacher_bias=None, beta: float, clip_tau, student_temperature: float,
                          teacher_temperature, topk=None, chunk_size: int = 1024) -> dict:
    """Per position [N] (no grad): ``divergence``, the loss's d_t (eq. opsd_clipped: per-entry capped,
    beta, temperatures, top-k support; the fused pass the actor runs, ``signals.
    weighted_divergence_and_signals``), ``fwd_kl`` (unclipped forward KL, the logged diagnostic) and
    ``control``: d_t with the teacher at the student's temperature (identical inputs and weights then
    give 0 whatever the configured temperatures)."""
    import torch

    from recipe.opsd.core.losses import fused_linear_weighted_divergence
    from recipe.opsd.core.signals import token_signals_from_hidden, weighted_divergence_and_signals

    options = dict(student_bias=student_bias, teacher_bias=teacher_bias, beta=beta, clip_tau=clip_tau,
                   student_temperature=student_temperature, chunk_size=chunk_size)
    zeros_N = torch.zeros(student_hidden_NH.shape[0], device=student_hidden_NH.device)
    hidden = (student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH)

    def divergence(temperature):
        if topk is None:
            _, values_N, signals = weighted_divergence_and_signals(
                *hidden, sampled_ids_N, row_weights_N=zeros_N, teacher_temperature=temperature, **options)
            return values_N, signals["fwd_kl"]
        _, values_N = fused_linear_weighted_divergence(*hidden, row_weights_N=zeros_N, topk=topk,
                                                       teacher_temperature=temperature, **options)
        signals = token_signals_from_hidden(*hidden, sampled_ids_N, student_bias=student_bias, teacher_bias=teacher_bias,
                                            student_temperature=student_temperature, teacher_temperature=temperature,
                                            clip_tau=clip_tau, chunk_size=chunk_size)
        return values_N, signals["fwd_kl"]

    with torch.no_grad():
        values_N, fwd_kl_N = divergence(teacher_temperature)
        same = teacher_temperature is None or float(teacher_temperature) == float(student_temperature)
        control_N = values_N if same else divergence(student_temperature)[0]
    return {"divergence": values_N.detach(), "fwd_kl": fwd_kl_N.detach(), "control": control_N.detach()}


def none_control_tolerance(dtype_name: str) -> float:
    """The none control's tolerance for hidden states of ``dtype_name`` (``NONE_CONTROL_TOLERANCE``)."""
    name = str(dtype_name).removeprefix("torch.")
    if name not in NONE_CONTROL_TOLERANCE:
        raise ValueError(f"no none-control tolerance for dtype {dtype_name!r}; known: {sorted(NONE_CONTROL_TOLERANCE)}")
    return NONE_CONTROL_TOLERANCE[name]


def teacher_is_student(kind: str, *, resumed: bool) -> bool:
    """Whether the teacher of kind ``kind`` scores with the student's weights now: always for a kind that
    ``is_student``; before the first update of a fresh run (not after a resume) for one that
    ``starts_as_student``; never otherwise (``recipe.opsd.core.teacher_kinds``)."""
    from recipe.opsd.core.teacher_kinds import teacher_kind

    flags = teacher_kind(kind)
    return flags.is_student or (flags.starts_as_student and not resumed)


def _number(value: float) -> str:
    return "nan" if value != value else ("0" if value == 0 else f"{value:.4g}")


@dataclass
class DivergenceReport:
    """The workers' part of the gate: per window, the mean divergence and forward KL of the
    configured context and of ``none``, and the none control. ``lines()`` is what the trainer
    prints, ``metrics()`` what it logs (``preflight/...``)."""

    k: int
    rows: int
    teacher_context: str
    teacher_kind: str
    windows: tuple
    # {"context" | "none": {"divergence" | "fwd_kl": [mean per window]}}
    table: dict
    control_max: float
    weights_equal: bool
    tolerance: float
    dtype: str
    settings: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.weights_equal or self.control_max <= self.tolerance  # NaN fails

    def verdict(self) -> str:
        value = _number(self.control_max)
        if not self.weights_equal:
            return (f"none control max divergence {value} (reported only: the teacher ({self.teacher_kind}) does not "
                    "have the student's weights now)")
        if self.ok:
            return (f"none control max divergence {value} <= {self.tolerance:g} (teacher {self.teacher_kind} has the "
                    f"student's weights, {self.dtype})")
        return (f"none control max divergence {value} > {self.tolerance:g}: the teacher ({self.teacher_kind}) has the "
                f"student's weights and the none prompt is the student's prompt token for token, so the worker path "
                "gives the teacher other inputs than the student (position ids, padding, attention mask or the "
                "teacher/student splice), or other weights")

    def lines(self) -> list[str]:
        prefix = "[opsd] preflight positions:"
        labels = [f"{lo}-{hi - 1}" if hi - lo > 1 else f"{lo}" for lo, hi in self.windows]
        names = {"context": self.teacher_context, "none": "none"}
        width = max(len(name) for name in names.values())
        out = [f"{prefix} divergence of the first {self.k} response positions ({self.rows} rows, the reference "
               f"solution teacher-forced; teacher {self.teacher_kind}{'; ' + self.settings if self.settings else ''})",
               f"{prefix} {'context'.ljust(width)}  {'measure'.ljust(10)}  " + "  ".join(label.rjust(10) for label in labels)]
        for side, name in names.items():
            for measure in ("divergence", "fwd_kl"):
                cells = "  ".join(_number(v).rjust(10) for v in self.table[side][measure])
                out.append(f"{prefix} {name.ljust(width)}  {measure.ljust(10)}  {cells}")
        out.append(f"{prefix} {'ok' if self.ok else 'FAILED'}: {self.verdict()}; {self.seconds:.2f} s")
        return out

    def metrics(self) -> dict:
        out = {}
        for side in ("context", "none"):
            for measure in ("divergence", "fwd_kl"):
                for (lo, hi), value in zip(self.windows, self.table[side][measure]):
                    out[f"preflight/{side}/{measure}_p{lo}_{hi - 1}"] = value
        out["preflight/none_control_max"] = self.control_max
        out["preflight/seconds"] = self.seconds
        return out


def divergence_report(values: Mapping, *, mask_RK, is_none_R, k: int, teacher_context: str, teacher_kind: str,
                      weights_equal: bool, dtype: str, settings: str = "", seconds: float = 0.0) -> DivergenceReport:
    """The report from the workers' per-position values (``first_position_values`` keys, each [R, K]):
    rows with ``is_none_R`` true are the none control's, the others the configured context's (the same
    rows in the same order).

    The workers' part of the gate runs at the start of training with the real student and teacher: the
    reference solution's first K tokens (``control_response``) are scored under the student prompt, the
    configured teacher prompt and the ``none`` teacher prompt; the pure pieces live in this module:
    ``first_position_values`` (the loss's per-position divergence, the forward KL and the ``none``
    control's divergence from hidden states and lm_head weights), ``position_window_edges`` /
    ``window_means`` (the per-window averages) and this function (the table, the metrics and the ``none``
    check)."""
    import torch

    is_none_R = torch.as_tensor(is_none_R, dtype=torch.bool)
    mask_RK = torch.as_tensor(mask_RK).bool()
    windows = position_window_edges(k)
    table = {}
    for side, rows_R in (("context", ~is_none_R), ("none", is_none_R)):
        table[side] = {measure: window_means(torch.as_tensor(values[measure])[rows_R], mask_RK[rows_R], windows=windows)
                       for measure in ("divergence", "fwd_kl")}
    control_RK = torch.as_tensor(values["control"]).double()[is_none_R]
    control = control_RK[mask_RK[is_none_R]]
    control_max = float(control.abs().max()) if control.numel() else float("nan")
    if control.numel() and not bool(torch.isfinite(control).all()):
        control_max = float("nan")
    return DivergenceReport(k=k, rows=int(is_none_R.sum()), teacher_context=teacher_context, teacher_kind=teacher_kind,
                            windows=windows, table=table, control_max=control_max, weights_equal=weights_equal,
                            tolerance=none_control_tolerance(dtype), dtype=str(dtype).removeprefix("torch."),
                            settings=settings, seconds=seconds)
