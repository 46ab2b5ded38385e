"""The project's subclasses of verl's Ray-decorated async classes survive Ray's pickling of their methods.

Ray turns a class into an actor by wrapping every method, inherited ones included, and pickling the
wrappers by value. A method of a verl class that verl decorated with ``@ray.remote`` cannot be pickled by
reference (its module attribute is the ActorClass), so its copy's zero-argument ``super()`` names a copy
of verl's class and fails on the project's instance. Each such method is overridden in the project's
subclass (``recipe/async_rl/trainers.py``), whose own methods are pickled by reference.
"""

from __future__ import annotations

import inspect

import pytest

from recipe.async_rl import trainers
from recipe.opsd import opsd_async_trainers

VERL_BASES = (trainers.FullyAsyncTrainerBase, trainers.FullyAsyncRollouterBase, trainers.FullyAsyncTaskRunnerBase)
PROJECT_ACTOR_CLASSES = (trainers.VersionedFullyAsyncTrainer, trainers.InputsKeepingRollouter, trainers.AsyncTaskRunner,
                         opsd_async_trainers.OPSDFullyAsyncTrainer, opsd_async_trainers.OPSDAsyncTaskRunner)


def _uses_zero_argument_super(function) -> bool:
    function = inspect.unwrap(function)
    return "__class__" in getattr(getattr(function, "__code__", None), "co_freevars", ())


def unsafe_inherited_methods(cls: type) -> list[str]:
    """Methods ``cls`` takes unchanged from a verl decorated class that call zero-argument ``super()``."""
    unsafe = []
    for name in dir(cls):
        owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
        if owner in VERL_BASES and _uses_zero_argument_super(vars(owner)[name]):
            unsafe.append(f"{owner.__name__}.{name}")
    return unsafe


@pytest.mark.parametrize("cls", PROJECT_ACTOR_CLASSES, ids=lambda cls: cls.__name__)
def test_no_inherited_verl_method_calls_zero_argument_super(cls):
    assert unsafe_inherited_methods(cls) == []


def test_the_check_sees_verls_methods():
    assert unsafe_inherited_methods(type("Plain", (trainers.FullyAsyncTrainerBase,), {})) == [
        "FullyAsyncTrainer._compute_old_log_prob"]


@pytest.mark.slow
def test_verls_old_log_prob_runs_inside_a_ray_actor():
    ray = pytest.importorskip("ray")

    class Stub:
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    class OldLogProbProbe(trainers.VersionedFullyAsyncTrainer):
        """Just enough state for verl's ``_compute_old_log_prob`` to reach its ``super()`` call."""

        def __init__(self):
            self.local_trigger_step = 1
            self.actor_rollout_wg = Stub()

        def call(self) -> str:
            try:
                self._compute_old_log_prob(None)
            except Exception as err:  # past the super() call, RayPPOTrainer's method fails on the stub batch
                return f"{type(err).__name__}: {err}"[:200]
            return "returned"

    ray.init(num_cpus=1, include_dashboard=False)
    try:
        outcome = ray.get(ray.remote(num_cpus=0)(OldLogProbProbe).remote().call.remote())
    finally:
        ray.shutdown()
    assert "super(type, obj)" not in outcome, outcome


@pytest.mark.parametrize("recipe", ["opsd", "grpo"])
def test_the_learning_rate_schedule_gets_the_step_count_before_the_workers_are_built(recipe):
    """verl's fully-async main gives the trainer its step count after the workers built their schedulers (with
    -1: a constant peak learning rate); the task runner sets it first, as the synchronous trainer does."""
    from tests.async_rl.test_config import _compose

    config = _compose(recipe, "+experiment=async_fully", "trainer.total_training_steps=37")
    assert config.actor_rollout_ref.actor.optim.total_training_steps == -1  # what verl would build the workers with
    trainers.set_schedule_length(config)
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 37
