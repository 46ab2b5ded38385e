"""The compatibility probe: frozen signals and K monitored OPSD steps per cell of a grid, a verdict per cell
(gain / ineffective length growth / stable degradation / collapse) with its indicators and thresholds, and a
recommended cell; ``preregistered``: its pre-registered test against full runs. Logic and examples: recipe/probe/.

    CPU_DEMO=toy python scripts/probe.py --out-dir probe_toy --contexts full_solution unrelated --clip-taus none 0.05
    CPU_DEMO=toy python scripts/probe.py preregistered --world toy --out-dir prereg_toy
"""

import sys

from recipe.common import cli


def main(argv: list[str]) -> int:
    if argv[:1] == ["preregistered"]:
        from recipe.probe.preregistered import main as preregistered

        return preregistered(argv[1:])
    from recipe.probe.cli import main as probe

    return probe(argv)


if __name__ == "__main__":
    sys.exit(cli.run(main))
