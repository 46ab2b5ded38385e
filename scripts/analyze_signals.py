"""Frozen teacher-student signal analysis of one model (paper: "Token-Level Analysis Protocol").

Samples K prompts x R rollouts from a verl training parquet (default 2,048 x 2 at temperature 1.1, 1,024-token cap),
rescores the SAME response tokens under every teacher condition ``context:mode``, and writes to ``--out-dir``
``signals.json`` (all numbers, per-rollout features included), ``signals.md`` (the paper's tables), ``pca.png``,
``position_windows.png`` and ``rollouts.json`` (reuse: ``--rollouts``). GPU: add ``--device cuda --dtype bfloat16
--backend vllm``; the S/T grid or multi-model tables: ``--combine run_a/signals.json run_b/signals.json``.
Logic: recipe/analysis/signal_analysis.py (and the signal_* modules it names). Example (CPU, tiny model)::

    python scripts/analyze_signals.py --model /tmp/tiny --data /tmp/tiny_data/train.parquet --out-dir /tmp/signals \\
      --num-prompts 8 --max-new-tokens 64 --conditions full_solution:think answer_only:think unrelated:think none:think
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from recipe.analysis import signal_analysis
from recipe.analysis.signal_conditions import BACKENDS, MODES, SignalAnalysisConfig
from recipe.analysis.signal_report import combined_table
from recipe.common import cli


def main(argv: list[str] | None = None) -> int:
    defaults = SignalAnalysisConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="Hugging Face model directory (student = frozen teacher)")
    p.add_argument("--data", help="verl training parquet (prompt + extra_info)")
    p.add_argument("--out-dir")
    p.add_argument("--combine", nargs="+", metavar="SIGNALS_JSON",
                   help="only print one table over earlier runs' signals.json (models / student modes, macro average)")
    p.add_argument("--model-name", default=None, help="name in tables and figures (default: the directory name)")
    p.add_argument("--data-label", default=None,
                   help="dataset name in multi-run tables and the joint PCA (default: the --data file name without suffix)")
    p.add_argument("--conditions", nargs="+", default=list(defaults.conditions),
                   help="teacher conditions context:mode or context:mode@CAP (mode think | no_think | native = the "
                        "template's default; @CAP cuts the privileged text so the teacher prompt fits CAP tokens)")
    p.add_argument("--student-mode", default=defaults.student_mode, choices=MODES,
                   help="student prompt mode (native = the template's default, for templates without a thinking switch)")
    p.add_argument("--num-prompts", type=int, default=defaults.num_prompts)
    p.add_argument("--rollouts-per-prompt", type=int, default=defaults.rollouts_per_prompt)
    p.add_argument("--temperature", type=float, default=defaults.temperature)
    p.add_argument("--top-p", type=float, default=defaults.top_p, help="rollout top-p (default: the trainer's 0.95; 1 = off)")
    p.add_argument("--top-k", type=int, default=defaults.top_k, help="rollout top-k (default: the trainer's 20; -1 = off)")
    p.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="rollout cap")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--signal-temperature", type=float, default=None, help="scoring temperature (default: --temperature)")
    p.add_argument("--clip-tau", type=float, default=defaults.clip_tau, help="per-entry cap of the clip diagnostics")
    p.add_argument("--entropy-fraction", type=float, default=defaults.entropy_fraction, help="HE share fraction (0.2 = HE20)")
    p.add_argument("--top-tokens", type=int, default=defaults.top_tokens)
    p.add_argument("--windows", nargs="+", default=None, metavar="LO:HI",
                   help="response-position windows (default: the paper's 0:128 128:256 ... 4096:6144)")
    p.add_argument("--teacher-max-prompt-length", type=int, default=None,
                   help="skip rows with longer teacher prompts (conditions without @CAP)")
    p.add_argument("--chunk-size", type=int, default=defaults.chunk_size, help="lm_head rows per chunk")
    p.add_argument("--sample-batch-size", type=int, default=defaults.sample_batch_size)
    p.add_argument("--score-batch-size", type=int, default=defaults.score_batch_size)
    p.add_argument("--backend", default=defaults.backend, choices=BACKENDS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--rollouts", default=None, help="rollouts.json of an earlier run to rescore instead of sampling")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs in --out-dir")
    cli.add_debug_argument(p)
    args = p.parse_args(argv)
    if args.combine:
        with cli.reraise_as_input(ValueError, KeyError, hint="pass signals.json files of scripts/analyze_signals.py"):
            print(combined_table([cli.read_json(path, what="signals.json") for path in args.combine]))
        return 0
    missing = [flag for flag, value in (("--model", args.model), ("--data", args.data), ("--out-dir", args.out_dir)) if not value]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)} (or use --combine)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with cli.reraise_as_input(ValueError):  # the options' validation (SignalAnalysisConfig.__post_init__)
        config = SignalAnalysisConfig(
            num_prompts=args.num_prompts, rollouts_per_prompt=args.rollouts_per_prompt, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
            student_mode=args.student_mode, conditions=tuple(args.conditions), signal_temperature=args.signal_temperature,
            clip_tau=args.clip_tau, entropy_fraction=args.entropy_fraction, top_tokens=args.top_tokens,
            teacher_max_prompt_length=args.teacher_max_prompt_length, chunk_size=args.chunk_size,
            sample_batch_size=args.sample_batch_size, score_batch_size=args.score_batch_size, backend=args.backend,
            windows=_windows(args.windows) if args.windows else defaults.windows,
        )
    signal_analysis.analyze(model=args.model, data=args.data, out_dir=args.out_dir, config=config,
                            model_name=args.model_name, data_label=args.data_label, rollouts=args.rollouts,
                            device=args.device, dtype=args.dtype, overwrite=args.overwrite)
    return 0


def _windows(specs: list[str]) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(lo), int(hi)) for lo, hi in (spec.split(":") for spec in specs))
    except ValueError:
        raise cli.InputError(f"--windows takes LO:HI integer pairs, got {specs}") from None


if __name__ == "__main__":
    sys.exit(cli.run(main))
