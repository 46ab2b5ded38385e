"""Benchmarks and probes: code that only ``scripts/bench.py`` runs (nothing in the recipes imports it).

Each module is one subcommand of ``python scripts/bench.py <command>`` with its own ``main(argv)``
and prints a ratio table:

    loss                 the OPSD loss: naive vs chunked vs fused (recipe.bench.loss)
    signals-pass         token diagnostics from a second vocabulary pass vs from the loss's own
    teacher-transport    teacher hidden states through the driver vs the teacher next to the update
    driver-bytes         bytes per worker-group call from a probe log (recipe.bench.driver_bytes)
    bootstrap-coverage   coverage of the paired bootstrap interval on simulated evaluations
    memory-model         the OPSD update's per-GPU memory model, and its check on the CPU
"""
