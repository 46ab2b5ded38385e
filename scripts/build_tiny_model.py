"""Build the tiny Qwen3-architecture model + character tokenizer (and optionally the tiny toy data).

    python scripts/build_tiny_model.py --out-dir /tmp/tiny
    python scripts/build_tiny_model.py --out-dir /tmp/tiny --data-dir /tmp/tiny_data   # + train/val/sft parquet

No download: everything is built locally (recipe.models.tiny; the data: recipe.toy.demo.write_tiny_data,
the problems of the CPU demo `tiny`).
"""

import argparse
import sys
from recipe.common import cli
from recipe.models.tiny import build_tiny_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        from recipe.toy.demo import write_tiny_data

        print("tiny data: " + " ".join(str(p) for p in write_tiny_data(args.data_dir).values()))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
