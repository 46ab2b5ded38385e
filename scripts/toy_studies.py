"""Toy-world studies on the SFT-trained toy student (docs/toy_world.md), one subcommand each.

    python scripts/toy_studies.py signals                     # initial forward KL across teacher contexts
    python scripts/toy_studies.py seeds --seeds 1 2 3         # OPSD vs the no-privilege control over data seeds
    python scripts/toy_studies.py compare --steps 30          # OPSD vs GRPO: same steps, same problems, one table

``python scripts/toy_studies.py <command> --help`` lists a command's options; arguments after ``--``
are hydra overrides of every launch (seeds, compare). Logic: recipe/experiments/toy_*.py.
"""

import sys

from recipe.common import cli

COMMANDS = {
    "signals": ("recipe.experiments.toy_signals:main",
                "initial forward KL of the toy student across teacher contexts and response-position windows"),
    "seeds": ("recipe.experiments.toy_seeds:main", "OPSD arms (full solution, no-privilege control, ...) x data seeds"),
    "compare": ("recipe.experiments.toy_compare:main", "OPSD vs GRPO on the toy student: accuracy, time, compute"),
}

if __name__ == "__main__":
    sys.exit(cli.run(lambda argv: cli.dispatch(COMMANDS, argv, description=__doc__.split("\n\n")[0])))
