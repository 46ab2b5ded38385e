"""The toy acceptance study: OPSD (full solution) vs the no-privilege control over data seeds.

    python scripts/toy_seed_study.py --seeds 1 2 3                           # full_solution + control
    python scripts/toy_seed_study.py --arms full_solution paper_clip --steps 100 --out study.md
    python scripts/toy_seed_study.py --seeds 1 -- actor_rollout_ref.actor.optim.lr=2e-3

Builds (or reuses) the default toy student, evaluates it once, trains one OPSD toy-demo run per
(arm, seed), evaluates each, and prints gains in points as mean +- sd over seeds with the training
divergence of the first and last 10 steps. Logic: recipe/experiments/toy_seeds.py (docs/toy_world.md).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from recipe.common import cli
from recipe.experiments.toy_seeds import ARMS, seed_study, study_table
from recipe.launch.settings import Settings
from recipe.toy.demo import evaluate_toy
from recipe.toy.student import StudentConfig, build_student


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["full_solution", "control"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="verl data.seed of each run")
    parser.add_argument("--steps", type=int, default=None, help="default: the toy preset's (150)")
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--eval-limit", type=int, default=None)
    parser.add_argument("--run-root", default=None, help="default: <student cache dir>/runs/seeds_<UTC time>")
    parser.add_argument("--out", default=None, help="also write the markdown table here (results.json beside it)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file (and its .json)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every launch (after --)")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if args.out:
        cli.refuse_overwrite([args.out, Path(args.out).with_suffix(".json")], overwrite=args.overwrite,
                             other="another --out")
    cli.refuse_nonempty_dir(args.run_root, flag="--run-root")  # before the (minutes-long) student build
    cache = Path(Settings.from_environ(os.environ).cache_dir)
    root = build_student(StudentConfig(), cache=cache)
    run_root = Path(args.run_root) if args.run_root else root / "runs" / time.strftime("seeds_%Y%m%dT%H%M%SZ",
                                                                                        time.gmtime())
    cli.refuse_nonempty_dir(run_root, flag="--run-root")
    print(f"[toy seeds] student {root / 'student'}; runs in {run_root}", flush=True)
    before = evaluate_toy(root / "student", root / "student_eval" / "none", benchmark=root / "data" / "heldout.jsonl",
                          eval_n=args.eval_n, eval_limit=args.eval_limit)
    results = seed_study(cache=cache, run_root=run_root, before=before, arms={arm: ARMS[arm] for arm in args.arms},
                         seeds=args.seeds, steps=args.steps, extra=tuple(args.overrides), eval_n=args.eval_n,
                         eval_limit=args.eval_limit)
    text = study_table(results, before, eval_n=args.eval_n)
    print(text, end="")
    payload = {"before": before, "steps": args.steps, "overrides": args.overrides, "results": results}
    (run_root / "study.json").write_text(json.dumps(payload, indent=2) + "\n")
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
