"""Step dumps (``opsd.diagnostics.dump_steps=true``): what one OPSD step scored, so it can be re-scored later.

Written by the trainer once per step, before the update, to ``<trainer.default_local_dir>/step_dumps/step_<s>.pt``
(``torch.save`` of plain lists and dicts): per rollout row the student prompt, the response, the teacher prompt
(and a reference-only prompt), the loss positions and the data set index (``step_rows``), and for the step the
``opsd.loss`` block and the driver's RNG states (``write_step_dump``). The re-scoring side is
``recipe.analysis.replay`` (the student's weights at step s are those of checkpoint s - 1, the initial model for
step 1; the teacher is the initial model); the command: docs/opsd_recipe.md, "Step dumps".
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

DUMP_DIR = "step_dumps"
FORMAT_VERSION = 1


def dump_path(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / DUMP_DIR / f"step_{int(step)}.pt"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def unpadded_rows(ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> list[list[int]]:
    """Each row's ids where ``mask_BT`` is set (left / right padding removed)."""
    return [row[mask.bool()].tolist() for row, mask in zip(ids_BT, mask_BT)]


def split_teacher_inputs(teacher_rows: list[list[int]], response_rows: list[list[int]], *, what: str) -> list[list[int]]:
    """The teacher prompts of spliced teacher inputs (prompt + response ids), checked to end in the response."""
    prompts = []
    for b, (full, response) in enumerate(zip(teacher_rows, response_rows)):
        cut = len(full) - len(response)
        if cut < 0 or full[cut:] != response:
            raise ValueError(f"row {b}: the {what} input does not end with the row's response ids")
        prompts.append(full[:cut])
    return prompts


def step_rows(*, prompts_BP: torch.Tensor, responses_BR: torch.Tensor, attention_BT: torch.Tensor,
              loss_mask_BR: torch.Tensor, extra_infos, teacher_inputs: dict[str, tuple[torch.Tensor, torch.Tensor]]
              ) -> dict[str, list]:
    """The per-row lists of one step from the actor batch: prompts left-padded and responses right-padded
    under ``attention_BT``; ``teacher_inputs``: dump key (``teacher_prompt_ids``, ``reference_prompt_ids``)
    -> (spliced input ids, attention mask) of that teacher input. Per rollout row:

    - ``prompt_ids``: the student prompt the rollout was generated from (no padding);
    - ``response_ids``: the sampled response (no padding);
    - ``teacher_prompt_ids``: the teacher prompt the response was spliced onto (the teacher input is
      ``teacher_prompt_ids + response_ids``); objectives with a reference forward: ``reference_prompt_ids`` too;
    - ``loss_mask``: the trainer's loss positions over the response (``advt`` / ``he`` / ``le``: the
      final selection is made on the workers and is not in the dump);
    - ``index``: the row's ``extra_info.index`` in the data set.
    """
    response_ids = unpadded_rows(responses_BR, attention_BT[:, -responses_BR.shape[1]:])
    lengths_B = [len(ids) for ids in response_ids]
    rows = {
        "prompt_ids": unpadded_rows(prompts_BP, attention_BT[:, : prompts_BP.shape[1]]),
        "response_ids": response_ids,
        "loss_mask": [mask[:n].tolist() for mask, n in zip(loss_mask_BR.bool(), lengths_B)],
        "index": [info.get("index") for info in extra_infos],
    }
    for key, (ids_BT, mask_BT) in teacher_inputs.items():
        rows[key] = split_teacher_inputs(unpadded_rows(ids_BT, mask_BT), response_ids, what=key)
    return rows


def write_step_dump(path: str | os.PathLike, *, step: int, rows: dict[str, list], loss_config: dict,
                    rng: dict | None = None) -> Path:
    """Write one step's dump (``rows``: equal-length per-row lists, ``step_rows``).

    Besides the rows: ``step``, the ``opsd.loss`` block and ``rng``: the driver's python / numpy / torch RNG
    states at the dump (the rollout's own sampling randomness lives in the rollout servers; the dump records
    the ids it produced, which is what a re-score needs). Written to a temporary name and renamed: a killed
    run leaves no half file; a step replayed after a resume replaces its dump, as its metrics line supersedes
    the earlier one.
    """
    lengths = {key: len(values) for key, values in rows.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"step dump rows of different lengths: {lengths}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    torch.save({"format": FORMAT_VERSION, "step": int(step), "rows": rows, "loss_config": dict(loss_config),
                "rng": rng if rng is not None else rng_state()}, tmp)
    os.replace(tmp, path)
    return path


def read_step_dump(path: str | os.PathLike) -> dict:
    dump = torch.load(Path(path), map_location="cpu", weights_only=False)
    if not isinstance(dump, dict) or dump.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: not an OPSD step dump of format {FORMAT_VERSION}")
    return dump
