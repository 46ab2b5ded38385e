"""The paper's figures from run logs and result JSON (PNG, CPU only), one subcommand each.

  dynamics   training curves, 5-step moving average from step 2 (fig:grpo_opsd_dynamics)
  accuracy   Avg@n / Pass@n vs training step (fig:opsd_extend300)
  cap-sweep  OPSD (solid) vs Base (dashed) across rollout caps (fig:length_sweeps)
  pca        rollout-level signal PCA (fig:teacher_context_signals a) from signals.json files
  windows    forward KL mean / SNR by response-position window from signals.json files

    python scripts/make_figures.py dynamics --run Qwen3-4B=runs/a.jsonl --run "SFT+GRPO=runs/b.log" --out dyn.png

Spec layouts and options: ``<command> --help``; logic: recipe/analysis/figures.py (drawing: recipe/analysis/plots.py).
"""

import sys

from recipe.analysis.figures import main
from recipe.common import cli

if __name__ == "__main__":
    sys.exit(cli.run(main))
