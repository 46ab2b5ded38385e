"""Re-score a dumped OPSD step on a CPU (``opsd.diagnostics.dump_steps=true``; ``recipe.opsd.core.step_dump``).

    python -m recipe.analysis.replay CKPT_DIR/step_dumps/step_3.pt --student STUDENT_DIR --teacher MODEL_DIR

The student is the model the step scored: its weights before the step's update, i.e. the checkpoint of
step s - 1 merged to an HF directory (``scripts/merge_checkpoint.sh``), the initial model for step 1; the
teacher is the initial model (``frozen_initial``). Prints the step's token-level ``opsd/*`` diagnostics as
JSON, computed as the trainer logs them (``rescore_step``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from recipe.analysis.signal_scoring import output_head, response_hidden_states
from recipe.common import cli
from recipe.opsd.actor_loss import SIGNAL_METRICS
from recipe.opsd.core.signals import token_signals_from_hidden
from recipe.opsd.core.step_dump import read_step_dump


@torch.no_grad()
def rescore_step(dump: dict, *, student, teacher, batch_size: int = 8) -> dict[str, float]:
    """``opsd/*`` diagnostics of a dumped step under ``student`` / ``teacher`` (HF causal LMs).

    Exact token means over the step's response tokens (``recipe.opsd.actor_loss.SIGNAL_METRICS``) and the
    shares of loss positions with a positive / negative sampled-token advantage (``opsd/enc_frac``,
    ``opsd/disc_frac``), from ``token_signals_from_hidden`` over ``response_hidden_states`` in float32 (the
    trainer's FSDP forward packs the sequences: agreement is to float32 rounding, not bit-exact).
    """
    rows, loss = dump["rows"], dump["loss_config"]
    keep = [b for b, response in enumerate(rows["response_ids"]) if response]
    student_temperature = float(loss["student_temperature"])
    teacher_temperature = loss.get("teacher_temperature")
    teacher_temperature = student_temperature if teacher_temperature is None else float(teacher_temperature)
    student_weight_VH, student_bias_V = output_head(student)
    teacher_weight_VH, teacher_bias_V = output_head(teacher)
    sums = {name: 0.0 for name in SIGNAL_METRICS.values()}
    enc = disc = tokens = loss_tokens = 0
    for start in range(0, len(keep), batch_size):
        batch = keep[start:start + batch_size]
        responses = [rows["response_ids"][b] for b in batch]
        student_NH = response_hidden_states(student, [(rows["prompt_ids"][b], rows["response_ids"][b]) for b in batch])
        teacher_NH = response_hidden_states(
            teacher, [(rows["teacher_prompt_ids"][b], rows["response_ids"][b]) for b in batch]
        )
        sampled_N = torch.as_tensor([t for r in responses for t in r], dtype=torch.long)
        out = token_signals_from_hidden(
            student_NH.float(), student_weight_VH.float(), teacher_NH.float(), teacher_weight_VH.float(), sampled_N,
            student_bias=student_bias_V, teacher_bias=teacher_bias_V, student_temperature=student_temperature,
            teacher_temperature=teacher_temperature, clip_tau=loss["clip_tau"], chunk_size=int(loss["chunk_size"]),
        )
        for key, name in SIGNAL_METRICS.items():
            sums[name] += float(out[key].double().sum())
        mask_N = torch.as_tensor([bool(m) for b in batch for m in rows["loss_mask"][b]])
        adv_N = out["adv"][mask_N]
        enc += int((adv_N > 0).sum())
        disc += int((adv_N < 0).sum())
        tokens += int(sampled_N.numel())
        loss_tokens += int(mask_N.sum())
    metrics = {name: total / max(tokens, 1) for name, total in sums.items()}
    metrics["opsd/enc_frac"] = enc / max(loss_tokens, 1)
    metrics["opsd/disc_frac"] = disc / max(loss_tokens, 1)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.analysis.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", help="a step_<s>.pt of CKPT_DIR/step_dumps/")
    parser.add_argument("--student", required=True, help="HF model directory: the student before the step's update")
    parser.add_argument("--teacher", required=True, help="HF model directory: the frozen teacher (the initial model)")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from recipe.common.checkpoints import check_model_dir

    cli.require_file(args.dump)
    for directory in (args.student, args.teacher):
        check_model_dir(directory)
    with cli.reraise_as_input(ValueError, file=args.dump, hint="pass a file of CKPT_DIR/step_dumps/"):
        dump = read_step_dump(args.dump)
    models = {name: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
              for name, path in (("student", args.student), ("teacher", args.teacher))}
    print(json.dumps({"step": dump["step"], **rescore_step(dump, **models)}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
