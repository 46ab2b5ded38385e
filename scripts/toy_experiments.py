"""Initial forward KL of the toy student across teacher contexts and response-position windows.

    python scripts/toy_experiments.py                         # default toy student (built if missing)
    python scripts/toy_experiments.py --model DIR --data train.parquet --num-prompts 64

Prints the context table and the signal report (recipe.analysis.signal_analysis.markdown_report);
with --out-dir also writes signals.json / signals.md / figures. Logic: recipe/experiments/toy_signals.py.
"""

import argparse
import os
import sys
from pathlib import Path

from recipe.analysis.signal_analysis import OUTPUT_FILES, markdown_report, write_outputs
from recipe.common import cli
from recipe.common.checkpoints import check_model_dir
from recipe.experiments.toy_signals import context_table, initial_signals, signal_config
from recipe.launch.settings import Settings
from recipe.toy.student import StudentConfig, build_student


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF model dir (default: the toy student)")
    parser.add_argument("--data", default=None, help="verl parquet (default: the toy training parquet)")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--rollouts-per-prompt", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out-dir", default=None, help="also write signals.json / signals.md / figures here")
    parser.add_argument("--overwrite", action="store_true", help="replace those files in --out-dir")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if args.out_dir:
        cli.refuse_overwrite([Path(args.out_dir) / name for name in OUTPUT_FILES], overwrite=args.overwrite,
                             other="another --out-dir")
    if args.model is not None:
        check_model_dir(args.model)
    if args.data is not None:
        cli.require_file(args.data, what="training parquet")
    with cli.reraise_as_input(ValueError):  # the options' validation (SignalAnalysisConfig.__post_init__)
        config = signal_config(num_prompts=args.num_prompts, rollouts_per_prompt=args.rollouts_per_prompt,
                               temperature=args.temperature, seed=args.seed)
    if args.model is None or args.data is None:
        root = build_student(StudentConfig(), cache=Settings.from_environ(os.environ).cache_dir)
        args.model = args.model or str(root / "student")
        args.data = args.data or str(root / "data" / "train.parquet")
    result = initial_signals(args.model, args.data, config=config, model_name=Path(args.model).name)
    print(context_table(result))
    print(markdown_report(result))
    if args.out_dir:
        write_outputs(result, args.out_dir, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
