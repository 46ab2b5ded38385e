"""Token-level inputs of the SFT term (``opsd.objective.sft_weight``; pure: torch + the prompt modules).

The SFT term is the student's NLL of each row's reference solution given its student prompt
(docs/core_math.md, "Mixed objectives" (c)). Per row:

- prompt: the student message of ``opsd.teacher_context`` rendered in ``opsd.student_mode`` --
  ``TeacherInputs.student_prompt_ids``, the rendering the rollout prompts are checked against, so
  exactly the prompt the rollouts were generated from;
- target s: ``extra_info["solution"]`` tokenized without special tokens, then the tokenizer's EOS
  (the token a rollout stops at; the pre-flight gate checks it closes an assistant turn); at most
  ``max_length`` tokens: a longer solution keeps its first ``max_length`` tokens and no EOS (it did
  not end there) and is reported as truncated, never cut silently;
- spliced as the teacher inputs are (``chat.splice_teacher_inputs``: prompt left-padded, solution
  right-padded in the last S columns), so verl's ``left_right_2_no_padding`` and the engine's
  response-row gather treat the solution as the "response".

Both the prompt and the solution ids are cached per row.

Example::

    sft = SFTInputs(student_prompt_ids=teacher_inputs.student_prompt_ids, tokenizer=tok, max_length=1024)
    tensors = sft.spliced(extra_infos)   # input_ids_BT, ..., responses_BS, response_mask_BS, truncated_B
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from recipe.opsd.teacher_inputs import row_key

SOLUTION_FIELD = "solution"


class SFTInputs:
    """The SFT rows of one OPSD run: student prompt + reference solution + EOS, per row."""

    def __init__(self, *, student_prompt_ids: Callable[[Mapping], Sequence[int]], tokenizer, max_length: int):
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"opsd.objective.sft_max_length must be an integer >= 1, got {max_length!r}")
        if tokenizer.eos_token_id is None:
            raise ValueError("opsd.objective.sft_weight > 0 ends each solution with the tokenizer's EOS, "
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
                    f"row id={extra_info.get('id')!r} (index {extra_info.get('index')!r}): opsd.objective.sft_weight > 0 "
                    f"trains on the reference solution, but its extra_info.{SOLUTION_FIELD} is {shown!r}; use a data set "
                    f"whose every row has a non-empty {SOLUTION_FIELD!r}, or set opsd.objective.sft_weight=0"
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
