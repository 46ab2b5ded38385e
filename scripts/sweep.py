"""Run a sweep of experiment presets for one model preset and tabulate it like the paper.

Thin CLI over ``recipe.experiments.sweep`` (docs/presets.md: the GPU commands, what a sweep writes). Arguments after
``--`` are hydra overrides applied to every run (after the presets). A CPU smoke run with the tiny local model:

    python scripts/sweep.py run --device cpu --model tiny_cpu --presets default divergence_jsd \\
        --eval-n 2 --eval-limit 1 --benchmarks aime2024 --out /tmp/sweep -- \\
        actor_rollout_ref.model.path=/tmp/tiny data.train_files=... data.val_files=... \\
        data.max_response_length=32 trainer.total_training_steps=1 trainer.save_freq=1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recipe.common import cli
from recipe.experiments import sweep
from recipe.launch.run import config_errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "plan, run sequentially here, tabulate"), ("plan", "write configs and plans only"),
                            ("submit", "plan, then one Ray job per run and per base evaluation")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--model", required=True, help=f"model preset: {', '.join(sweep.available('model'))}")
        p.add_argument("--presets", nargs="+", required=True, help="experiment presets; a+b combines presets in one run")
        p.add_argument("--out", required=True, help="sweep directory")
        p.add_argument("--device", choices=sweep.DEVICES, default="gpu", help="cpu: the CPU path (+platform=cpu)")
        p.add_argument("--eval-n", type=int, default=8, help="samples per problem")
        p.add_argument("--eval-seed", type=int, default=42)
        p.add_argument("--eval-limit", type=int, default=None, help="first N problems per benchmark (smoke runs)")
        p.add_argument("--benchmarks", nargs="+", default=list(sweep.EvalSettings.benchmarks))
        p.add_argument("--eval-backend", choices=["vllm", "sglang", "hf"], default=None, help="default: the preset's engine")
        p.add_argument("--train-timeout", type=float, default=None, help="seconds per training run (killed after)")
        if name == "submit":
            p.add_argument("--address", required=True, help="Ray dashboard address, e.g. http://head:8265")
            p.add_argument("--dry-run", action="store_true", help="print the ray job submit commands only")
        if name == "plan":
            p.add_argument("--dry-run", action="store_true",
                           help="print every run's final config; write, prepare and start nothing")
        p.add_argument("overrides", nargs="*", help="hydra overrides for every run (after --)")
    one = sub.add_parser("run-one", help="execute one planned run directory (used by Ray jobs)")
    one.add_argument("run_dir")
    base = sub.add_parser("eval-base", help="evaluate one base-model task directory (used by Ray jobs)")
    base.add_argument("task_dir")
    collect = sub.add_parser("collect", help="write comparison.md / comparison.json / figures of a sweep")
    collect.add_argument("sweep_dir")
    sub.add_parser("list", help="list the experiment and model presets")
    cli.add_debug_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # the sweep reports every input problem as a ValueError (or a hydra / omegaconf composition error)
    with cli.reraise_as_input(*config_errors()):
        if args.command == "list":
            print("experiment presets:", " ".join(sweep.available("experiment")))
            print("model presets:", " ".join(sweep.available("model")))
        elif args.command == "run-one":
            print(json.dumps(sweep.run_one(args.run_dir), indent=2))
        elif args.command == "eval-base":
            sweep.run_base_task(args.task_dir)
        elif args.command == "collect":
            print(sweep.collect(args.sweep_dir))
        else:
            evaluation = sweep.EvalSettings(n=args.eval_n, seed=args.eval_seed, benchmarks=tuple(args.benchmarks),
                                            limit=args.eval_limit, backend=args.eval_backend)
            dry_run = args.command == "plan" and args.dry_run
            plans = sweep.plan_sweep(args.presets, model=args.model, sweep_dir=args.out, device=args.device,
                                     overrides=args.overrides, evaluation=evaluation, train_timeout_s=args.train_timeout,
                                     dry_run=dry_run)
            if dry_run:
                for plan in plans:
                    print(f"# ===== run {plan['name']} ({plan['run_dir']}/config.yaml)\n{plan['config_yaml']}", end="")
            elif args.command == "plan":
                for plan in plans:
                    print(f"{plan['run_dir']}/config.yaml\n  $ {' '.join(plan['train_cmd'])}")
            elif args.command == "submit":
                for cmd in sweep.submit_ray(plans, sweep_dir=args.out, address=args.address, dry_run=args.dry_run):
                    print(" ".join(cmd))
            else:
                sweep.run_local(plans, sweep_dir=args.out)
                print((Path(args.out) / "comparison.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
