"""A weight push to the rollout server that cannot hang: bounded, liveness-checked ZMQ waits.

verl 0.9.1's ``BucketedWeightSender`` (``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:103-190``)
waits for each bucket's acknowledgement with a blocking ZMQ ``recv()`` (its first ``send_pyobj`` on the
REQ socket until a receiver connects), so a receiver that raised or died hangs the trainer
(docs/vllm_cpu.md#the-guarded-weight-push). ``GuardedSocket`` waits in ``POLL_SLICE_MS`` slices and
raises the receiver's own error (``WeightReceiverFailed``: ``track_receiver`` / ``check_receiver``) or,
after ``OPSD_WEIGHT_SYNC_TIMEOUT_S`` (default 900 s) without the awaited event, a ``TimeoutError``.
Used by ``recipe.rollout.vllm_adapter``; no verl / vLLM import (zmq and ray are imported where used).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

WEIGHT_SYNC_TIMEOUT_ENV = "OPSD_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_WEIGHT_SYNC_TIMEOUT_S = 900.0
POLL_SLICE_MS = 1000

# zmq handle -> the receiver's collective_rpc ObjectRef of the push in flight (trainer process).
_RECEIVER_FUTURES: dict[str, object] = {}


class WeightReceiverFailed(RuntimeError):
    """The rollout side of a weight push died or raised; the trainer stops instead of waiting."""


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


def track_receiver(zmq_handle: str, future) -> None:
    """Register the receiver's Ray future of the push that is about to go through ``zmq_handle``."""
    _RECEIVER_FUTURES[zmq_handle] = future


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
