"""Rollout test hooks, loaded as a verl external module (``launch_env("opsd_test_hooks.rollout", ...)``).

On import it points verl's rollout registries at subclasses of the project's rollouts (resolved lazily
by verl, so nothing of the rollout is imported here):

- ``hf`` (CPU path, ``VERL_PLATFORM=cpu``): ``opsd_test_hooks.hf_rollout`` (server, replica, adapter);
- ``vllm`` (where vLLM is installed): ``opsd_test_hooks.vllm_rollout.HookedvLLMServerAdapter``, a
  subclass of the guarded adapter (``recipe.rollout.vllm_adapter``).

Settings (environment, read at every weight push; each off unless set):

- ``OPSD_TEST_ROLLOUT_WEIGHTS_LOG=<jsonl>`` (hf): after every weight load the server appends
  ``{"replica", "global_steps", "num_weight_updates", "sha256": {name: digest}}`` (``weights_fingerprint``
  of every served float32 tensor), so a test can check that the rollout serves exactly the trainer's
  weights (the same digests of the checkpoint);
- ``OPSD_TEST_ROLLOUT_REQUESTS_LOG=<jsonl>`` (hf): every generate request appends
  ``{"num_weight_updates", "temperature"}`` (the sampling temperature verl's agent loop sent);
- ``OPSD_TEST_SYNC_PROBE_LOG=<jsonl>`` (vllm): after every push the rollout's log-probs of a fixed
  probe are compared with a float32 forward of the pushed weights (``recipe.rollout.sync_probe``);
- ``OPSD_TEST_SKIP_WEIGHT_SYNC=1`` (hf, vllm; negative control): every push after the start-up one
  (step 0) is dropped, so the rollout keeps serving the initial weights.
"""

from __future__ import annotations

import importlib.util
import os

WEIGHTS_LOG_ENV = "OPSD_TEST_ROLLOUT_WEIGHTS_LOG"
REQUESTS_LOG_ENV = "OPSD_TEST_ROLLOUT_REQUESTS_LOG"
PROBE_LOG_ENV = "OPSD_TEST_SYNC_PROBE_LOG"
SKIP_WEIGHT_SYNC_ENV = "OPSD_TEST_SKIP_WEIGHT_SYNC"
HF_ADAPTER = "opsd_test_hooks.hf_rollout.HookedHFServerAdapter"
VLLM_ADAPTER = "opsd_test_hooks.vllm_rollout.HookedvLLMServerAdapter"


def skip_weight_sync(global_steps) -> bool:
    """Whether the push of ``global_steps`` is dropped (``OPSD_TEST_SKIP_WEIGHT_SYNC=1``, after step 0)."""
    return os.environ.get(SKIP_WEIGHT_SYNC_ENV, "0") == "1" and (global_steps or 0) > 0


def _load_hf_replica():
    from opsd_test_hooks.hf_rollout import HookedHFReplica

    return HookedHFReplica


def install() -> list[str]:
    """Register the hooked rollouts; returns the rollout names it registered."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    installed = []
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        RolloutReplicaRegistry.register("hf", _load_hf_replica)
        _ROLLOUT_REGISTRY[("hf", "async")] = HF_ADAPTER
        installed.append("hf")
    if importlib.util.find_spec("vllm") is not None:
        _ROLLOUT_REGISTRY[("vllm", "async")] = VLLM_ADAPTER
        installed.append("vllm")
    return installed


install()
