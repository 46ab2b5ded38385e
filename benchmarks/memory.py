"""Per-GPU peak memory of the OPSD actor update at the paper's scale, and its check on the CPU.

    python scripts/bench.py memory-model table          # Qwen3-1.7B / 4B / 8B, caps 1,024-8,192, presets
    python scripts/bench.py memory-model check --model DIR --micro-batch 2 --response 512 [--no-gc]

``table``: recipe.analysis.memory_model for each Qwen3 model preset (recipe/opsd/config/model/qwen3_*.yaml: GPUs,
micro-batch per rollout cap), prompt cap 1,024 + the rollout cap tokens per sample. ``check``: the peak resident
memory of a direct, FSDP-free version of the update on the CPU (fp32 student with AdamW, fp32 frozen teacher, the
trainer's own loss + diagnostics, two micro-batch updates) in a fresh process, next to the model's prediction for
the same setting. How it is measured: docs/results/compute_cost.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from recipe.analysis.memory_model import GiB, QWEN3, ModelShape, UpdateSetting, memory_terms, preset_micro_batch
from recipe.common import cli
from recipe.launch.config import REPO_ROOT

PRESETS = {"Qwen3-1.7B": "qwen3_1p7b", "Qwen3-4B": "qwen3_4b", "Qwen3-8B": "qwen3_8b"}
CAPS = (1024, 2048, 4096, 6144, 8192)
PROMPT_CAP = 1024
COLUMNS = ("student_params", "student_grads", "optimizer", "student_gathered", "teacher_gathered",
           "teacher_hidden", "activations", "loss_workspace", "layer_recompute", "peak")


def read_preset(name: str) -> dict:
    from omegaconf import OmegaConf

    preset = OmegaConf.load(REPO_ROOT / "recipe" / "opsd" / "config" / "model" / f"{name}.yaml").model_preset
    by_cap = {int(key.removeprefix("cap_")): int(value) for key, value in preset.micro_batch_by_cap.items()}
    return {"gpus": int(preset.gpus), "micro_batch": int(preset.micro_batch), "by_cap": by_cap}


def table(args) -> None:
    print(f"GiB per GPU; tokens per sample = prompt cap {PROMPT_CAP} + rollout cap; gradient checkpointing "
          f"{'on (verl default; no OPSD preset changes it)' if args.gc else 'off'}; loss chunk {args.chunk_size}; "
          "teacher offloaded (verl's forward-only engine)")
    print()
    print("| model | GPUs | cap | micro-batch | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|---|" + "---|" * len(COLUMNS))
    for model, preset_name in PRESETS.items():
        preset = read_preset(preset_name)
        for cap in CAPS:
            micro = preset_micro_batch(by_cap=preset["by_cap"], default=preset["micro_batch"], cap=cap)
            note = "" if cap in preset["by_cap"] else " (no entry: micro_batch)"
            setting = UpdateSetting(n_gpus=preset["gpus"], micro_batch=micro, seq_tokens=PROMPT_CAP + cap,
                                    chunk_size=args.chunk_size, gradient_checkpointing=args.gc)
            terms = memory_terms(shape=QWEN3[model], setting=setting)
            print(f"| {model} | {preset['gpus']} | {cap} | {micro}{note} | "
                  + " | ".join(f"{terms[column] / GiB:.2f}" for column in COLUMNS) + " |")


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    """Peak resident set of this process since the last reset (VmHWM), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(args) -> None:
    """In this process: a warm-up, then the update twice; prints one JSON line."""
    import gc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from recipe.opsd.core.signals import weighted_divergence_and_signals

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model)

    def updates(micro_batch: int, tokens: int, times: int) -> None:
        student = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32, attn_implementation="sdpa")
        teacher = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32, attn_implementation="sdpa")
        teacher.requires_grad_(False).eval()
        student.config.use_cache = False
        student.train()
        if args.gc:
            student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-6, weight_decay=0.0)
        ids = torch.randint(0, config.vocab_size, (micro_batch, tokens))
        n_tokens = ids.numel()
        for _ in range(times):
            with torch.no_grad():
                teacher_hidden = teacher.model(input_ids=ids).last_hidden_state.reshape(n_tokens, -1)
            student_hidden = student.model(input_ids=ids).last_hidden_state.reshape(n_tokens, -1)
            loss, _, _ = weighted_divergence_and_signals(
                student_hidden, student.lm_head.weight, teacher_hidden, teacher.lm_head.weight, ids.reshape(n_tokens),
                row_weights_N=torch.full((n_tokens,), 1.0 / n_tokens), clip_tau=0.05, student_temperature=1.1,
                chunk_size=args.chunk_size)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            del teacher_hidden, student_hidden, loss

    # warm-up at 1 x 8 tokens: the kernels' code and thread pools are loaded before the baseline
    updates(1, 8, 1)
    gc.collect()
    base_rss = _rss()
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak resident set (VmHWM) to the current RSS
    updates(args.micro_batch, args.response, 2)
    peak_rss = _hwm()
    print(json.dumps({"measured": peak_rss - base_rss, "base": base_rss}))


def check(args) -> None:
    config = json.loads(cli.require_file(Path(args.model) / "config.json", what="model config").read_text())
    shape = ModelShape.from_hf_config(config, name=Path(args.model).name)
    command = [sys.executable, "-m", "benchmarks.memory", "measure", "--model", args.model, "--micro-batch", str(args.micro_batch),
               "--response", str(args.response), "--chunk-size", str(args.chunk_size)] + ([] if args.gc else ["--no-gc"])
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"the measuring process failed:\n{proc.stderr[-3000:]}")
    measured = json.loads(proc.stdout.strip().splitlines()[-1])["measured"]
    setting = UpdateSetting(n_gpus=1, micro_batch=args.micro_batch, seq_tokens=args.response,
                            chunk_size=args.chunk_size, gradient_checkpointing=args.gc, fsdp=False,
                            teacher_offload=False, compute_bytes=4, teacher_bytes=4)
    terms = memory_terms(shape=shape, setting=setting)
    print(f"{shape.name}: {shape.params:,} parameters (H {shape.hidden}, L {shape.layers}, V {shape.vocab}), "
          f"micro-batch {args.micro_batch} x {args.response} tokens, gradient checkpointing "
          f"{'on' if args.gc else 'off'}, chunk {args.chunk_size}; MiB")
    print("| " + " | ".join(("teacher_resident",) + COLUMNS) + " | measured | model / measured |")
    print("|" + "---|" * (len(COLUMNS) + 3))
    row = [terms["teacher_resident"]] + [terms[column] for column in COLUMNS]
    print("| " + " | ".join(f"{value / 2**20:.1f}" for value in row) + f" | {measured / 2**20:.1f} | "
          f"{terms['peak'] / measured:.3f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("table", "check", "measure"):
        subparser = sub.add_parser(name)
        subparser.add_argument("--chunk-size", type=int, default=1024, help="opsd.loss.chunk_size")
        subparser.add_argument("--no-gc", dest="gc", action="store_false", help="gradient checkpointing off")
        if name != "table":
            subparser.add_argument("--model", required=True, help="HF model directory (its config.json)")
            subparser.add_argument("--micro-batch", type=int, default=2)
            subparser.add_argument("--response", type=int, default=512, help="tokens per sample")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    {"table": table, "check": check, "measure": measure}[args.command](args)


if __name__ == "__main__":
    sys.exit(cli.run(main))
