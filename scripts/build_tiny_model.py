"""Build the tiny Qwen3-architecture model + character tokenizer (and optionally toy parquet data).

    python scripts/build_tiny_model.py --out-dir ~/.cache/opsd_verl/tiny_model
    python scripts/build_tiny_model.py --out-dir /tmp/tiny --data-dir /tmp/tiny_data
    python scripts/build_tiny_model.py --if-missing --out-dir DIR --data-dir DIR   # run scripts

No download: everything is built locally (recipe.common.tiny_model).
"""

import argparse
import sys
from pathlib import Path

from recipe.common import cli
from recipe.common.tiny_model import build_tiny_model, build_tiny_parquet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=None, help="directory for the HF model + tokenizer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=2, help="head_dim = hidden / heads must be >= 32")
    parser.add_argument("--num-kv-heads", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing model in --out-dir / data in --data-dir")
    parser.add_argument(
        "--if-missing", action="store_true", help="skip the model / data when already built there (run scripts)"
    )
    parser.add_argument("--data-dir", default=None, help="also write train.parquet / val.parquet toy data here")
    parser.add_argument("--num-train", type=int, default=64)
    parser.add_argument("--num-val", type=int, default=16)
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if args.out_dir is None and args.data_dir is None:
        parser.error("pass --out-dir (model) and/or --data-dir (toy data)")
    build_data = args.data_dir and not (args.if_missing and (Path(args.data_dir) / "train.parquet").is_file())
    if build_data:  # before the model build, so a refusal costs nothing
        cli.refuse_overwrite([Path(args.data_dir) / "train.parquet", Path(args.data_dir) / "val.parquet"],
                             overwrite=args.overwrite, other="another --data-dir")
    if args.out_dir is not None and not (args.if_missing and (Path(args.out_dir) / "config.json").is_file()):
        build_model(args)
    if build_data:
        train, val = build_tiny_parquet(args.data_dir, num_train=args.num_train, num_val=args.num_val, seed=args.seed,
                                        overwrite=args.overwrite)
        print(f"toy data: {train} {val}")
    return 0


def build_model(args: argparse.Namespace) -> None:
    path = build_tiny_model(
        args.out_dir,
        seed=args.seed,
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
        overwrite=args.overwrite,
    )
    print(f"tiny model: {path}")


if __name__ == "__main__":
    sys.exit(cli.run(main))
