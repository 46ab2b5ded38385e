"""The two CPU demos of the launcher (``recipe.toy.cpu_demos``): their builders and the toy evaluation.

``toy``: the SFT-trained toy student (``recipe.toy.student``) on two-digit addition, evaluated on the 256
held-out problems before and after training. ``tiny``: a random tiny Qwen3 and 64 / 16 toy problems, a few
steps, no evaluation (the machinery, not learning). Presets: ``config/demo/{toy,tiny}.yaml``; every launch
of a demo first checks each row against the caps of every recipe that reads it (``check_demo_rows``);
docs/launch.md#cpu-demos. The tiny demo's files for any command that needs a model or data (a dry run's
TRAIN_FILES, the evaluation, the signal analysis, the data_prep filters)::

    python -m recipe.toy.demo --out-dir tiny    # tiny/model (random tiny Qwen3), tiny/{train,val,sft}.parquet
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import pandas as pd

from recipe.evaluation import stats
from recipe.launch.config import Settings
from recipe.launch.run import DemoInputs
from recipe.toy.cpu_demos import DemoBuild
from recipe.toy.data import conversation_length, prompt_phrases, rl_rows, sft_rows
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


def _mode(enable_thinking) -> str:
    """The reasoning mode of a chat-template ``enable_thinking`` value (unset: the template's own, ``native``)."""
    return "native" if enable_thinking is None else ("think" if enable_thinking else "no_think")


def row_lengths(recipe: str, cfg, files: dict[str, Path], tokenizer) -> list[tuple[str, str, int, int]]:
    """``(file, cap key, cap, longest row)`` for every cap of ``recipe`` (its composed ``cfg``) on the demo's ``files``.

    ``files``: ``{"sft": ..., "train": ..., "val": ...}`` (the ones the recipe reads). SFT: whole conversations
    against ``data.max_length``; RL recipes: student prompts against ``data.max_prompt_length``; OPSD also the
    teacher prompts of ``opsd.teacher_context`` against ``opsd.teacher_max_prompt_length``.
    """
    from recipe.common.chat import render_ids
    from recipe.common.prompts import build_prompt_pair

    caps = []
    if recipe == "sft":
        frame = pd.read_parquet(files["sft"])
        thinking = cfg.data.get("enable_thinking_default")
        longest = max(conversation_length(m, tokenizer, enable_thinking=thinking) for m in frame["messages"])
        return [(str(files["sft"]), "data.max_length", int(cfg.data.max_length), longest)]
    opsd = cfg.get("opsd")
    for kind in ("train", "val"):
        frame = pd.read_parquet(files[kind])
        if opsd is not None:
            student_mode, teacher_mode = opsd.student_mode, opsd.teacher_mode
        else:
            student_mode = _mode((cfg.data.get("apply_chat_template_kwargs") or {}).get("enable_thinking"))
        longest = max(len(render_ids(list(prompt), tokenizer, student_mode)) for prompt in frame["prompt"])
        caps.append((str(files[kind]), "data.max_prompt_length", int(cfg.data.max_prompt_length), longest))
        if opsd is not None:
            longest = max(len(render_ids(build_prompt_pair(opsd.teacher_context, dict(info))[1], tokenizer, teacher_mode))
                          for info in frame["extra_info"])
            caps.append((str(files[kind]), "opsd.teacher_max_prompt_length", int(opsd.teacher_max_prompt_length), longest))
    return caps


def check_demo_rows(demo: str, files: dict[str, Path], tokenizer, *, overrides: dict[str, list[str]] | None = None) -> None:
    """Every row of the demo's ``files`` fits the caps of every recipe with a ``config/demo/<demo>.yaml`` preset,
    each composed as its CPU launch would be (plus ``overrides[recipe]``); ValueError naming the file, cap and preset.

    The caps (``row_lengths``): an SFT conversation within ``data.max_length``, a student prompt within
    ``data.max_prompt_length``, an OPSD teacher prompt within ``opsd.teacher_max_prompt_length``. A preset
    whose cap no longer fits the data stops the launch before Ray with the row, its length and the preset."""
    from recipe.launch.config import RECIPES, compose

    for name, recipe in RECIPES.items():
        if demo not in recipe.presets("demo"):
            continue
        cfg = compose(recipe, [f"+demo={demo}", f"+platform={recipe.platform}", *(overrides or {}).get(name, [])])
        for file, key, cap, longest in row_lengths(name, cfg, files, tokenizer):
            if longest > cap:
                raise ValueError(f"the {demo} demo's {file} has a row of {longest} tokens > {key}={cap} of the {name} "
                                 f"recipe ({recipe.config_dir / 'demo' / f'{demo}.yaml'}): raise {key} there to >= {longest}")


def tiny(recipe: str, settings: Settings, *, build: bool = True) -> DemoBuild:
    """The tiny demo's model and data (built into ``$OPSD_CACHE/tiny_qwen3`` and ``$OPSD_CACHE/tiny_data`` unless
    MODEL_PATH / TRAIN_FILES are set)."""
    from recipe.models.tiny import build_tiny_model

    cache = Path(settings.cache_dir)
    model, data = cache / "tiny_qwen3", cache / "tiny_data"
    if build and settings.model_path is None and not (model / "config.json").is_file():
        print(f"[tiny] building the random tiny Qwen3 in {model}", flush=True)
        build_tiny_model(model, seed=0, overwrite=True)
    if build and settings.train_files is None:
        paths = write_tiny_data(data)
        from recipe.models.tiny import build_char_tokenizer

        check_demo_rows("tiny", paths, build_char_tokenizer())  # the tiny model's tokenizer, built without the model
    train = data / ("sft.parquet" if recipe == "sft" else "train.parquet")
    # verl's FSDP checkpoints are per world size: a run on N > 1 ranks resumes only from its own directory
    ranks = settings.cpu_num_ranks or 1
    ckpt = None if ranks == 1 else str(cache / "checkpoints" / recipe / f"tiny_{ranks}_ranks")
    return DemoBuild(DemoInputs("tiny", model_path=str(model), train_files=str(train),
                                val_files=None if recipe == "sft" else str(data / "val.parquet"), ckpt_dir=ckpt))


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
    """The toy demo: the cached toy student (not built with MODEL_PATH set) and its data, a fresh
    ``<student>/runs/<UTC time>-<recipe>`` run directory, the held-out evaluation (greedy accuracy, Avg@n,
    Pass@n, mean length)."""
    root = student_dir(config, cache=settings.cache_dir)
    if build and settings.model_path is None:
        build_student(config, cache=settings.cache_dir)
    elif build:
        write_data(config, root / "data")
    data = root / "data"
    if build:  # the student's tokenizer (with its phrase tokens), the files the RL recipes read
        from recipe.models.tiny import build_char_tokenizer

        tokenizer = build_char_tokenizer(phrases=prompt_phrases() if config.phrase_tokens else ())
        check_demo_rows("toy", {"train": data / "train.parquet", "val": data / "heldout.parquet"}, tokenizer)
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
    from recipe.models.tiny import build_char_tokenizer, build_tiny_model

    parser = argparse.ArgumentParser(prog="python -m recipe.toy.demo", description="The tiny demo's model and data: "
                                     "OUT/model (random tiny Qwen3 + character tokenizer, seed 0) and OUT/train.parquet, "
                                     "OUT/val.parquet (verl RL rows), OUT/sft.parquet (messages): 64 / 16 toy problems.")
    parser.add_argument("--out-dir", required=True, type=Path, help="directory to write (its model/ must not exist)")
    parser.add_argument("--no-model", action="store_true", help="the parquet files only")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT/model")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    model_dir = args.out_dir / "model"
    if not args.no_model and not args.overwrite and model_dir.exists() and any(model_dir.iterdir()):
        raise cli.OutputExistsError("is not empty", file=model_dir, hint="pass --overwrite to replace it")
    paths = write_tiny_data(args.out_dir)
    check_demo_rows("tiny", paths, build_char_tokenizer())
    print("tiny data: " + " ".join(str(path) for path in paths.values()))
    if not args.no_model:
        print(f"tiny model: {build_tiny_model(model_dir, seed=0, overwrite=args.overwrite)}")
    return 0


if __name__ == "__main__":
    import sys

    from recipe.common import cli

    sys.exit(cli.run(main))
