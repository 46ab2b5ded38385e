"""Staleness of a trained batch and the overlap speed-up model (pure python, no verl import).

``lag_metrics``: the ``async/*`` metrics of one trained batch from the policy versions the rollout
labelled each sample with; the async trainers (``recipe.async_rl.trainers``, the OPSD ones) log them
every step: lag 0 synchronous, 1 one-step-off from its second step, at most about
``ceil(staleness_threshold)`` fully-async (measured: docs/results/async.md). ``overlap_model`` /
``best_split``: the modelled speed-up of giving generation its own devices, from one synchronous step's
phase times (``recipe.experiments.async_compare``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LAG_PREFIX = "async"


def lag_metrics(*, policy_version: int, min_versions: Sequence, max_versions: Sequence) -> dict[str, float]:
    """``async/...`` metrics of one trained batch: lag per sample (mean / min / max), the share of
    samples older than the updated weights, and the span of versions inside one trajectory.

    Policy versions count optimizer steps: version v = the weights after v updates. The rollout labels
    each sample with the first and last version a trajectory saw (verl's ``min_global_steps`` /
    ``max_global_steps``; they differ only when a weight push lands in the middle of a partial
    rollout). A step that updates version ``policy_version`` trains sample i with
    ``lag_i = policy_version - min_version_i`` (the oldest weights that produced any of its tokens).
    """
    if len(min_versions) != len(max_versions) or not min_versions:
        raise ValueError(f"need one (min, max) version per sample, got {len(min_versions)} and {len(max_versions)}")
    if any(v is None for v in (*min_versions, *max_versions)):
        raise ValueError("a sample has no policy version (the rollout server did not label it)")
    lags = [policy_version - int(v) for v in min_versions]
    if min(lags) < 0:
        raise ValueError(f"a sample is newer than the weights being updated (version {policy_version}, lags {lags})")
    spans = [int(hi) - int(lo) for lo, hi in zip(min_versions, max_versions)]
    return {
        f"{LAG_PREFIX}/policy_version": float(policy_version),
        f"{LAG_PREFIX}/lag_mean": sum(lags) / len(lags),
        f"{LAG_PREFIX}/lag_min": float(min(lags)),
        f"{LAG_PREFIX}/lag_max": float(max(lags)),
        f"{LAG_PREFIX}/stale_frac": sum(lag > 0 for lag in lags) / len(lags),
        f"{LAG_PREFIX}/version_span_max": float(max(spans)),
    }


@dataclass(frozen=True)
class OverlapModel:
    """Per-step seconds of the synchronous and the overlapped schedule (a model, not a measurement)."""

    sync_step_s: float
    overlap_step_s: float

    @property
    def speedup(self) -> float:
        return self.sync_step_s / self.overlap_step_s


def overlap_model(*, gen_s: float, train_s: float, push_s: float = 0.0, devices: int, rollout_devices: int,
                  gen_scaling: float = 1.0) -> OverlapModel:
    """Speed-up of overlapping rollout and training, from one synchronous step's phase times.

    ``gen_s``: generation time of a step on all ``devices``; ``train_s``: teacher + update (and any
    other training-side work) on all ``devices``; ``push_s``: the weight push (serial in both). The
    overlapped schedule gives ``rollout_devices`` (r of D) to generation and the rest to training;
    training scales with its device count, generation with exponent ``gen_scaling`` (a)::

        sync    = gen + train + push
        overlap = max(gen * (D / r) ** a, train * D / (D - r)) + push

    How generation slows with fewer devices is the model's one assumption: a = 1 throughput-bound (time
    x devices lost, data parallel), a = 0 latency-bound (a step's generation time is its longest rollout
    whatever the device count: long caps, memory-bound decoding). With a = 1 the best split gives exactly
    ``sync`` (perfect scaling leaves nothing to hide); the gain comes from generation that does not speed
    up with more devices (a < 1).
    """
    if not 0 < rollout_devices < devices:
        raise ValueError(f"rollout_devices={rollout_devices} must leave devices for training (devices={devices})")
    if min(gen_s, train_s, push_s) < 0:
        raise ValueError("phase times must be >= 0")
    if not 0.0 <= gen_scaling <= 1.0:
        raise ValueError(f"gen_scaling={gen_scaling} must be in [0, 1]")
    gen = gen_s * (devices / rollout_devices) ** gen_scaling
    train = train_s * devices / (devices - rollout_devices)
    return OverlapModel(sync_step_s=gen_s + train_s + push_s, overlap_step_s=max(gen, train) + push_s)


def best_split(*, gen_s: float, train_s: float, push_s: float = 0.0, devices: int,
               gen_scaling: float = 1.0) -> tuple[int, OverlapModel]:
    """The rollout device count with the largest modelled speed-up (ties: fewer rollout devices)."""
    options = [(r, overlap_model(gen_s=gen_s, train_s=train_s, push_s=push_s, devices=devices, rollout_devices=r,
                                 gen_scaling=gen_scaling)) for r in range(1, devices)]
    return max(options, key=lambda item: (item[1].speedup, -item[0]))
