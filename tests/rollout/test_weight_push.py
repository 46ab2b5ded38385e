"""recipe.rollout.weight_push without vLLM: the guarded socket and the timeout setting."""

import time

import pytest
import zmq

from recipe.rollout import weight_push as shims


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv(shims.WEIGHT_SYNC_TIMEOUT_ENV, raising=False)
    assert shims.weight_sync_timeout_s() == shims.DEFAULT_WEIGHT_SYNC_TIMEOUT_S == 900.0
    monkeypatch.setenv(shims.WEIGHT_SYNC_TIMEOUT_ENV, "2.5")
    assert shims.weight_sync_timeout_s() == 2.5
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(shims.WEIGHT_SYNC_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=shims.WEIGHT_SYNC_TIMEOUT_ENV):
            shims.weight_sync_timeout_s()


@pytest.fixture
def req_socket(tmp_path):
    """A bound REQ socket (as verl's BucketedWeightSender makes) and its endpoint; no peer yet."""
    context = zmq.Context()
    socket = context.socket(zmq.REQ)
    endpoint = f"ipc://{tmp_path}/push.sock"
    socket.bind(endpoint)
    yield socket, endpoint, context
    socket.close(linger=0)
    context.term()


def test_send_without_receiver_times_out(req_socket, monkeypatch):
    socket, endpoint, _ = req_socket
    monkeypatch.setattr(shims, "POLL_SLICE_MS", 50)
    guarded = shims.GuardedSocket(socket, label=endpoint, timeout_s=0.3, check_receiver=lambda: None)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no connection from the receiver"):
        guarded.send_pyobj({"name": "buffer"})
    assert 0.3 <= time.monotonic() - start < 3.0


def test_missing_ack_raises_the_receivers_error_at_once(req_socket, monkeypatch):
    socket, endpoint, context = req_socket
    monkeypatch.setattr(shims, "POLL_SLICE_MS", 50)
    receiver = context.socket(zmq.REP)
    receiver.connect(endpoint)
    calls = []

    def receiver_died():
        calls.append(1)
        if len(calls) >= 2:
            raise shims.WeightReceiverFailed("receiver raised AttributeError")

    guarded = shims.GuardedSocket(socket, label=endpoint, timeout_s=60, check_receiver=receiver_died)
    guarded.send_pyobj({"bucket_meta": {}, "is_last": True})
    assert receiver.recv_pyobj() == {"bucket_meta": {}, "is_last": True}  # received, never acknowledged
    start = time.monotonic()
    with pytest.raises(shims.WeightReceiverFailed, match="AttributeError"):
        guarded.recv()
    assert time.monotonic() - start < 5.0
    receiver.close(linger=0)


def test_acknowledged_exchange_passes_through(req_socket):
    socket, endpoint, context = req_socket
    receiver = context.socket(zmq.REP)
    receiver.connect(endpoint)
    guarded = shims.GuardedSocket(socket, label=endpoint, timeout_s=5, check_receiver=lambda: None)
    guarded.send_pyobj({"is_last": True})
    receiver.recv_pyobj()
    receiver.send(b"")
    assert guarded.recv() == b""
    assert guarded.getsockopt(zmq.TYPE) == zmq.REQ  # other attributes reach the socket
    receiver.close(linger=0)


def test_check_receiver_without_a_tracked_push_is_silent():
    shims.check_receiver("ipc:///nonexistent-handle")
