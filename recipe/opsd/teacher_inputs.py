"""Token-level teacher inputs of OPSD rollouts (pure: torch + the prompt modules; no verl or ray).

For every rollout the teacher sees its own prompt -- ``prompts.build_prompt_pair(teacher_context,
extra_info)`` rendered by ``chat.render_ids`` in ``teacher_mode``, at most
``teacher_max_prompt_length`` tokens (longer is an error naming the row, never truncated) --
followed by the student's response TOKEN IDS (``chat.splice_teacher_inputs``: never decoded, no pad
in between). ``reference_only`` gives Purified OPSD's reference-only prompt instead
(``prompts.reference_only_messages``: the teacher prompt without the question).

``check_student_prompts`` guards the other side: the parquet ``prompt`` the student generated from
must be the student message of the same teacher context rendered in ``student_mode`` (the
instruction-only contexts change the student message; a parquet built for another context would
silently run another experiment).

Both are cached per row (``extra_info`` id, index and problem), so a row is rendered and checked
once per run; ``student_prompt_ids`` (the rendering the check compares with) is also the student
prompt of the SFT term (``recipe.opsd.sft_inputs``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch


class TeacherInputs:
    """The teacher prompts of one OPSD run and the check of the student prompts.

    Example::

        inputs = TeacherInputs.from_config(opsd_config, tokenizer)
        inputs.check_student_prompts(prompt_ids_per_row, extra_infos)
        tensors = inputs.spliced(extra_infos, responses_BR, response_attention_BR)
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
        """From a validated ``recipe.opsd.config.OPSDConfig``."""
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
    """What identifies a row of the data set for the per-row caches (``extra_info`` id, index, problem)."""
    return (extra_info.get("id"), extra_info.get("index"), extra_info.get("problem"))
