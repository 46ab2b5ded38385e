"""The two CPU demos of the launcher (``recipe.launch.demos``): their builders and the toy evaluation.

- ``toy``: the SFT-trained toy student (``recipe.toy.student``, built once, ~3 min on 2 cores)
  on two-digit addition; evaluated on the 256 held-out problems before and after training
  (greedy accuracy, Avg@n, Pass@n, mean length). Each launch trains in a fresh
  ``<student>/runs/<UTC time>-<recipe>`` directory. The recipe preset: ``config/demo/toy.yaml``.
- ``tiny``: a random tiny Qwen3 (``recipe.models.tiny``) and 64 / 16 toy problems of the same
  generator, cached in ``$OPSD_CACHE/tiny_qwen3`` and ``$OPSD_CACHE/tiny_data``; a few steps,
  no evaluation (the machinery, not learning). Preset: ``config/demo/tiny.yaml``.

What MODEL_PATH / TRAIN_FILES give is used instead and not built.

CLI: the tiny demo's model (``recipe.models.tiny.build_tiny_model``; no download) and optionally its
train / val / sft parquet (``write_tiny_data``), anywhere::

    python -m recipe.toy.demo --out-dir tiny
    python -m recipe.toy.demo --out-dir tiny --data-dir tiny_data
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import pandas as pd

from recipe.evaluation import stats
from recipe.launch.demos import DemoBuild
from recipe.launch.run import DemoInputs
from recipe.launch.settings import Settings
from recipe.toy.data import rl_rows, sft_rows
from recipe.toy.student import StudentConfig, build_student, evaluate_model, student_dir, write_data
from recipe.toy.task import TaskConfig, make_records

# The tiny demo's problems: the toy generator at its smallest useful size.
TINY_TASK = TaskConfig(num_operands=2, digits=2, n_train=64, n_heldout=16, seed=0)


def write_tiny_data(out_dir: str | Path, task: TaskConfig = TINY_TASK) -> dict[str, Path]:
    """``train.parquet`` / ``val.parquet`` (verl RL rows) and ``sft.parquet`` (messages) of ``task``, if missing."""
    out_dir = Path(out_dir)
    paths = {"train": out_dir / "train.parquet", "val": out_dir / "val.parquet", "sft": out_dir / "sft.parquet"}
    if all(path.is_file() for path in paths.values()):
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    records = make_records(task)
    pd.DataFrame(rl_rows(records["train"])).to_parquet(paths["train"])
    pd.DataFrame(rl_rows(records["heldout"])).to_parquet(paths["val"])
    pd.DataFrame(sft_rows(records["train"])).to_parquet(paths["sft"])
    return paths


def tiny(recipe: str, settings: Settings, *, build: bool = True) -> DemoBuild:
    """The tiny demo's model and data (built into OPSD_CACHE unless MODEL_PATH / TRAIN_FILES are set)."""
    from recipe.models.tiny import build_tiny_model

    cache = Path(settings.cache_dir)
    model, data = cache / "tiny_qwen3", cache / "tiny_data"
    if build and settings.model_path is None and not (model / "config.json").is_file():
        print(f"[tiny] building the random tiny Qwen3 in {model}", flush=True)
        build_tiny_model(model, seed=0, overwrite=True)
    if build and settings.train_files is None:
        write_tiny_data(data)
    train = data / ("sft.parquet" if recipe == "sft" else "train.parquet")
    return DemoBuild(DemoInputs("tiny", model_path=str(model), train_files=str(train),
                                val_files=None if recipe == "sft" else str(data / "val.parquet")))


def evaluate_toy(model: Path, out_dir: Path, *, benchmark: Path, eval_n: int, eval_limit: int | None) -> dict:
    """``{greedy, avg@n, pass@n, mean_length, n_problems}`` on the held-out problems (fractions; T 1.0 sampling)."""
    greedy = evaluate_model(model, benchmark, out_dir / "greedy", greedy=True, limit=eval_limit)
    sampled = evaluate_model(model, benchmark, out_dir / f"sampled_n{eval_n}", greedy=False, n=eval_n, limit=eval_limit)
    per_problem = {"greedy": problem_scores(out_dir / "greedy"),
                   f"avg@{eval_n}": problem_scores(out_dir / f"sampled_n{eval_n}")}
    return {"greedy": greedy["avg@1"], f"avg@{eval_n}": sampled[f"avg@{eval_n}"],
            f"pass@{eval_n}": sampled[f"pass@{eval_n}"], "mean_length": sampled["mean_length"],
            "n_problems": sampled["n_problems"], "per_problem": per_problem}


def problem_scores(eval_dir: Path) -> dict[str, float]:
    """``{problem_id: Avg@n}`` of one evaluation directory (its results.json ``per_problem``)."""
    results = json.loads((Path(eval_dir) / "results.json").read_text())
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


def display_toy(metrics: dict, *, eval_n: int) -> dict[str, str]:
    """Table rows of ``evaluate_toy``'s metrics."""
    n = eval_n
    return {f"greedy accuracy (%), {metrics['n_problems']} problems": f"{100 * metrics['greedy']:.1f}",
            f"Avg@{n} (%), T 1.0": f"{100 * metrics[f'avg@{n}']:.1f}",
            f"Pass@{n} (%)": f"{100 * metrics[f'pass@{n}']:.1f}",
            "mean length (tokens)": f"{metrics['mean_length']:.1f}"}


def toy(recipe: str, settings: Settings, *, build: bool = True, config: StudentConfig = StudentConfig(),
        eval_n: int = 4, eval_limit: int | None = None) -> DemoBuild:
    """The toy demo: the cached toy student and its data, a fresh run directory, the held-out evaluation."""
    root = student_dir(config, cache=settings.cache_dir)
    if build and settings.model_path is None:
        build_student(config, cache=settings.cache_dir)
    elif build:
        write_data(config, root / "data")
    data = root / "data"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    inputs = DemoInputs("toy", model_path=str(root / "student"), train_files=str(data / "train.parquet"),
                        val_files=str(data / "heldout.parquet"), ckpt_dir=str(root / "runs" / f"{stamp}-{recipe}"))
    return DemoBuild(inputs,
                     evaluate=partial(evaluate_toy, benchmark=data / "heldout.jsonl", eval_n=eval_n, eval_limit=eval_limit),
                     display=partial(display_toy, eval_n=eval_n),
                     before_dir=root / "student_eval" / "none" if settings.model_path is None else None)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from recipe.common import cli
    from recipe.models.tiny import build_tiny_model

    parser = argparse.ArgumentParser(description="Build the tiny Qwen3-architecture model + character tokenizer "
                                                 "(and optionally the tiny toy data). No download.")
    parser.add_argument("--out-dir", required=True, help="directory for the HF model + tokenizer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=2, help="head_dim = hidden / heads must be >= 32")
    parser.add_argument("--num-kv-heads", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing model in --out-dir")
    parser.add_argument("--data-dir", default=None, help="also write the tiny demo's train/val/sft parquet here")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out_dir, seed=args.seed, num_layers=args.num_layers, hidden_size=args.hidden_size,
                            num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                            intermediate_size=args.intermediate_size, overwrite=args.overwrite)
    print(f"tiny model: {path}")
    if args.data_dir:
        print("tiny data: " + " ".join(str(p) for p in write_tiny_data(args.data_dir).values()))
    return 0


if __name__ == "__main__":
    import sys

    from recipe.common import cli

    sys.exit(cli.run(main))
