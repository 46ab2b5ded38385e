"""The compatibility probe: frozen signals and K monitored OPSD steps per cell of a grid, a verdict per cell
(gain / ineffective length growth / stable degradation / collapse) with its indicators and thresholds, and a
recommended cell. Logic and examples: recipe/experiments/probe.py; verdict rules: recipe/analysis/compatibility.py.

    CPU_DEMO=toy python scripts/probe.py --out-dir probe_toy --contexts full_solution unrelated --clip-taus none 0.05
"""

import sys

from recipe.common import cli
from recipe.experiments.probe import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
