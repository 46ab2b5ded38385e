"""OPSD vs GRPO compute, one run of each on the same model and data, side by side (the wall time, step
and phase times, tokens per second, device hours, peak memory, and the weight-push path of each run).

    python scripts/compare_opsd_grpo.py --steps 4                                  # tiny model, CPU
    python scripts/compare_opsd_grpo.py --model DIR --train-files a.parquet --val-files b.parquet
    python scripts/compare_opsd_grpo.py --opsd-run CKPT_DIR --grpo-run CKPT_DIR    # existing runs

Logic: recipe/experiments/opsd_grpo_cost.py (the table's arithmetic: recipe/analysis/compute_cost.py).
"""

import sys

from recipe.common import cli
from recipe.experiments.opsd_grpo_cost import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
