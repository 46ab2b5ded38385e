"""Offline collapse monitor over finished (or running) OPSD / GRPO runs: the early / late window table and
every monitor warning with its step.

    python scripts/monitor_run.py runs/qwen3_4b.jsonl runs/sft_grpo.log --name Qwen3-4B --name "SFT+GRPO"
    python scripts/monitor_run.py grpo.log --metric-key entropy=actor/entropy   # a GRPO run

Exit code 0, or 3 with ``--strict`` when any run raised a warning. Logic: recipe/analysis/monitor_report.py.
"""

import sys

from recipe.analysis.monitor_report import main
from recipe.common import cli

if __name__ == "__main__":
    sys.exit(cli.run(main))
