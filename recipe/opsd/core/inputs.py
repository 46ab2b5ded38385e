"""Token-level inputs of the teacher and SFT forwards (pure: torch + recipe.common; no verl or ray).

``TeacherInputs``: per rollout the teacher prompt of ``teacher_context`` (or Purified OPSD's reference-only
prompt) followed by the student's response TOKEN IDS, never decoded, and the check that the parquet prompt
the student generated from is the student message of that context. ``SFTInputs`` (``opsd.loss.sft_weight``
> 0): the student prompt followed by the row's reference solution + EOS. Both cache per row (``row_key``).

Example::

    inputs = TeacherInputs.from_config(opsd_config, tokenizer)
    tensors = inputs.spliced(extra_infos, responses_BR, response_attention_BR)   # input_ids_BT, ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

SOLUTION_FIELD = "solution"


class TeacherInputs:
    """The teacher prompts of one OPSD run and the check of the student prompts.

    For every rollout the teacher sees its own prompt -- ``prompts.build_prompt_pair(teacher_context,
    extra_info)`` rendered by ``chat.render_ids`` in ``teacher_mode``, at most ``teacher_max_prompt_length``
    tokens (longer is an error naming the row, never truncated) -- followed by the student's response TOKEN
    IDS (``chat.splice_teacher_inputs``: never decoded, no pad in between). ``reference_only`` gives Purified
    OPSD's reference-only prompt instead (``prompts.reference_only_messages``: the teacher prompt without the
    question). ``check_student_prompts`` guards the other side: the parquet ``prompt`` the student generated
    from must be the student message of the same teacher context rendered in ``student_mode`` (the
    instruction-only contexts change the student message; a parquet built for another context would
    silently run another experiment): ``inputs.check_student_prompts(prompt_ids_per_row, extra_infos)``.
    """

    def __init__(
        self, *, teacher_context: str, student_mode, teacher_mode, teacher_max_prompt_length: int, tokenizer,
        teacher_tokenizer=None,
    ):
        self.teacher_context = teacher_context
        self.student_mode = student_mode
        self.teacher_mode = teacher_mode
        self.teacher_max_prompt_length = int(teacher_max_prompt_length)
        self.tokenizer = tokenizer
        # renders the teacher prompts: the teacher model's own chat template (teacher kind checkpoint;
        # same vocabulary), else the student's tokenizer
        self.teacher_tokenizer = tokenizer if teacher_tokenizer is None else teacher_tokenizer
        self._teacher_prompts: dict = {}
        self._student_prompts: dict = {}
        self._checked_rows: set = set()

    @classmethod
    def from_config(cls, opsd_config, tokenizer, *, teacher_tokenizer=None) -> "TeacherInputs":
        """From a validated ``recipe.opsd.core.config.OPSDConfig``."""
        return cls(
            teacher_context=opsd_config.teacher_context,
            student_mode=opsd_config.student_mode,
            teacher_mode=opsd_config.teacher_mode,
            teacher_max_prompt_length=opsd_config.teacher_max_prompt_length,
            tokenizer=tokenizer,
            teacher_tokenizer=teacher_tokenizer,
        )

    def teacher_prompt_ids(self, extra_info: Mapping, *, reference_only: bool = False) -> list[int]:
        """Rendered teacher prompt of one row (``reference_only``: Purified OPSD's reference-only prompt)."""
        from recipe.common.chat import render_ids
        from recipe.common.prompts import build_prompt_pair, reference_only_messages

        key = (reference_only, *row_key(extra_info))
        if key not in self._teacher_prompts:
            if reference_only:
                messages = reference_only_messages(self.teacher_context, dict(extra_info))
            else:
                _, messages = build_prompt_pair(self.teacher_context, dict(extra_info))
            ids = list(render_ids(messages, self.teacher_tokenizer, self.teacher_mode))
            if len(ids) > self.teacher_max_prompt_length:
                raise ValueError(
                    f"{'reference-only ' if reference_only else ''}teacher prompt of row id={extra_info.get('id')!r} "
                    f"has {len(ids)} tokens > opsd.teacher_max_prompt_length={self.teacher_max_prompt_length} "
                    f"(context {self.teacher_context!r}, mode {self.teacher_mode!r}); filter the data "
                    "with data_prep's length filter or raise the cap"
                )
            self._teacher_prompts[key] = ids
        return self._teacher_prompts[key]

    def student_prompt_ids(self, extra_info: Mapping) -> list[int]:
        """The student message of ``teacher_context`` for one row rendered in ``student_mode``: the
        prompt the rollouts must have been generated from (cached per row; a copy is returned)."""
        from recipe.common.chat import render_ids
        from recipe.common.prompts import build_prompt_pair

        key = row_key(extra_info)
        if key not in self._student_prompts:
            student_messages, _ = build_prompt_pair(self.teacher_context, dict(extra_info))
            self._student_prompts[key] = list(render_ids(student_messages, self.tokenizer, self.student_mode))
        return list(self._student_prompts[key])

    def check_student_prompts(self, prompt_ids: Sequence[Sequence[int]], extra_infos: Sequence[Mapping]) -> None:
        """Raise unless each row's rollout prompt ids (unpadded) are the student message of
        ``teacher_context`` for that row, rendered in ``student_mode``."""
        for actual, info in zip(prompt_ids, extra_infos, strict=True):
            key = row_key(info)
            if key in self._checked_rows:
                continue
            expected = self.student_prompt_ids(info)
            actual = list(actual)
            if actual != expected:
                raise ValueError(
                    f"row id={info.get('id')!r}: the parquet `prompt` the student generated from is not the student "
                    f"message of opsd.teacher_context={self.teacher_context!r} rendered in "
                    f"opsd.student_mode={self.student_mode!r} ({len(actual)} vs {len(expected)} tokens; "
                    f"rollout prompt starts {self.tokenizer.decode(actual[:48])!r}, expected "
                    f"{self.tokenizer.decode(expected[:48])!r}); rebuild the parquet for this context with "
                    "python -m data_prep.length_filter --teacher-context ..."
                )
            self._checked_rows.add(key)

    def spliced(
        self,
        extra_infos: Sequence[Mapping],
        responses_BR: torch.Tensor,
        response_attention_BR: torch.Tensor,
        *,
        reference_only: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Teacher prompt + the student's response ids per row, left/right padded like verl's batch:
        ``input_ids_BT``, ``attention_mask_BT``, ``position_ids_BT`` (``chat.splice_teacher_inputs``)."""
        from recipe.common.chat import splice_teacher_inputs

        prompts = [self.teacher_prompt_ids(info, reference_only=reference_only) for info in extra_infos]
        return splice_teacher_inputs(
            prompts, responses_BR, response_attention_BR, pad_token_id=self.tokenizer.pad_token_id
        )


def row_key(extra_info: Mapping) -> tuple:
    """What identifies a row of the data set for the per-row caches (``extra_info`` id, index and problem)."""
    return (extra_info.get("id"), extra_info.get("index"), extra_info.get("problem"))


class SFTInputs:
    """The SFT rows of one OPSD run: student prompt + reference solution + EOS, per row.

    The inputs of the SFT term (docs/core_math.md, "Objectives": the student's NLL of each row's reference
    solution given its student prompt). Per row the prompt is ``TeacherInputs.student_prompt_ids`` (exactly
    the prompt the rollouts were generated from); the target is ``extra_info["solution"]`` tokenized without
    special tokens, then the tokenizer's EOS, at most ``max_length`` tokens (a longer solution keeps its first
    ``max_length`` tokens and no EOS and is reported as truncated, never cut silently); spliced as the
    teacher inputs are (prompt left-padded, solution right-padded in the last S columns), so verl's
    ``left_right_2_no_padding`` and the engine's response-row gather treat the solution as the "response".

    Example::

        sft = SFTInputs(student_prompt_ids=inputs.student_prompt_ids, tokenizer=tokenizer, max_length=1024)
        sft_tensors = sft.spliced(extra_infos)   # input_ids_BT, ..., responses_BS, response_mask_BS, truncated_B
    """

    def __init__(self, *, student_prompt_ids: Callable[[Mapping], Sequence[int]], tokenizer, max_length: int):
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"opsd.loss.sft_max_length must be an integer >= 1, got {max_length!r}")
        if tokenizer.eos_token_id is None:
            raise ValueError("opsd.loss.sft_weight > 0 ends each solution with the tokenizer's EOS, "
                             f"but tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no eos_token")
        self.student_prompt_ids = student_prompt_ids
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._solutions: dict = {}

    def solution_ids(self, extra_info: Mapping) -> tuple[list[int], bool]:
        """(the row's target ids, whether they were cut to ``max_length``)."""
        key = row_key(extra_info)
        if key not in self._solutions:
            text = extra_info.get(SOLUTION_FIELD)
            if not isinstance(text, str) or not text.strip():
                shown = text if not isinstance(text, str) else text[:40]
                raise ValueError(
                    f"row id={extra_info.get('id')!r} (index {extra_info.get('index')!r}): opsd.loss.sft_weight > 0 "
                    f"trains on the reference solution, but its extra_info.{SOLUTION_FIELD} is {shown!r}; use a data set "
                    f"whose every row has a non-empty {SOLUTION_FIELD!r}, or set opsd.loss.sft_weight=0"
                )
            ids = [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
            ids.append(int(self.tokenizer.eos_token_id))
            truncated = len(ids) > self.max_length
            self._solutions[key] = (ids[: self.max_length], truncated)
        ids, truncated = self._solutions[key]
        return list(ids), truncated

    def spliced(self, extra_infos: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        """Per row the student prompt (left-padded) then the target (right-padded):
        ``input_ids_BT``, ``attention_mask_BT``, ``position_ids_BT`` (T = P + S), the target
        ``responses_BS`` / ``response_mask_BS`` (the last S columns) and ``truncated_B`` (bool)."""
        from recipe.common.chat import splice_teacher_inputs

        prompts = [self.student_prompt_ids(info) for info in extra_infos]
        targets = [self.solution_ids(info) for info in extra_infos]
        width = max(len(ids) for ids, _ in targets)
        pad = self.tokenizer.pad_token_id
        pad = int(self.tokenizer.eos_token_id if pad is None else pad)
        responses_BS = torch.full((len(targets), width), pad, dtype=torch.long)
        response_mask_BS = torch.zeros((len(targets), width), dtype=torch.long)
        for row, (ids, _) in enumerate(targets):
            responses_BS[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask_BS[row, : len(ids)] = 1
        spliced = splice_teacher_inputs(prompts, responses_BS, response_mask_BS, pad_token_id=pad)
        return {
            **spliced,
            "responses_BS": responses_BS,
            "response_mask_BS": response_mask_BS,
            "truncated_B": torch.tensor([cut for _, cut in targets], dtype=torch.bool),
        }
