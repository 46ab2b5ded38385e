"""Benchmark probe: bytes the trainer process sends to and receives from verl's worker groups.

Not part of the recipe. ``scripts/bench_teacher_transport.py`` loads it into every verl process
through verl's external-module hook (``VERL_USE_EXTERNAL_MODULES=driver_bytes_probe`` with ``scripts/``
on ``PYTHONPATH``; the launcher puts it after the CPU plugin). It wraps
``verl.single_controller.ray.base.func_generator``, which binds every worker-group method, and
appends one JSON line per call to ``$OPSD_DRIVER_BYTES_LOG``::

    {"method": "actor_rollout_ref_update_actor", "to_workers": 123, "from_workers": 45}

(``from_workers`` is null for non-blocking methods, whose results the caller resolves later.)

Bytes are the tensor payloads (nested tensors: values + offsets; numpy arrays) of the arguments
the trainer passes (counted before verl's dispatch splits them and puts them in Ray's object store)
and of the collected results -- what crosses Ray between the trainer and the workers.
Generation requests (the agent loop's HTTP calls) are not worker-group calls and are not counted.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

LOG_ENV = "OPSD_DRIVER_BYTES_LOG"


def payload_bytes(obj) -> int:
    """Tensor / array bytes inside ``obj`` (TensorDict, DataProto, containers; other objects: 0)."""
    from tensordict import TensorDictBase

    from verl import DataProto

    if isinstance(obj, torch.Tensor):
        if obj.is_nested:
            return payload_bytes(obj.values()) + payload_bytes(obj.offsets())
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes) if obj.dtype != object else sum(payload_bytes(x) for x in obj.ravel())
    if isinstance(obj, TensorDictBase):
        return sum(payload_bytes(v) for _, v in obj.items(include_nested=True, leaves_only=True))
    if isinstance(obj, DataProto):
        return payload_bytes(obj.batch) + sum(payload_bytes(v) for v in obj.non_tensor_batch.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(payload_bytes(x) for x in obj.values())
    return 0


def _install() -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    from verl.single_controller.ray import base

    original = base.func_generator
    if getattr(original, "_driver_bytes_probe", False):
        return

    def counting_func_generator(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking):
        sent = {}

        def dispatch(worker_group, *args, **kwargs):
            # the caller's arguments, before verl splits them per rank and puts them in Ray's object store
            sent["bytes"] = payload_bytes(list(args)) + payload_bytes(kwargs)
            return dispatch_fn(worker_group, *args, **kwargs)

        def collect(worker_group, output):
            # non-blocking methods hand back object refs (resolved later by the caller): not counted
            received = payload_bytes(output) if blocking else None
            with open(path, "a") as handle:
                handle.write(json.dumps({"method": method_name, "to_workers": sent.pop("bytes", 0),
                                         "from_workers": received}) + "\n")
            return collect_fn(worker_group, output)

        return original(self, method_name, dispatch, collect, execute_fn, blocking)

    counting_func_generator._driver_bytes_probe = True
    base.func_generator = counting_func_generator


_install()
