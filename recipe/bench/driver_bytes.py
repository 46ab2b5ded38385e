"""Benchmark probe: bytes the trainer process sends to and receives from verl's worker groups.

Not part of the recipe: a verl external module. Loaded into every verl process of a launch with::

    VERL_USE_EXTERNAL_MODULES=recipe.bench.driver_bytes OPSD_DRIVER_BYTES_LOG=bytes.jsonl \\
        bash recipe/opsd/run_opsd.sh ...          # the launcher puts it after its own modules
    python scripts/bench.py driver-bytes bytes.jsonl      # bytes per update step, by call

(``recipe.bench.teacher_transport`` loads a copy as the top-level module ``driver_bytes_probe``, for
checkouts of other revisions.) It depends on nothing of the project. It wraps
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


def bytes_per_step(calls: list[dict], *, methods=None) -> dict[str, float]:
    """Bytes per update step, each direction, in total and per method (``<method>/to``, ``<method>/from``).

    ``calls``: the probe's records (``method``, ``to_workers``, ``from_workers``: null for a non-blocking
    call, counted as 0); ``methods``: the method-name suffixes counted (None: every method, by full name).
    Steps are counted by the ``update_actor`` calls.
    """
    updates = sum(c["method"].endswith("update_actor") for c in calls)
    if updates == 0:
        raise ValueError("no update_actor call in the probe's log: did the run reach its first update?")
    per_method: dict[str, list[float]] = {}
    for call in calls:
        if methods is None:
            name = call["method"]
        else:
            name = next((m for m in methods if call["method"].endswith(m)), None)
        if name is not None:
            sent = per_method.setdefault(name, [0.0, 0.0])
            sent[0] += call["to_workers"]
            sent[1] += call["from_workers"] or 0
    result = {"to": sum(v[0] for v in per_method.values()) / updates,
              "from": sum(v[1] for v in per_method.values()) / updates}
    for name, (to, back) in per_method.items():
        result[f"{name}/to"] = to / updates
        result[f"{name}/from"] = back / updates
    return result


def main(argv: list[str] | None = None) -> int:
    """``bench.py driver-bytes LOG...``: a table of bytes per update step by worker-group call."""
    import argparse

    from recipe.common import cli

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", help="probe logs ($OPSD_DRIVER_BYTES_LOG of a launch)")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    print("| log | call | driver -> workers bytes / step | workers -> driver bytes / step |")
    print("|---|---|---|---|")
    for log in args.logs:
        calls = [record for _, record in cli.iter_jsonl(log, what="probe log")]
        with cli.reraise_as_input(ValueError, file=log):
            result = bytes_per_step(calls)
        names = sorted(key[: -len("/to")] for key in result if key.endswith("/to"))
        for name in names:
            print(f"| {log} | {name} | {result[name + '/to']:,.0f} | {result[name + '/from']:,.0f} |")
        print(f"| {log} | all | {result['to']:,.0f} | {result['from']:,.0f} |")
    return 0


_install()
