"""One OPSD step of the real demo (SmolLM2, its batch and caps) through verl against its floor, in one run.

    python scripts/bench.py real-step --steps 4
    python scripts/bench.py real-step --variants hf_1thread hf_all_cores --steps 3

Floor: the same step's math in this process on all cores -- the batch's prompts sampled to the response cap (the HF
rollout's ``sample_batch``), the frozen teacher's forward on teacher prompt + response, the student's forward and
backward through the trainer's loss on final hidden states (``weighted_divergence_and_signals``), one AdamW step.
Real: the launcher's OPSD launch of the real demo's preset for ``--steps`` steps per variant (``VARIANTS``: thread
count of the Ray workers, rollout engine); verl's ``timing_s/*`` of every step after the first. Every response runs
to the cap on both sides (``rollout.ignore_eos``), so both do the same work. Prints each phase and step / floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recipe.common import cli

REPO = Path(__file__).resolve().parents[1]
# name -> launcher environment on top of the real demo's preset
CORES = str(os.cpu_count() or 1)
VARIANTS = {
    "hf_1thread": {"CPU_THREADS": "1"},
    "hf_all_cores": {"CPU_THREADS": CORES},
    "vllm_all_cores": {"CPU_ROLLOUT": "vllm", "CPU_THREADS": CORES},
}
PHASES = ("gen", "update_actor", "teacher", "update_weights", "step")


def _real_inputs(cache: Path) -> tuple[Path, Path, dict]:
    """The real demo's student, train file and preset values (built if missing)."""
    from omegaconf import OmegaConf

    from recipe.models.smollm2 import fetch_smollm2
    from recipe.toy.real_demo import build_real_student, task_dir, write_real_data

    student = build_real_student(fetch_smollm2(cache_dir=cache), cache=cache)
    data = task_dir(cache)
    write_real_data(data)
    preset = OmegaConf.to_container(OmegaConf.load(REPO / "recipe" / "opsd" / "config" / "demo" / "real.yaml"))
    return student, data / "train.parquet", preset


def floor(student: Path, train_file: Path, preset: dict, *, steps: int, log=print) -> dict[str, float]:
    """Median seconds per phase of ``steps`` OPSD steps in this process (after one warm-up step)."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.common.chat import render_ids
    from recipe.common.prompts import build_prompt_pair
    from recipe.cpu.hf_generate import SampleParams, sample_batch
    from recipe.opsd.core.signals import weighted_divergence_and_signals

    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = AutoTokenizer.from_pretrained(student)
    model = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(preset["actor_rollout_ref"]["actor"]["optim"]["lr"]),
                                  weight_decay=0.0)
    batch, cap = int(preset["data"]["train_batch_size"]), int(preset["data"]["max_response_length"])
    rows = pd.read_parquet(train_file).head(batch)
    pairs = [build_prompt_pair("full_solution", dict(info)) for info in rows["extra_info"]]
    student_ids = [render_ids(messages, tokenizer, "native") for messages, _ in pairs]
    teacher_ids = [render_ids(messages, tokenizer, "native") for _, messages in pairs]
    params = SampleParams(max_new_tokens=cap, temperature=1.1, top_p=0.95, top_k=20, ignore_eos=True)
    weight_VH = model.get_output_embeddings().weight

    def final_hidden(net, prompts, responses):
        """[B, R, H] final hidden states predicting each response token (right-padded full sequences)."""
        sequences = [p + r for p, r in zip(prompts, responses)]
        width = max(map(len, sequences))
        ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in sequences])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
        hidden = net.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return torch.stack([hidden[b, len(p) - 1:len(p) - 1 + len(r)] for b, (p, r) in enumerate(zip(prompts, responses))])

    times: dict[str, list[float]] = {name: [] for name in ("gen", "teacher", "student", "optimizer", "step")}
    for step in range(steps + 1):
        marks = [time.perf_counter()]
        sampled = sample_batch(model, student_ids, params=params, eos_token_ids=[tokenizer.eos_token_id],
                               pad_token_id=tokenizer.pad_token_id, seed=step)
        responses = sampled.response_ids
        marks.append(time.perf_counter())
        with torch.no_grad():
            teacher_BRH = final_hidden(teacher, teacher_ids, responses)
        marks.append(time.perf_counter())
        student_BRH = final_hidden(model, student_ids, responses)
        n = student_BRH.shape[0] * student_BRH.shape[1]
        loss, _, _ = weighted_divergence_and_signals(
            student_BRH.reshape(n, -1), weight_VH, teacher_BRH.reshape(n, -1), teacher.get_output_embeddings().weight,
            torch.tensor([r for resp in responses for r in resp]), row_weights_N=torch.full((n,), 1.0 / n),
            beta=0.0, clip_tau=0.05, student_temperature=1.1, teacher_temperature=1.1, chunk_size=1024)
        loss.backward()
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        optimizer.zero_grad()
        marks.append(time.perf_counter())
        if step:  # the first step warms up
            for name, (a, b) in zip(("gen", "teacher", "student", "optimizer"), zip(marks, marks[1:])):
                times[name].append(b - a)
            times["step"].append(marks[-1] - marks[0])
        log(f"[real-step] floor step {step}: {marks[-1] - marks[0]:.1f} s")
    return {name: statistics.median(values) for name, values in times.items()}


def preset_overrides(preset: dict) -> list[str]:
    """The real demo's preset as ``key=value`` overrides (a launch with MODEL_PATH / TRAIN_FILES gets the tiny demo's
    preset underneath; these replace its values). The bench's steps (STEPS) and the recipe's interpolations stay."""
    from recipe.launch.resume import flatten

    return [f"{key}={'null' if value is None else value}" for key, value in flatten(preset).items()
            if key != "trainer.total_training_steps" and not (isinstance(value, str) and value.startswith("${"))]


def launch(variant: str, *, student: Path, train_file: Path, preset: dict, steps: int, out: Path,
           log=print) -> dict[str, float]:
    """Median verl ``timing_s/<phase>`` over steps 2.. of one launch of the real demo's preset."""
    ckpt = out / variant
    env = {**os.environ, "DEVICE": "cpu", "MODEL_PATH": str(student), "TRAIN_FILES": str(train_file),
           "CKPT_DIR": str(ckpt), "STEPS": str(steps), **VARIANTS[variant]}
    if env.get("CPU_ROLLOUT") != "vllm":  # the launcher refuses VLLM_VENV without the vLLM rollout
        env.pop("VLLM_VENV", None)
    command = ["bash", "recipe/opsd/run_opsd.sh", *preset_overrides(preset), "trainer.save_freq=-1",
               "opsd.diagnostics.preflight=false", "actor_rollout_ref.rollout.ignore_eos=true"]
    start = time.time()
    with open(out / f"{variant}.log", "w") as handle:
        code = subprocess.run(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"the {variant} launch failed (exit {code}): {out / f'{variant}.log'}")
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    data = [row.get("data", row) for row in rows if row.get("step", 0) >= 2]
    result = {phase: statistics.median(d[f"timing_s/{phase}"] for d in data if f"timing_s/{phase}" in d)
              for phase in PHASES if any(f"timing_s/{phase}" in d for d in data)}
    log(f"[real-step] {variant}: {steps} steps in {time.time() - start:.0f} s, {result}")
    return result


def table(floor_s: dict[str, float], launches: dict[str, dict[str, float]]) -> str:
    lines = ["| run | generation (s) | teacher (s) | student fwd+bwd+step (s) | weight push (s) | step (s) | step / floor |",
             "|---|---|---|---|---|---|---|"]
    lines.append(f"| floor: one PyTorch process | {floor_s['gen']:.1f} | {floor_s['teacher']:.1f} "
                 f"| {floor_s['student'] + floor_s['optimizer']:.1f} | - | {floor_s['step']:.1f} | 1.00 |")
    for name, t in launches.items():
        update = t.get("update_actor", float("nan")) - t.get("teacher", 0.0)
        lines.append(f"| {name} | {t.get('gen', float('nan')):.1f} | {t.get('teacher', float('nan')):.1f} | {update:.1f} "
                     f"| {t.get('update_weights', float('nan')):.1f} | {t['step']:.1f} | {t['step'] / floor_s['step']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per launch and of the floor (the first is warm-up)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", default=None, help="launch directories and logs (default: a temporary directory)")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise cli.InputError("at least 2 (the first step is warm-up)", file=f"--steps {args.steps}")
    from recipe.common.cache import cache_root

    cache = Path(cache_root()).expanduser()
    out = Path(args.out or tempfile.mkdtemp(prefix="real_step_"))
    out.mkdir(parents=True, exist_ok=True)
    student, train_file, preset = _real_inputs(cache)
    floor_s = floor(student, train_file, preset, steps=args.steps)
    launches = {name: launch(name, student=student, train_file=train_file, preset=preset, steps=args.steps, out=out)
                for name in args.variants}
    print(f"\nreal demo batch: {preset['data']['train_batch_size']} prompts x {preset['data']['max_response_length']} "
          f"response tokens (every response to the cap), medians of steps 2-{args.steps}; {os.cpu_count()} cores\n")
    print(table(floor_s, launches))
    return 0
