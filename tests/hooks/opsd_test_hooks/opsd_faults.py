"""Faults of the OPSD trainer (tests/e2e/test_opsd_faults_e2e.py); inert unless its settings are set.

Settings, read at call time:

- ``OPSD_TEST_NAN_TEACHER_STEPS``: comma-separated global steps whose teacher hidden states are
  multiplied by NaN on the workers (the trainer marks the step's actor batch, the worker poisons
  its teacher forward): the non-finite guard's input;
- ``OPSD_TEST_PAUSE_IN_SAVE_STEP``: at that step's checkpoint, print ``PAUSE_MARKER`` and sleep after
  the model shards are written and before verl's ``data.pt`` and ``latest_checkpointed_iteration.txt``,
  so that a test can kill the run inside a save.
"""

from __future__ import annotations

import os
import time

from opsd_test_hooks import when_imported

NAN_TEACHER_ENV = "OPSD_TEST_NAN_TEACHER_STEPS"
PAUSE_IN_SAVE_ENV = "OPSD_TEST_PAUSE_IN_SAVE_STEP"
PAUSE_MARKER = "[opsd] TEST: model shards saved; pausing before data.pt and the tracker"
# the actor batch's non-tensor flag of a poisoned step
NAN_TEACHER_KEY = "opsd_test_nan_teacher"


def nan_teacher_steps(environ=os.environ) -> frozenset[int]:
    text = environ.get(NAN_TEACHER_ENV, "").strip()
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{NAN_TEACHER_ENV} must be comma-separated step numbers, got {text!r}") from None


def _patch_trainer(module) -> None:
    cls = module.RayOPSDTrainer
    update, save = cls._update_opsd_actor, cls._save_checkpoint

    def _update_opsd_actor(self, batch, *, timing_raw, **non_tensors):
        if self.global_steps in nan_teacher_steps():
            non_tensors[NAN_TEACHER_KEY] = True
        return update(self, batch, timing_raw=timing_raw, **non_tensors)

    def _save_checkpoint(self):
        if os.environ.get(PAUSE_IN_SAVE_ENV) != str(self.global_steps):
            return save(self)
        save_shards = self.actor_rollout_wg.save_checkpoint

        def save_then_hang(*args, **kwargs):
            result = save_shards(*args, **kwargs)
            print(f"{PAUSE_MARKER} (step {self.global_steps})", flush=True)
            time.sleep(3600)
            return result

        self.actor_rollout_wg.save_checkpoint = save_then_hang
        try:
            return save(self)
        finally:
            self.actor_rollout_wg.save_checkpoint = save_shards

    cls._update_opsd_actor, cls._save_checkpoint = _update_opsd_actor, _save_checkpoint


def _patch_worker(module) -> None:
    from verl.utils import tensordict_utils as tu

    cls = module.OPSDActorRolloutRefWorker
    add = cls._add_teacher_outputs

    def _add_teacher_outputs(self, data):
        add(self, data)
        if tu.get_non_tensor_data(data=data, key=NAN_TEACHER_KEY, default=False):
            data["teacher_hidden"] = data["teacher_hidden"] * float("nan")

    cls._add_teacher_outputs = _add_teacher_outputs


when_imported("recipe.opsd.opsd_ray_trainer", _patch_trainer)
when_imported("recipe.opsd.worker", _patch_worker)
