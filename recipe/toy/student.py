"""The toy student: a small Qwen3 model SFT-trained on the toy task by the project's own SFT stage.

``build_student(config)`` (the ``toy`` demo, ``recipe.toy.demo``) is deterministic given ``config`` and
cached under ``${OPSD_CACHE:-~/.cache/opsd-verl}/toy/<config hash>/`` (the layout: its docstring);
``evaluate_model`` scores a model on toy problems; the student answers in no-think mode
(``recipe.toy.data.sft_rows``); docs/toy_world.md. Build or reuse it, print its held-out accuracy without
and with the reference solution, then the cache directory (``--no-eval``: build and print that only)::

    python -m recipe.toy.student                 # or e.g. --no-eval, --sft-steps 50 --num-layers 2
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from recipe.common.prompts import BOXED_INSTRUCTION, teacher_messages
from recipe.toy.data import (DEFAULT_SFT_MIX, check_mix, conversation_length, heldout_jsonl_rows, prompt_phrases, rl_rows,
                             sft_rows)
from recipe.toy.task import TaskConfig, make_records

# Bump when the build procedure changes in a way the config does not capture.
BUILD_VERSION = 1
STUDENT_MODE = "no_think"


@dataclass(frozen=True)
class StudentConfig:
    """Everything that determines the toy student (its hash names the cache directory).

    task: the toy task (difficulty, split sizes, seed).
    num_layers / hidden_size / num_heads / num_kv_heads / intermediate_size: Qwen3 architecture.
    model_seed: seed of the random initialisation.
    sft_steps / sft_batch_size / sft_lr: verl SFT run (cosine schedule, 10% warmup: the SFT yaml).
    sft_mix: shares of the SFT user-turn kinds (``recipe.toy.data.SFT_KINDS``).
    sft_seed: seed of the SFT mix draw.
    phrase_tokens: the tokenizer holds each fixed prompt text (``recipe.toy.data.prompt_phrases``)
        as one token; prompts shrink from 200-720 character tokens to ~20-60 positions, which is
        what makes the verl SFT stage affordable on a CPU. Field values stay single characters.
    """

    task: TaskConfig = field(default_factory=lambda: TaskConfig(num_operands=2, digits=2, n_train=3000, n_heldout=256))
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    model_seed: int = 0
    sft_steps: int = 600
    sft_batch_size: int = 32
    sft_lr: float = 2e-3
    sft_mix: tuple[tuple[str, float], ...] = tuple(DEFAULT_SFT_MIX.items())
    sft_seed: int = 0
    phrase_tokens: bool = True

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size",
                     "sft_steps", "sft_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StudentConfig.{name} must be a positive integer, got {value!r}")
        if not self.sft_lr > 0:
            raise ValueError(f"StudentConfig.sft_lr must be > 0, got {self.sft_lr!r}")
        check_mix(dict(self.sft_mix))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "task": self.task.key(), "sft_mix": dict(self.sft_mix),
                "build_version": BUILD_VERSION}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def student_dir(config: StudentConfig, *, cache: str | os.PathLike) -> Path:
    """``<cache>/toy/<config hash>``: where ``build_student`` puts everything of ``config``."""
    return Path(cache).expanduser() / "toy" / config.digest()


def context_benchmark_rows(records, *, context: str = "full_solution") -> list[dict[str, str]]:
    """Held-out rows whose evaluation prompt is exactly the teacher prompt of ``context``.

    ``eval_messages(x)`` is ``x + "\\n\\n" + BOXED_INSTRUCTION`` and the full-solution teacher
    message ends with the same paragraph, so ``x`` = the teacher message without it.
    """
    rows = []
    for record in records:
        content = teacher_messages(context, **{k: record[k] for k in (
            "problem", "solution", "answer", "cot", "unrelated_problem", "unrelated_solution")})[0]["content"]
        suffix = "\n\n" + BOXED_INSTRUCTION
        if not content.endswith(suffix):
            raise ValueError(f"teacher context {context!r} does not end with the boxed instruction; "
                             "its prompt cannot be reproduced by the evaluation prompt")
        rows.append({"id": record["id"], "problem": content[: -len(suffix)], "answer": record["answer"]})
    return rows


def _write_jsonl(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_data(config: StudentConfig, data_dir: Path) -> dict[str, Path]:
    """Write the toy data files (idempotent: same config, same bytes); return their paths."""
    import pandas as pd

    data_dir.mkdir(parents=True, exist_ok=True)
    records = make_records(config.task)
    paths = {
        "train": data_dir / "train.parquet",
        "heldout_parquet": data_dir / "heldout.parquet",
        "sft": data_dir / "sft.parquet",
        "heldout": data_dir / "heldout.jsonl",
        "heldout_full_solution": data_dir / "heldout_full_solution.jsonl",
    }
    pd.DataFrame(rl_rows(records["train"])).to_parquet(paths["train"])
    pd.DataFrame(rl_rows(records["heldout"])).to_parquet(paths["heldout_parquet"])
    pd.DataFrame(sft_rows(records["train"], mix=dict(config.sft_mix), seed=config.sft_seed)).to_parquet(paths["sft"])
    _write_jsonl(paths["heldout"], heldout_jsonl_rows(records["heldout"]))
    _write_jsonl(paths["heldout_full_solution"], context_benchmark_rows(records["heldout"]))
    return paths


def cpu_sft_overrides(*, batch_size: int, max_length: int, lr: float, steps: int, seed: int,
                      experiment_name: str) -> list[str]:
    """verl SFT overrides of a short SFT run on the CPU (on top of sft_trainer.yaml and the CPU platform, which
    computes in fp32):
    batches of ``batch_size`` rows of at most ``max_length`` tokens, ``steps`` steps, one checkpoint at the end."""
    return [
        f"data.train_batch_size={batch_size}",
        f"data.micro_batch_size_per_gpu={batch_size}",
        f"data.max_length={max_length}",
        f"data.max_token_len_per_gpu={max_length * batch_size}",
        f"optim.lr={lr}",
        "model.enable_gradient_checkpointing=False",
        f"trainer.total_training_steps={steps}",
        # The step count stops the run (verl's default of 4 epochs would cut small data sets short).
        "trainer.total_epochs=100000",
        f"trainer.save_freq={steps}",
        f"trainer.experiment_name={experiment_name}",
        f"trainer.seed={seed}",
        f"engine.seed={seed}",
    ]


# Token cap of the toy student's SFT rows (data.max_length); build_student checks every row against it.
SFT_MAX_LENGTH = 1024


def sft_overrides(config: StudentConfig) -> list[str]:
    """verl SFT overrides of the toy student's SFT run (rows of at most ``SFT_MAX_LENGTH`` tokens)."""
    return cpu_sft_overrides(batch_size=config.sft_batch_size, max_length=SFT_MAX_LENGTH, lr=config.sft_lr,
                             steps=config.sft_steps, seed=config.model_seed, experiment_name="toy_student_sft")


def sft_and_merge(*, init: Path, sft_file: Path, root: Path, overrides: list[str], label: str, steps: int,
                  cache: str | os.PathLike) -> dict[str, float]:
    """SFT ``init`` on ``sft_file`` through the launcher (the ``sft`` recipe on the CPU, verl's output in
    ``root/sft.log``, condensed progress on the console), then merge the last checkpoint into ``root/student``.

    ``overrides``: verl SFT overrides (on top of sft_trainer.yaml and the CPU platform); ``steps`` must be
    their ``trainer.total_training_steps``. An interrupted run (``root/sft`` without ``root/student``) is
    started again. Returns the wall times ``{"sft_s", "merge_s"}``.
    """
    from recipe.common.merge import merge_checkpoint
    from recipe.launch.config import Settings, get_recipe
    from recipe.launch.run import StepProgress, execute, plan

    sft_dir = root / "sft"
    if sft_dir.exists():
        shutil.rmtree(sft_dir)
    start = time.time()
    settings = Settings(device="cpu", model_path=str(init), train_files=str(sft_file), ckpt_dir=str(sft_dir),
                        cache_dir=str(cache))
    record = execute(plan(get_recipe("sft"), settings, overrides), log=root / "sft.log",
                     on_line=StepProgress(label, {"train/loss": "loss"}, total=steps, every_s=15))
    if record["exit_code"] != 0:
        raise RuntimeError(f"{label} failed (exit {record['exit_code']}); log {root / 'sft.log'}:\n"
                           + (root / "sft.log").read_text()[-3000:])
    times = {"sft_s": round(time.time() - start, 1)}
    start = time.time()
    merge_checkpoint(sft_dir, root / "student.partial", log=root / "merge.log")
    (root / "student.partial").rename(root / "student")
    times["merge_s"] = round(time.time() - start, 1)
    return times


def check_sft_rows(sft_file: Path, tokenizer_dir: Path, *, max_length: int = SFT_MAX_LENGTH) -> int:
    """The longest SFT conversation of ``sft_file`` in tokens of ``tokenizer_dir`` (as verl's SFT dataset
    renders it, thinking mode: the SFT yaml's default); ValueError if it exceeds ``max_length``."""
    import pandas as pd
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    longest = max(conversation_length(m, tokenizer, enable_thinking=True) for m in pd.read_parquet(sft_file)["messages"])
    if longest > max_length:
        raise ValueError(f"{sft_file} has a row of {longest} tokens > the toy student's SFT cap data.max_length="
                         f"{max_length} (recipe.toy.student.SFT_MAX_LENGTH): raise it to >= {longest}")
    return longest


def build_student(config: StudentConfig = StudentConfig(), *, cache: str | os.PathLike, log=print) -> Path:
    """Build (or reuse) the toy student under ``cache``; return its directory, ``student_dir(config)``::

        data/train.parquet, data/heldout.parquet   verl RL rows (``recipe.toy.data.rl_rows``)
        data/sft.parquet                           the SFT mix (``recipe.toy.data.sft_rows``)
        data/heldout.jsonl                         held-out benchmark ``{id, problem, answer}``
        data/heldout_full_solution.jsonl           the same problems with the reference solution in
                                                   the prompt (``context_benchmark_rows``)
        init/        random Qwen3 + character tokenizer (``recipe.models.tiny.build_tiny_model``),
                     the fixed prompt texts as single tokens (``recipe.toy.data.prompt_phrases``)
        sft/         verl SFT checkpoints (the launcher's ``sft`` recipe on the CPU) + run_times.jsonl
        student/     the merged HF student (``recipe.common.merge``)
        student_eval/<none|full_solution>/<greedy|sampled_nN>/   ``recipe.evaluation.harness`` outputs
        runs/        OPSD / GRPO runs of the toy demo (``recipe.toy.demo``; one directory per launch)
        BUILD.json   the config, its hash and the build's wall times (written last: a build
                     without it is incomplete and is redone from the first missing piece)

    The SFT runs through the launcher (``sft_and_merge``), then the last checkpoint is merged.
    """
    from recipe.models.tiny import build_tiny_model

    root = student_dir(config, cache=cache)
    if (root / "BUILD.json").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    times = {}
    start = time.time()
    write_data(config, root / "data")
    if not (root / "init" / "config.json").is_file():
        build_tiny_model(root / "init", seed=config.model_seed, num_layers=config.num_layers,
                         hidden_size=config.hidden_size, num_heads=config.num_heads,
                         num_kv_heads=config.num_kv_heads, intermediate_size=config.intermediate_size,
                         phrases=prompt_phrases() if config.phrase_tokens else (), overwrite=True)
    times["data_and_init_s"] = round(time.time() - start, 1)
    check_sft_rows(root / "data" / "sft.parquet", root / "init")
    if not (root / "student" / "config.json").is_file():
        log(f"[toy student] building the toy student once (cached in {root}): SFT {config.sft_steps} steps x "
            f"{config.sft_batch_size} rows with verl's SFT trainer on the CPU (~3 min on 2 cores); log {root / 'sft.log'}")
        times.update(sft_and_merge(init=root / "init", sft_file=root / "data" / "sft.parquet", root=root,
                                   overrides=sft_overrides(config), label="toy student SFT", steps=config.sft_steps,
                                   cache=cache))
    (root / "BUILD.json").write_text(json.dumps({"config": config.to_dict(), "hash": config.digest(),
                                                 "times": times}, indent=2) + "\n")
    log(f"[toy student] built in {root} ({times})")
    return root


def decoding(*, greedy: bool, max_new_tokens: int = 48):
    """The toy evaluation decoding: no-think mode; greedy = top_k 1 (the evaluation presets require a
    temperature > 0), else T 1.0 top-p 1."""
    from recipe.evaluation.decoding_presets import get_preset

    preset = get_preset("tiny_cpu").with_overrides(mode=STUDENT_MODE, max_new_tokens=max_new_tokens, top_p=1.0,
                                                   temperature=1.0, top_k=1 if greedy else None)
    return dataclasses.replace(preset, name="toy_greedy" if greedy else "toy_sampled")


def batched_backend(model_path: str | os.PathLike, *, preset, seed: int):
    """``recipe.evaluation.backends.HFBackend`` that samples all prompts of a call in one batch.

    The toy prompts are short and the model tiny, so one left-padded ``sample_batch`` over every
    (prompt, sample) of a call replaces one call per prompt (~40x faster here). Seeded by the
    call's first request key: deterministic for a fixed ``problems_per_call``.
    """
    from recipe.evaluation.backends import Generation, HFBackend, request_seed
    from recipe.cpu.hf_generate import SampleParams, sample_batch

    class BatchedHFBackend(HFBackend):
        def generate(self, requests):
            prompts = [request.prompt_ids for request in requests for _ in range(request.count)]
            params = SampleParams(
                max_new_tokens=min(self.preset.effective_max_new_tokens(len(p)) for p in prompts),
                temperature=self.preset.temperature, top_p=self.preset.top_p,
                top_k=-1 if self.preset.top_k is None else self.preset.top_k,
            )
            batch = sample_batch(self.model, prompts, params=params, eos_token_ids=self.eos_token_ids,
                                 pad_token_id=self.pad_token_id, seed=request_seed(self.seed, requests[0].key))
            generations = [Generation(text=self.tokenizer.decode(ids, skip_special_tokens=True), num_tokens=len(ids),
                                      finish_reason=reason)
                           for ids, reason in zip(batch.response_ids, batch.finish_reasons, strict=True)]
            out, start = [], 0
            for request in requests:
                out.append(generations[start : start + request.count])
                start += request.count
            return out

    return BatchedHFBackend(str(model_path), preset=preset, seed=seed)


def evaluate_model(model: str | os.PathLike, benchmark: str | os.PathLike, out_dir: str | os.PathLike, *,
                   greedy: bool, n: int = 1, limit: int | None = None, seed: int = 42, progress: bool = True) -> dict:
    """``recipe.evaluation.harness.evaluate`` of ``model`` on a toy JSONL; returns its macro metrics."""
    from recipe.evaluation.harness import EvalConfig, evaluate

    config = EvalConfig(model=str(model), out_dir=str(out_dir), preset=decoding(greedy=greedy),
                        benchmarks=[str(benchmark)], n=1 if greedy else n, seed=seed, backend="hf",
                        limit=limit, problems_per_call=64 if greedy else max(1, 128 // n))
    results = evaluate(config, backend=batched_backend(model, preset=config.preset, seed=seed), progress=progress)
    return results["macro"]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from recipe.common import cli
    from recipe.launch.config import Settings

    defaults = StudentConfig()
    parser = argparse.ArgumentParser(description="Build (or reuse) the toy student and print its held-out accuracy "
                                                 "without and with the reference solution.")
    for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "model_seed",
                 "sft_steps", "sft_batch_size", "sft_seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    parser.add_argument("--sft-lr", type=float, default=defaults.sft_lr)
    for name in ("num_operands", "digits", "n_train", "n_heldout", "seed"):
        parser.add_argument("--task-" + name.replace("_", "-"), type=int, default=getattr(defaults.task, name))
    parser.add_argument("--no-eval", action="store_true", help="build only")
    parser.add_argument("--eval-n", type=int, default=4, help="samples per problem of the sampled evaluation")
    parser.add_argument("--eval-limit", type=int, default=None, help="first N held-out problems only")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    with cli.reraise_as_input(ValueError):  # the options' validation (TaskConfig / StudentConfig / tiny config)
        task = TaskConfig(**{name: getattr(args, "task_" + name) for name in
                             ("num_operands", "digits", "n_train", "n_heldout", "seed")})
        config = StudentConfig(task=task, sft_mix=defaults.sft_mix, sft_lr=args.sft_lr, **{
            name: getattr(args, name) for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                                   "intermediate_size", "model_seed", "sft_steps", "sft_batch_size",
                                                   "sft_seed")})
    root = build_student(config, cache=Settings.from_environ(os.environ).cache_dir)
    if not args.no_eval:
        rows = []
        for context in ("none", "full_solution"):
            benchmark = root / "data" / ("heldout.jsonl" if context == "none" else "heldout_full_solution.jsonl")
            out = root / "student_eval" / context
            greedy = evaluate_model(root / "student", benchmark, out / "greedy", greedy=True, limit=args.eval_limit)
            sampled = evaluate_model(root / "student", benchmark, out / f"sampled_n{args.eval_n}", greedy=False,
                                     n=args.eval_n, limit=args.eval_limit)
            rows.append({"context": context, "greedy_acc": greedy["avg@1"],
                         f"avg@{args.eval_n}": sampled[f"avg@{args.eval_n}"],
                         f"pass@{args.eval_n}": sampled[f"pass@{args.eval_n}"],
                         "mean_length": sampled["mean_length"], "n_problems": greedy["n_problems"]})
        print(f"| context in prompt | greedy acc (%) | Avg@{args.eval_n} (%) | Pass@{args.eval_n} (%) | mean length |")
        print("|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['context']} | {100 * row['greedy_acc']:.1f} | {100 * row[f'avg@{args.eval_n}']:.1f} "
                  f"| {100 * row[f'pass@{args.eval_n}']:.1f} | {row['mean_length']:.1f} |")
        print(json.dumps(json.loads((root / "BUILD.json").read_text())["times"]))
    print(root)
    return 0


if __name__ == "__main__":
    import sys

    from recipe.common import cli

    sys.exit(cli.run(main))
