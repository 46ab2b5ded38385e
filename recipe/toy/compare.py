"""OPSD and GRPO on the toy student: train through the project's run scripts, evaluate before/after.

``run_method("opsd" | "grpo", ...)`` launches ``recipe/opsd/run_opsd.sh`` / ``recipe/grpo_baseline/run_grpo.sh``
on the CPU with ``MODEL_PATH`` = the toy student (``recipe.toy.student``), the toy RL parquet, a fresh
checkpoint directory and the toy preset below; merges the last checkpoint
(``scripts/merge_checkpoint.sh``) and evaluates it on the held-out problems with
``recipe.common.evaluation`` (greedy accuracy, sampled Avg@n / Pass@n, mean length). Both
methods see the same parquet, ``data.seed`` and batch size, so the same problems in the same
order. Compute: the launch's wall time and verl's per-step ``timing_s/step`` (metrics jsonl).

Toy preset (where it departs from the paper's values, and why; docs/toy_world.md):
- OPSD: no per-entry clip (``opsd.loss.clip_tau=null``; at toy scale the teacher's signal sits
  on a few digit tokens with per-token divergence 1-5 and a 0.05 cap removes it), rollout and
  loss temperature 1.0 (1.1 gives few correct samples), 64 prompts per step and lr 1e-3 for
  150 steps (batch 16 leaves the gain within noise; lr 3e-3 collapses; at 100 steps the seeds
  are still mid-transition, sd 15.8 points, at 150 they have saturated, sd 2.8), no-think modes for
  both sides (the toy student is SFT-trained to answer without reasoning).
- GRPO: 4 samples per prompt, lr 5e-5 (3e-4 collapses the toy student), no-think mode; the
  paper's other GRPO values are kept.

Statistics: each accuracy change gets a 95% paired bootstrap interval over the held-out
problems (``recipe.evaluation.stats``: the same problems resampled for both sides), after vs
before for each method and OPSD vs GRPO after training.

CLI: ``bash recipe/toy/run_toy.sh opsd`` (one method) and ``python scripts/compare_opsd_grpo.py``
(both, one table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from recipe.analysis.run_logs import parse_console_line
from recipe.evaluation import stats
from recipe.toy.student import REPO_ROOT, StudentConfig, build_student, evaluate_model

METHODS = ("opsd", "grpo")
SCRIPTS = {"opsd": "recipe/opsd/run_opsd.sh", "grpo": "recipe/grpo_baseline/run_grpo.sh"}
# Per-step metrics printed as progress (those present in the method's log) and their short names.
PROGRESS_KEYS = {"opsd/loss": "loss", "opsd/fwd_kl": "fwd_kl", "opsd/rollout_score": "score",
                 "critic/score/mean": "score", "response_length/mean": "length", "timing_s/step": "s/step"}


@dataclass(frozen=True)
class ToyRunConfig:
    """One toy training run (both methods share every field but the learning rates).

    steps: optimizer steps; batch_size: prompts per step; data_seed: verl's ``data.seed``.
    opsd_lr / grpo_lr: actor learning rates; grpo_n: GRPO samples per prompt.
    eval_n: samples per problem of the sampled evaluation; eval_limit: first problems only.
    max_response_length: rollout cap (a toy solution is ~20 tokens).
    """

    steps: int = 150
    batch_size: int = 64
    data_seed: int = 42
    opsd_lr: float = 1e-3
    grpo_lr: float = 5e-5
    grpo_n: int = 4
    eval_n: int = 4
    eval_limit: int | None = None
    max_response_length: int = 48
    student: StudentConfig = field(default_factory=StudentConfig)

    def __post_init__(self):
        for name in ("steps", "batch_size", "grpo_n", "eval_n", "max_response_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ToyRunConfig.{name} must be a positive integer, got {value!r}")


def common_overrides(config: ToyRunConfig) -> list[str]:
    return [
        f"data.train_batch_size={config.batch_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={config.batch_size}",
        f"data.seed={config.data_seed}",
        "data.max_prompt_length=256",
        f"data.max_response_length={config.max_response_length}",
        f"trainer.total_training_steps={config.steps}",
        f"trainer.save_freq={config.steps}",
        "trainer.resume_mode=disable",
    ]


def method_launch(method: str, *, root: Path, run_dir: Path, config: ToyRunConfig) -> tuple[list[str], dict, Path]:
    """(command, environment, metrics jsonl path) of one training launch."""
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {list(METHODS)}")
    metrics = run_dir / "metrics.jsonl"
    env = {**os.environ, "MODEL_PATH": str(root / "student"), "TRAIN_FILES": str(root / "data" / "train.parquet"),
           "VAL_FILES": str(root / "data" / "heldout.parquet"), "CKPT_DIR": str(run_dir / "ckpt"),
           "VERL_FILE_LOGGER_PATH": str(metrics), "PYTHON": os.environ.get("PYTHON", sys.executable)}
    overrides = common_overrides(config)
    micro = min(8, config.batch_size)
    if method == "opsd":
        env.update(OPSD_DEVICE="cpu", EXPERIMENT_NAME="toy_opsd")
        overrides += [
            "trainer.logger=[console,file]",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.actor.optim.lr={config.opsd_lr}",
            "actor_rollout_ref.rollout.temperature=1.0",
            "opsd.teacher_context=full_solution",
            "opsd.student_mode=no_think",
            "opsd.teacher_mode=no_think",
            "opsd.loss.clip_tau=null",
            "opsd.loss.student_temperature=1.0",
        ]
    else:
        env.update(DEVICE="cpu", STEPS=str(config.steps))
        overrides += [
            f"actor_rollout_ref.rollout.n={config.grpo_n}",
            f"actor_rollout_ref.actor.optim.lr={config.grpo_lr}",
            "+data.apply_chat_template_kwargs.enable_thinking=False",
            "trainer.experiment_name=toy_grpo",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        ]
    return ["bash", SCRIPTS[method], *overrides], env, metrics


def read_step_metrics(path: Path) -> list[dict]:
    """Per-step ``data`` dicts of a verl file-logger jsonl, in step order."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["data"] for row in sorted(rows, key=lambda row: row["step"])]


def _progress(line: str, method: str) -> str | None:
    values = parse_console_line(line)
    if values is None:
        return None
    shown = [f"{name}={values[key]:.3g}" for key, name in PROGRESS_KEYS.items() if key in values]
    return f"[toy {method}] step {values['step']}: " + " ".join(shown)


def train(method: str, *, root: Path, run_dir: Path, config: ToyRunConfig, extra: list[str],
          timeout_s: float) -> dict:
    """Launch one training run, stream progress, return wall time and per-step timings."""
    command, env, metrics_path = method_launch(method, root=root, run_dir=run_dir, config=config)
    command += extra
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "train.log"
    print(f"[toy {method}] {' '.join(command[:2])} ... (log {log_path})", flush=True)
    start = time.time()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            for line in process.stdout:
                log.write(line)
                shown = _progress(line, method)
                if shown:
                    print(shown, flush=True)
                if time.time() - start > timeout_s:
                    process.kill()
                    raise TimeoutError(f"{method} run exceeded {timeout_s} s; log {log_path}")
            code = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
    wall = time.time() - start
    if code != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{method} run failed (exit {code}); log {log_path}:\n{tail}")
    steps = read_step_metrics(metrics_path)
    step_times = [row["timing_s/step"] for row in steps if "timing_s/step" in row]
    return {"wall_time_s": wall, "steps": len(steps), "step_times_s": step_times, "metrics": steps}


def merge_last(run_dir: Path) -> Path:
    target = run_dir / "merged"
    if not (target / "config.json").is_file():
        env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
        subprocess.run(["bash", "scripts/merge_checkpoint.sh", str(run_dir / "ckpt"), str(target)], cwd=REPO_ROOT,
                       env=env, check=True, stdout=subprocess.DEVNULL)
    return target


def evaluate_all(model: Path, root: Path, out_dir: Path, config: ToyRunConfig) -> dict:
    """Greedy accuracy and sampled Avg@n / Pass@n / mean length on the held-out problems (no context)."""
    benchmark = root / "data" / "heldout.jsonl"
    greedy = evaluate_model(model, benchmark, out_dir / "greedy", greedy=True, limit=config.eval_limit)
    sampled = evaluate_model(model, benchmark, out_dir / f"sampled_n{config.eval_n}", greedy=False,
                             n=config.eval_n, limit=config.eval_limit)
    n = config.eval_n
    per_problem = {"greedy": problem_scores(out_dir / "greedy"), f"avg@{n}": problem_scores(out_dir / f"sampled_n{n}")}
    return {"greedy": greedy["avg@1"], f"avg@{n}": sampled[f"avg@{n}"], f"pass@{n}": sampled[f"pass@{n}"],
            "mean_length": sampled["mean_length"], "n_problems": sampled["n_problems"], "per_problem": per_problem}


def problem_scores(eval_dir: Path) -> dict[str, float]:
    """``{problem_id: Avg@n}`` of one evaluation directory (its results.json ``per_problem``)."""
    results = json.loads((eval_dir / "results.json").read_text())
    return {pid: score for scores in results["per_problem"].values() for pid, score in scores.items()}


def change_interval(before: dict, afters: list[dict], metric: str) -> stats.Interval | None:
    """Paired bootstrap interval of ``metric`` after - before over the held-out problems.

    ``afters`` holds one evaluation per training seed (rows of the bootstrap); None when an
    evaluation lacks per-problem scores (a summary written before they were kept).
    """
    if "per_problem" not in before or any("per_problem" not in after for after in afters):
        return None
    ids = list(before["per_problem"][metric])
    return stats.paired_bootstrap(base_SP=[before["per_problem"][metric][pid] for pid in ids],
                                  ckpt_SP=[[after["per_problem"][metric][pid] for pid in ids] for after in afters])


def headline(metrics: dict) -> dict:
    """The metrics without the per-problem scores (for progress lines)."""
    return {key: value for key, value in metrics.items() if key != "per_problem"}


def run_method(method: str, *, config: ToyRunConfig, root: Path, run_dir: Path, extra: list[str] = (),
               timeout_s: float = 3600) -> dict:
    """Train, merge, evaluate after; ``{"train": ..., "after": ...}``."""
    trained = train(method, root=root, run_dir=run_dir, config=config, extra=list(extra), timeout_s=timeout_s)
    after = evaluate_all(merge_last(run_dir), root, run_dir / "eval", config)
    return {"train": trained, "after": after}


def _mean(values) -> float:
    return sum(values) / len(values) if values else float("nan")


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _ci(interval: stats.Interval | None) -> str:
    return "-" if interval is None else interval.points()


def table(before: dict, results: dict[str, dict], config: ToyRunConfig) -> str:
    """Markdown table: accuracy before/after, length, wall time, time per step, compute ratio."""
    n = config.eval_n
    lines = [
        f"| method | greedy acc before -> after (%) | Avg@{n} before -> after (%) | Avg@{n} change 95% CI (pts) "
        f"| Pass@{n} before -> after (%) "
        f"| mean length before -> after | steps | wall time (s) | time/step (s) | time/step after step 1 (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, result in results.items():
        after, trained = result["after"], result["train"]
        times = trained["step_times_s"]
        per_step = _mean(times)
        steady = _mean(times[1:])
        lines.append(
            f"| {method} | {_pct(before['greedy'])} -> {_pct(after['greedy'])} "
            f"| {_pct(before[f'avg@{n}'])} -> {_pct(after[f'avg@{n}'])} | {_ci(change_interval(before, [after], f'avg@{n}'))} "
            f"| {_pct(before[f'pass@{n}'])} -> {_pct(after[f'pass@{n}'])} "
            f"| {before['mean_length']:.1f} -> {after['mean_length']:.1f} | {trained['steps']} "
            f"| {trained['wall_time_s']:.0f} | {per_step:.2f} | {steady:.2f} |"
        )
    if set(results) == set(METHODS):
        opsd, grpo = results["opsd"]["train"], results["grpo"]["train"]
        lines.append("")
        lines.append(f"OPSD/GRPO compute ratio (1 CPU device each): time per step "
                     f"{_mean(opsd['step_times_s']) / _mean(grpo['step_times_s']):.2f} "
                     f"({_mean(opsd['step_times_s'][1:]) / _mean(grpo['step_times_s'][1:]):.2f} after step 1), "
                     f"launch wall time {opsd['wall_time_s'] / grpo['wall_time_s']:.2f}")
        opsd_after, grpo_after = results["opsd"]["after"], results["grpo"]["after"]
        for metric, title in (("greedy", "greedy acc"), (f"avg@{n}", f"Avg@{n}")):
            interval = change_interval(grpo_after, [opsd_after], metric)
            if interval is not None:
                lines.append(f"OPSD - GRPO after training, {title}: {100 * interval.estimate:+.1f} pts, "
                             f"95% CI {interval.points()} (paired by problem)")
    lines.append(f"(held-out problems: {before['n_problems']}; greedy = top-k 1; Avg@{n}/Pass@{n}: T 1.0, "
                 f"no-think mode, recipe.common.evaluation; 95% CI: paired percentile bootstrap over problems, "
                 f"{stats.DEFAULT_RESAMPLES:,} resamples, recipe.evaluation.stats)")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="OPSD and/or GRPO on the toy student: before/after table.")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--steps", type=int, default=ToyRunConfig.steps)
    parser.add_argument("--batch-size", type=int, default=ToyRunConfig.batch_size)
    parser.add_argument("--data-seed", type=int, default=42, help="verl data.seed (problem order), both methods")
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate only the first N held-out problems")
    parser.add_argument("--run-root", default=None, help="default: <student cache dir>/runs/<UTC time>")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per training launch")
    parser.add_argument("--out", default=None, help="also write the markdown table here (summary.json: in the run root)")
    parser.add_argument("overrides", nargs="*", help="verl overrides appended to every launch (after --)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = ToyRunConfig(steps=args.steps, batch_size=args.batch_size, data_seed=args.data_seed, eval_n=args.eval_n,
                          eval_limit=args.eval_limit)
    root = build_student(config.student)
    run_root = Path(args.run_root) if args.run_root else root / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    if run_root.exists() and any(run_root.iterdir()):
        raise FileExistsError(f"{run_root} is not empty; pass another --run-root")
    print(f"[toy] student {root / 'student'}; runs in {run_root}", flush=True)
    before = evaluate_all(root / "student", root, root / "student_eval" / "none", config)
    print(f"[toy] before: {headline(before)}", flush=True)
    results = {}
    for method in args.methods:
        results[method] = run_method(method, config=config, root=root, run_dir=run_root / method,
                                     extra=args.overrides, timeout_s=args.timeout)
        print(f"[toy {method}] after: {headline(results[method]['after'])}", flush=True)
    text = table(before, results, config)
    print(text, end="")
    summary = {"before": before, "config": {"steps": config.steps, "batch_size": config.batch_size},
               **{m: {"after": r["after"], "wall_time_s": r["train"]["wall_time_s"],
                      "step_times_s": r["train"]["step_times_s"]} for m, r in results.items()}}
    (run_root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.out:
        Path(args.out).write_text(text)
    return 0
