"""Benchmarks and probes of the project, one subcommand each (their code: recipe/bench/).

    python scripts/bench.py loss --n 1024 2048 4096 --hidden 1024 --repeats 3 --chunk-size 256
    python scripts/bench.py signals-pass
    python scripts/bench.py teacher-transport --before dc3fddf --after 0523b7a --response-length 1024 --steps 3
    python scripts/bench.py driver-bytes bytes.jsonl
    python scripts/bench.py bootstrap-coverage --trials 1000
    python scripts/bench.py memory-model table
    python scripts/bench.py memory-model check --model DIR --micro-batch 2 --response 512

``python scripts/bench.py <command> --help`` lists a command's options. Each prints a ratio table.
"""

import sys

from recipe.common import cli

COMMANDS = {
    "loss": ("recipe.bench.loss:main", "the OPSD loss: naive vs chunked vs fused, time / peak memory / error"),
    "signals-pass": ("recipe.bench.signals_pass:main", "token diagnostics from a second vocabulary pass vs the loss's own"),
    "teacher-transport": ("recipe.bench.teacher_transport:main",
                          "two revisions' OPSD runs: bytes through the driver, time per step, step-1 agreement"),
    "driver-bytes": ("recipe.bench.driver_bytes:main", "bytes per update step by worker-group call, from a probe log"),
    "bootstrap-coverage": ("recipe.bench.bootstrap_coverage:main",
                           "coverage of the paired bootstrap interval on simulated evaluations"),
    "memory-model": ("recipe.bench.memory:main", "per-GPU memory of the OPSD update: the model (table), its CPU check"),
}

if __name__ == "__main__":
    sys.exit(cli.run(lambda argv: cli.dispatch(COMMANDS, argv, description=__doc__.split("\n\n")[0])))
