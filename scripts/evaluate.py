"""Evaluate a model / checkpoint on AIME 2024-2026 and HMMT Feb 2025, and compare two runs.

Thin CLI over ``recipe.evaluation.harness`` (see docs/evaluation.md).

    # Qwen3-1.7B in thinking mode, the paper's protocol (vLLM, n=8, seed 42)
    python scripts/evaluate.py run --model Qwen/Qwen3-1.7B --preset qwen3_think --out-dir evals/base
    # an OPSD checkpoint (FSDP shards are merged first), same settings
    python scripts/evaluate.py run --model ckpts/opsd/global_step_100/actor --preset qwen3_think --out-dir evals/step100
    python scripts/evaluate.py compare evals/base/results.json evals/step100/results.json
    # CPU smoke test with the tiny local model
    python scripts/evaluate.py run --model /tmp/tiny --preset tiny_cpu --n 2 --limit 2 --out-dir /tmp/eval_tiny
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import check_path
from recipe.evaluation.decoding_presets import PRESETS, get_preset
from recipe.evaluation.report import compare_table, results_table
from recipe.evaluation.harness import DEFAULT_BENCHMARKS, DEFAULT_MERGE_CACHE, EvalConfig, evaluate


_OFF = "off"


def _top_k(value: str) -> int | str:
    return _OFF if value.lower() in ("off", "none", "-1") else int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="sample, grade and tabulate (resumable)")
    run.add_argument("--model", required=True, help="HF model dir or FSDP checkpoint dir (.../global_step_N/actor)")
    run.add_argument("--out-dir", required=True, help="output directory (reused to resume)")
    run.add_argument("--preset", default="qwen3_think", choices=sorted(PRESETS), help="decoding preset")
    run.add_argument("--mode", choices=["think", "no_think", "native"], default=None,
                     help="reasoning mode (default: the preset's; native = template default, no switch)")
    run.add_argument("--benchmarks", nargs="+", default=list(DEFAULT_BENCHMARKS),
                     help="names in data/eval/ or paths to JSONL files (id, problem, answer)")
    run.add_argument("--n", type=int, default=8, help="samples per problem")
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--backend", choices=["vllm", "sglang", "hf"], default=None,
                     help="default: the preset's engine")
    run.add_argument("--temperature", type=float)
    run.add_argument("--top-p", type=float)
    run.add_argument("--top-k", type=_top_k, help="integer, or 'off'")
    run.add_argument("--presence-penalty", type=float)
    run.add_argument("--max-new-tokens", type=int)
    run.add_argument("--context", type=int)
    run.add_argument("--limit", type=int, help="only the first LIMIT problems of each benchmark")
    run.add_argument("--problems-per-call", type=int, default=16, help="problems per backend call")
    run.add_argument("--pass-k", type=int, nargs="*", default=[],
                     help="extra k values for Pass@k in results.json (1 and n are always reported)")
    run.add_argument("--grade-timeout", type=float, default=10.0, help="seconds per Math-Verify comparison")
    run.add_argument("--merge-cache", default=str(DEFAULT_MERGE_CACHE), help="where merged FSDP checkpoints go")
    run.add_argument("--no-progress", action="store_true")
    compare = sub.add_parser("compare", help="Base vs checkpoint table with deltas and 95%% bootstrap intervals")
    compare.add_argument("base", help="results.json of the base model")
    compare.add_argument("checkpoint", help="results.json of the checkpoint")
    cli.add_debug_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "compare":
        base, ckpt = (cli.read_json(path, what="results.json") for path in (args.base, args.checkpoint))
        for path, results in ((args.base, base), (args.checkpoint, ckpt)):
            if not isinstance(results, dict) or "per_dataset" not in results:
                raise cli.InputError("not a results.json of scripts/evaluate.py (no 'per_dataset')", file=path)
        with cli.reraise_as_input(ValueError, file=args.checkpoint):  # results that cannot be compared
            print(compare_table(base, ckpt), end="")
        return 0
    overrides = {
        key: getattr(args, key)
        for key in ("temperature", "top_p", "top_k", "presence_penalty", "max_new_tokens", "context", "mode")
        if getattr(args, key) is not None
    }
    if overrides.get("top_k") == _OFF:
        overrides["top_k"] = None
    with cli.reraise_as_input(ValueError):  # the options' validation (decoding preset, EvalConfig.__post_init__)
        preset = get_preset(args.preset).with_overrides(**overrides)
        config = EvalConfig(
            model=args.model,
            out_dir=args.out_dir,
            preset=preset,
            benchmarks=args.benchmarks,
            n=args.n,
            seed=args.seed,
            backend=args.backend,
            limit=args.limit,
            grade_timeout_s=args.grade_timeout,
            merge_cache=args.merge_cache,
            problems_per_call=args.problems_per_call,
            pass_ks=args.pass_k,
        )
    if Path(args.model).expanduser().exists():  # else a hub id
        check_path(args.model)
    results = evaluate(config, progress=not args.no_progress)
    print(results_table(results), end="")
    print(f"wrote {args.out_dir}/results.json, results.md, generations.jsonl", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
