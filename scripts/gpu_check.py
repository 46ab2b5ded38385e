"""The first-hour GPU check: 3 OPSD steps of a Hub model with verl's vLLM server, then a verdict.

    python scripts/gpu_check.py                               # Qwen/Qwen3-0.6B, every GPU of this node
    python scripts/gpu_check.py --model Qwen/Qwen3-1.7B --steps 3
    python scripts/gpu_check.py --dry-run                     # the launch it would run (no GPU needed)
    RAY_ADDRESS=<head>:6379 NNODES=2 python scripts/gpu_check.py   # on a cluster (docs/cluster.md)

Extra arguments are hydra overrides of the OPSD launch. Prints per-phase times, tokens per second,
peak GPU memory next to the memory model's prediction, the weight-sync probe after every push, and
one verdict line (exit 0 OK, 1 FAILED, 2 refused before starting). Logic: recipe/tools/gpu_check.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipe.common.cache import cache_root
from recipe.common.cli import error_line
from recipe.launch.run import config_errors
from recipe.tools.gpu_check import DEFAULT_MODEL, DEFAULT_STEPS, run_check


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"Hub id or local directory (default {DEFAULT_MODEL})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"OPSD steps (default {DEFAULT_STEPS})")
    p.add_argument("--cache-dir", type=Path, default=cache_root(),
                   help="data and checkpoints of the check (default $OPSD_CACHE or ~/.cache/opsd-verl)")
    p.add_argument("--dry-run", action="store_true", help="print the launch and the prediction, start nothing")
    args, overrides = p.parse_known_args(argv)
    try:
        return run_check(model=args.model, steps=args.steps, cache_dir=args.cache_dir, overrides=overrides,
                         dry_run=args.dry_run)
    except config_errors() as err:
        print(error_line(err), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
