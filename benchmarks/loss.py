"""Benchmark the OPSD clipped forward-KL loss (paper eq:opsd_clipped): naive vs chunked vs fused vs fused_sum.

Each (implementation, N) runs forward + backward, both lm_head matmuls included, in a fresh subprocess so that its
peak RSS is its own. ``naive`` materialises [N, V] float32 tensors as the official OPSD code does; ``chunked`` and
``fused`` are ``benchmarks.loss_variants``; ``fused_sum`` is what the OPSD actor calls
(``recipe.opsd.core.losses.fused_linear_weighted_divergence``). The paper's loss settings; errors against float64.
Each implementation, the peak and the error in detail, and the tables: docs/results/loss_kernels.md::

    python scripts/bench.py loss --n 1024 2048 4096 --hidden 1024 --repeats 3 --chunk-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from recipe.common import cli

REPO = Path(__file__).resolve().parents[1]


def _worker_env() -> dict:
    """The worker process's environment: the repository root importable (``benchmarks`` is not installed)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

IMPLS = ("naive", "chunked", "fused", "fused_sum")
BETA, CLIP_TAU, TEMPERATURE = 0.0, 0.05, 1.1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _worker(impl: str, n: int, vocab: int, hidden: int, chunk: int, repeats: int, ref_rows: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    from benchmarks.loss_variants import (  # bench-only; the trainer's is below
        chunked_token_divergence, fused_linear_token_divergence)
    from recipe.opsd.core.losses import fused_linear_weighted_divergence, token_divergence

    if threads:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    # teacher = frozen copy of the student weights seeing a perturbed context (realistic KL ~0.1-1)
    ws = torch.randn(vocab, hidden, generator=gen).mul_(3.0 / hidden**0.5)
    wt = ws.clone()
    hs = torch.randn(n, hidden, generator=gen)
    ht = torch.randn(n, hidden, generator=gen).mul_(0.5).add_(hs)
    hs.requires_grad_(True)
    ws.requires_grad_(True)
    loss_options = dict(beta=BETA, clip_tau=CLIP_TAU, student_temperature=TEMPERATURE)

    def naive():
        s_logits = hs @ ws.T
        with torch.no_grad():
            t_logits = ht @ wt.T
        logp_s = F.log_softmax(s_logits / TEMPERATURE, dim=-1)
        logp_t = F.log_softmax(t_logits / TEMPERATURE, dim=-1)
        p_t = logp_t.exp()
        per_entry = p_t * (logp_t - logp_s)
        return per_entry.clamp(max=CLIP_TAU).sum(-1)

    def chunked():
        s_logits = hs @ ws.T
        with torch.no_grad():
            t_logits = ht @ wt.T
        return chunked_token_divergence(s_logits, t_logits, chunk_size=chunk, **loss_options)

    def fused():
        return fused_linear_token_divergence(hs, ws, ht, wt, chunk_size=chunk, **loss_options)

    ones = torch.ones(n)

    def fused_sum():
        return fused_linear_weighted_divergence(hs, ws, ht, wt, row_weights_N=ones, chunk_size=chunk, **loss_options)

    run_impl = {"naive": naive, "chunked": chunked, "fused": fused, "fused_sum": fused_sum}[impl]
    base_rss = _rss_bytes()
    times, values, grad_h = [], None, None
    for _ in range(repeats):
        hs.grad = ws.grad = None
        t0 = time.perf_counter()
        out = run_impl()
        loss, values = out if isinstance(out, tuple) else (out.sum(), out)
        loss.backward()
        times.append(time.perf_counter() - t0)
        values, grad_h = values.detach()[:ref_rows].clone(), hs.grad[:ref_rows].clone()
    peak_extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base_rss

    # float64 reference on the first ref_rows rows (values and d sum(values) / d hidden)
    h64 = hs.detach()[:ref_rows].double().requires_grad_(True)
    ref = token_divergence(h64 @ ws.detach().double().T, (ht[:ref_rows].double() @ wt.double().T), **loss_options)
    (ref_grad,) = torch.autograd.grad(ref.sum(), h64)
    ref = ref.detach()

    def rel(x, r):
        return float((x.double() - r).abs().max() / r.abs().max())

    return {
        "impl": impl, "n": n, "time_s": statistics.median(times), "peak_extra_gb": peak_extra / 2**30,
        "err_values": rel(values, ref), "err_grad_h": rel(grad_h, ref_grad), "mean_value": float(ref.mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096], help="numbers of positions N")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size V (Qwen3: 151,936)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size H")
    parser.add_argument("--chunk-size", type=int, default=256, help="row chunk of the chunked and fused paths")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward+backward repeats (median reported)")
    parser.add_argument("--ref-rows", type=int, default=64, help="rows of the float64 reference")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per configuration")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    for flag, values in (("--n", args.n), ("--vocab", [args.vocab]), ("--hidden", [args.hidden]),
                         ("--chunk-size", [args.chunk_size]), ("--repeats", [args.repeats]), ("--ref-rows", [args.ref_rows])):
        if min(values) < 1:
            raise cli.InputError(f"{flag} must be >= 1, got {min(values)}")
    if args.ref_rows > min(args.n):
        raise cli.InputError(f"--ref-rows {args.ref_rows} exceeds the smallest --n {min(args.n)}")

    if args.worker:
        result = _worker(args.impls[0], args.n[0], args.vocab, args.hidden, args.chunk_size, args.repeats,
                         args.ref_rows, args.threads)
        print(json.dumps(result))
        return 0

    print(f"V={args.vocab} H={args.hidden} chunk={args.chunk_size} repeats={args.repeats} "
          f"beta={BETA} clip_tau={CLIP_TAU} T={TEMPERATURE}; float32 inputs, fwd+bwd incl. lm_head matmuls", flush=True)
    header = f"{'N':>6} {'impl':>9} {'time s':>8} {'x naive':>8} {'peak extra GB':>14} {'x naive':>8} {'err values':>11} {'err grad_h':>11}"
    rows, failed = [], 0
    for n in args.n:
        naive_result = None
        for impl in args.impls:
            cmd = [sys.executable, "-m", "benchmarks.loss", "--worker", "--impls", impl, "--n", str(n),
                   "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--chunk-size", str(args.chunk_size),
                   "--repeats", str(args.repeats), "--ref-rows", str(args.ref_rows), "--threads", str(args.threads)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=_worker_env())
            except subprocess.TimeoutExpired:
                rows.append(f"{n:>6} {impl:>9}  timed out after {args.timeout:.0f} s")
                failed += 1
                continue
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["killed (out of memory?)"])[-1]
                rows.append(f"{n:>6} {impl:>9}  failed (exit {proc.returncode}): {tail}")
                failed += 1
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            naive_result = result if impl == "naive" else naive_result
            time_ratio = f"{result['time_s'] / naive_result['time_s']:.2f}" if naive_result else "-"
            memory_ratio = f"{result['peak_extra_gb'] / naive_result['peak_extra_gb']:.3f}" if naive_result else "-"
            rows.append(f"{n:>6} {impl:>9} {result['time_s']:>8.2f} {time_ratio:>8} {result['peak_extra_gb']:>14.2f} "
                        f"{memory_ratio:>8} {result['err_values']:>11.1e} {result['err_grad_h']:>11.1e}")
            print(rows[-1], file=sys.stderr, flush=True)
    print(header)
    print("\n".join(rows))
    if failed:
        print(f"{failed} configuration(s) did not finish (see the rows above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
