"""OPSD vs GRPO on the toy student: same steps, same problems in the same order, one table.

    python scripts/compare_opsd_grpo.py --steps 30                       # both methods
    python scripts/compare_opsd_grpo.py --methods opsd --steps 5 -- opsd.teacher_context=none opsd.teacher.allow_zero_loss=true

Prints accuracy before/after (greedy, Avg@n, Pass@n), mean length, wall time, time per step and
the OPSD/GRPO compute ratio. Logic: recipe.experiments.toy_compare (docs/toy_world.md).
"""

import sys

from recipe.common import cli
from recipe.experiments.toy_compare import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
