"""Benchmarks and probes of the project, one subcommand each (their code: benchmarks/).

    python scripts/bench.py loss --n 1024 2048 4096 --hidden 1024 --repeats 3 --chunk-size 256
    python scripts/bench.py signals-pass
    python scripts/bench.py bootstrap-coverage --trials 1000
    python scripts/bench.py real-step --steps 4
    python scripts/bench.py memory-model table
    python scripts/bench.py memory-model check --model DIR --micro-batch 2 --response 512
    python scripts/bench.py gpu --out gpu_out

``python scripts/bench.py <command> --help`` lists a command's options. Each prints a ratio table.
"""

import sys
from pathlib import Path

# benchmarks/ is not installed: the repository root makes it (and, on a machine without the install, recipe/) importable
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recipe.common import cli  # noqa: E402

COMMANDS = {
    "loss": ("benchmarks.loss:main", "the OPSD loss: naive vs chunked vs fused, time / peak memory / error"),
    "signals-pass": ("benchmarks.signals_pass:main", "token diagnostics from a second vocabulary pass vs the loss's own"),
    "bootstrap-coverage": ("benchmarks.bootstrap_coverage:main",
                           "coverage of the paired bootstrap interval on simulated evaluations"),
    "real-step": ("benchmarks.real_step:main", "one OPSD step of the real demo through verl vs its one-process floor"),
    "memory-model": ("benchmarks.memory:main", "per-GPU memory of the OPSD update: the model (table), its CPU check"),
    "gpu": ("benchmarks.gpu:main", "on one GPU: fused vs naive vs Liger loss, memory model vs measured (--smoke: CPU)"),
}

if __name__ == "__main__":
    sys.exit(cli.run(lambda argv: cli.dispatch(COMMANDS, argv, description=__doc__.split("\n\n")[0])))
