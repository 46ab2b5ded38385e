"""Benchmark: the OPSD actor loss with its token diagnostics from a second vocabulary pass (before)
vs from the loss's own pass (after), forward + backward, one micro-batch.

    python scripts/bench.py signals-pass
    python scripts/bench.py signals-pass --shape 2048 49152 576 --repeats 3

before = ``signals.token_signals_from_hidden`` + ``losses.fused_linear_weighted_divergence``; after =
``signals.weighted_divergence_and_signals``, what ``actor_loss.opsd_loss`` runs for ``variant: opsd`` without top-k.
Both outputs are checked equal (float32 tolerances) on random float32 inputs with the paper's loss settings. Prints
best-of-repeats wall time per configuration and after / before (what is compared: docs/results/loss_kernels.md).
"""

from __future__ import annotations

import argparse
import time

import torch

from recipe.opsd.core.losses import fused_linear_weighted_divergence
from recipe.opsd.core.signals import SIGNAL_KEYS, token_signals_from_hidden, weighted_divergence_and_signals

OPTS = dict(beta=0.0, clip_tau=0.05, student_temperature=1.1)
# (N response rows, V, H): SmolLM2-135M's head; a Qwen3-scale vocabulary with a reduced H
DEFAULT_SHAPES = ((2048, 49152, 576), (512, 151936, 1024))


def _inputs(n: int, v: int, h: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hs = torch.randn(n, h, generator=generator) / h ** 0.5
    ws = torch.randn(v, h, generator=generator)
    ht = hs + 0.3 * torch.randn(n, h, generator=generator) / h ** 0.5
    wt = ws + 0.05 * torch.randn(v, h, generator=generator)
    ids = torch.randint(0, v, (n,), generator=generator)
    return hs, ws, ht, wt, ids, torch.full((n,), 1.0 / n)


def _before(hs, ws, ht, wt, ids, w, chunk):
    hs, ws = hs.clone().requires_grad_(True), ws.clone().requires_grad_(True)
    with torch.no_grad():
        signals = token_signals_from_hidden(hs.detach(), ws.detach(), ht, wt, ids, chunk_size=chunk,
                                            clip_tau=OPTS["clip_tau"], student_temperature=OPTS["student_temperature"])
    loss, _ = fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=w, chunk_size=chunk, **OPTS)
    loss.backward()
    return loss.detach(), (hs.grad, ws.grad), signals


def _after(hs, ws, ht, wt, ids, w, chunk):
    hs, ws = hs.clone().requires_grad_(True), ws.clone().requires_grad_(True)
    loss, _, signals = weighted_divergence_and_signals(hs, ws, ht, wt, ids, row_weights_N=w, chunk_size=chunk, **OPTS)
    loss.backward()
    return loss.detach(), (hs.grad, ws.grad), signals


def _best_time(fn, args, repeats: int) -> tuple[float, tuple]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs=3, type=int, action="append", metavar=("N", "V", "H"),
                        help="response rows, vocabulary, hidden size (repeatable; default: two shapes)")
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"float32, chunk_size {args.chunk_size}, {torch.get_num_threads()} threads, best of {args.repeats}")
    print()
    print("| N | V | H | before: signals pass + loss (s) | after: one pass (s) | after / before |")
    print("|---|---|---|---|---|---|")
    for n, v, h in args.shape or DEFAULT_SHAPES:
        inputs = (*_inputs(n, v, h), args.chunk_size)
        t_before, (loss_b, grads_b, sig_b) = _best_time(_before, inputs, args.repeats)
        t_after, (loss_a, grads_a, sig_a) = _best_time(_after, inputs, args.repeats)
        torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-7)
        for grad_after, grad_before in zip(grads_a, grads_b):
            torch.testing.assert_close(grad_after, grad_before, rtol=1e-4, atol=1e-6)
        for key in SIGNAL_KEYS:
            torch.testing.assert_close(sig_a[key], sig_b[key], rtol=1e-4, atol=1e-5, msg=key)
        print(f"| {n} | {v} | {h} | {t_before:.2f} | {t_after:.2f} | {t_after / t_before:.3f} |")
