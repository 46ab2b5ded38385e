"""Coverage of the paired bootstrap interval (recipe.evaluation.stats) on simulated Base-vs-checkpoint evaluations.

Each trial draws a benchmark set like the paper's (4 benchmarks x 30 problems by default) from a
problem population: a problem's Base accuracy p ~ Beta(a, b) (default 0.5, 0.5: most AIME-style
problems are almost always or almost never solved), the checkpoint's p' = clip(p + shift + N(0,
noise^2), 0, 1); n samples per problem give each side's Avg@n per problem. The estimand is the
population mean of p' - p; the table prints how often the 95% interval covers it, and its mean
width. Prints a Markdown table; the numbers in docs/evaluation.md come from this script.

    python scripts/bench.py bootstrap-coverage --trials 1000
"""

from __future__ import annotations

import argparse

import numpy as np

from recipe.evaluation.stats import paired_bootstrap


def population_shift(rng: np.random.Generator, *, a: float, b: float, shift: float, noise: float,
                     size: int = 2_000_000) -> float:
    """Monte Carlo value of the estimand E[p' - p] (the clip makes it differ from ``shift``)."""
    p = rng.beta(a, b, size)
    return float((np.clip(p + shift + rng.normal(0, noise, size), 0, 1) - p).mean())


def trial(rng: np.random.Generator, *, strata: int, problems: int, n: int, a: float, b: float, shift: float,
          noise: float, resamples: int) -> tuple[float, float, float]:
    p = rng.beta(a, b, (strata, problems))
    q = np.clip(p + shift + rng.normal(0, noise, p.shape), 0, 1)
    base = rng.binomial(n, p) / n
    ckpt = rng.binomial(n, q) / n
    labels = np.repeat(np.arange(strata), problems)
    ci = paired_bootstrap(base_SP=base.ravel(), ckpt_SP=ckpt.ravel(), strata_P=labels.tolist(),
                          n_resamples=resamples, rng_seed=int(rng.integers(2**31)))
    return ci.low, ci.high, ci.estimate


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--n", type=int, default=8, help="samples per problem (Avg@n)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    settings = [  # (benchmarks, problems each, shift, noise)
        (4, 30, 0.0, 0.10), (4, 30, -0.05, 0.15), (1, 30, 0.0, 0.10), (1, 30, -0.05, 0.15), (4, 30, 0.05, 0.30),
    ]
    print("| benchmarks x problems | shift | noise | true change (pts) | coverage of 95% CI | mean width (pts) |")
    print("|---|---|---|---|---|---|")
    for strata, problems, shift, noise in settings:
        rng = np.random.default_rng(args.seed)
        truth = population_shift(rng, a=0.5, b=0.5, shift=shift, noise=noise)
        covered, widths = 0, []
        for _ in range(args.trials):
            low, high, _ = trial(rng, strata=strata, problems=problems, n=args.n, a=0.5, b=0.5, shift=shift,
                                 noise=noise, resamples=args.resamples)
            covered += low <= truth <= high
            widths.append(high - low)
        print(f"| {strata} x {problems} | {shift:+.2f} | {noise:.2f} | {100 * truth:+.2f} | "
              f"{covered / args.trials:.3f} | {100 * np.mean(widths):.1f} |")
    print(f"({args.trials} trials each, {args.resamples} resamples, Avg@{args.n}, Base p ~ Beta(0.5, 0.5))")
    return 0
