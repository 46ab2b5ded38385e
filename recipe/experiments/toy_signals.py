"""Toy-scale reproductions of the paper's frozen-teacher measurements (docs/toy_world.md).

``initial_signals`` runs the project's signal analysis (``recipe.analysis.signal_analysis``: sample rollouts from the
student prompt once, rescore the same response tokens under every teacher context with ``recipe.opsd.core.signals``)
on the toy student, in its no-think mode, with response-position windows scaled to toy responses (~20 tokens
instead of thousands). The CLI prints the context table and the signal report (``--out-dir``: also signals.json /
signals.md / figures)::

    python scripts/toy_studies.py signals                 # default toy student (built if missing)
    python scripts/toy_studies.py signals --model DIR --data train.parquet --num-prompts 64
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from recipe.analysis.signal_analysis import run_signal_analysis
from recipe.analysis.signal_conditions import SignalAnalysisConfig
from recipe.analysis.signal_report import OUTPUT_FILES, markdown_report, write_outputs
from recipe.analysis.signal_rollouts import load_model, load_rows, load_tokenizer
from recipe.common import cli

CONTEXTS = ("full_solution", "answer_only", "unrelated", "none")
# Response-position windows [lo, hi) for ~20-token toy responses (the paper's start at 0-128).
TOY_WINDOWS = ((0, 4), (4, 8), (8, 12), (12, 16), (16, 24), (24, 48))


def signal_config(*, num_prompts: int = 128, rollouts_per_prompt: int = 2, temperature: float = 1.0,
                  max_new_tokens: int = 48, seed: int = 42, contexts=CONTEXTS) -> SignalAnalysisConfig:
    return SignalAnalysisConfig(
        num_prompts=num_prompts, rollouts_per_prompt=rollouts_per_prompt, temperature=temperature,
        # untruncated sampling, as the toy measurements of docs/toy_world.md were taken
        top_p=1.0, top_k=-1,
        max_new_tokens=max_new_tokens, seed=seed, student_mode="no_think",
        conditions=tuple(f"{context}:no_think" for context in contexts), windows=TOY_WINDOWS,
        sample_batch_size=64, score_batch_size=32, top_tokens=10,
    )


def initial_signals(model_dir: str | Path, train_parquet: str | Path, *, config: SignalAnalysisConfig,
                    model_name: str = "toy student") -> dict:
    """Signal-analysis result (``run_signal_analysis``) of ``model_dir`` on the toy training prompts."""
    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    rows = load_rows(train_parquet)
    return run_signal_analysis(model, tokenizer, rows, config=config, model_name=model_name)


def context_table(result: dict) -> str:
    """Fwd KL per teacher context and its ratio to the full-solution teacher's."""
    conditions = result["conditions"]
    full = conditions.get("full_solution:no_think", {}).get("summary", {}).get("fwd_kl")
    lines = ["| teacher context | Fwd KL | Fwd KL / full solution | top-1 agree (%) | abs adv |", "|---|---|---|---|---|"]
    for name, report in conditions.items():
        summary = report["summary"]
        ratio = f"{summary['fwd_kl'] / full:.2f}" if full else "-"
        lines.append(f"| {name.split(':')[0]} | {summary['fwd_kl']:.4f} | {ratio} | {summary['agree']:.1f} "
                     f"| {summary['abs_adv']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from recipe.common.checkpoints import check_model_dir
    from recipe.launch.config import Settings
    from recipe.toy.student import StudentConfig, build_student

    parser = argparse.ArgumentParser(description="Initial forward KL of the toy student across teacher contexts "
                                                 "and response-position windows.")
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
