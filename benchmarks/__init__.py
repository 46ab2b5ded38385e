"""Benchmarks: code that only ``scripts/bench.py`` runs (not installed; nothing in ``recipe`` imports it).

Each module is one subcommand of ``python scripts/bench.py <command>`` with its own ``main(argv)``
and prints a ratio table (the list: ``python scripts/bench.py --help``).
"""
