"""Build (or reuse) the toy student and print its held-out accuracy without and with the reference solution.

    python scripts/build_toy_student.py                 # default config, cached under $OPSD_CACHE/toy/<hash>
    python scripts/build_toy_student.py --no-eval       # build only; prints the cache directory last
    python scripts/build_toy_student.py --sft-steps 50 --num-layers 2

Logic: recipe.toy.student (verl SFT stage on CPU through the launcher's sft recipe, then merge).
"""

import argparse
import json
import os
import sys

from recipe.common import cli
from recipe.launch.settings import Settings
from recipe.toy.student import StudentConfig, build_student, evaluate_model
from recipe.toy.task import TaskConfig


def main(argv: list[str] | None = None) -> int:
    defaults = StudentConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    sys.exit(cli.run(main))
