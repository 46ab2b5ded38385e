"""The non-finite guard's decision logic (recipe.opsd.core.nonfinite), and the engine's loss skip on a fake engine
(recipe.opsd.engine)."""

import json
import math

import pytest
import torch

from recipe.opsd.core.nonfinite import CONSECUTIVE_METRIC, SKIPPED_METRIC, NonFiniteGuard
from recipe.opsd.engine import SkipNonFiniteLossMixin

NAN, INF = float("nan"), float("inf")


def _feed(guard, steps):
    return [guard.update(step=step, loss=loss, grad_norm=grad) for step, (loss, grad) in enumerate(steps, start=1)]


def test_finite_steps_are_not_counted():
    guard = NonFiniteGuard(max_consecutive=2)
    out = _feed(guard, [(0.5, 1.0), (0.4, 0.9)])
    assert out == [{SKIPPED_METRIC: 0.0, CONSECUTIVE_METRIC: 0.0}] * 2
    assert (guard.skipped_total, guard.last_good_step, guard.should_stop) == (0, 2, False)


@pytest.mark.parametrize("loss, grad", [(NAN, 1.0), (0.5, NAN), (INF, 1.0), (0.5, -INF), (None, 1.0), (0.5, None)])
def test_a_nonfinite_loss_or_gradient_norm_is_a_skipped_step(loss, grad):
    guard = NonFiniteGuard(max_consecutive=3)
    assert guard.update(step=1, loss=loss, grad_norm=grad) == {SKIPPED_METRIC: 1.0, CONSECUTIVE_METRIC: 1.0}
    assert (guard.skipped_total, guard.first_skipped_step, guard.last_good_step) == (1, 1, 0)


def test_stops_after_k_in_a_row_and_a_finite_step_resets_the_count():
    guard = NonFiniteGuard(max_consecutive=2)
    # good, bad, good, bad, bad (stop at 5), then stays stopped
    out = _feed(guard, [(1.0, 1.0), (NAN, NAN), (1.0, 1.0), (NAN, 1.0), (1.0, INF)])
    assert [o[SKIPPED_METRIC] for o in out] == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert [o[CONSECUTIVE_METRIC] for o in out] == [0.0, 1.0, 0.0, 1.0, 2.0]
    assert guard.should_stop and guard.stop_step == 5 and guard.skipped_total == 3
    assert guard.stop_message() == (
        "step 5: 2 consecutive steps with a non-finite loss or gradient norm (steps 4-5, updates skipped; "
        "opsd.diagnostics.max_consecutive_nonfinite=2); the checkpoint global_step_5 holds the weights of step 3"
    )


def test_k_1_stops_at_the_first_and_names_the_initial_model():
    guard = NonFiniteGuard(max_consecutive=1)
    guard.update(step=1, loss=NAN, grad_norm=NAN)
    assert guard.should_stop and guard.stop_step == 1
    assert guard.stop_message().endswith("holds the weights of the initial model (no step was applied)")


def test_state_round_trips_through_json_and_a_resumed_stop_gets_one_more_try():
    guard = NonFiniteGuard(max_consecutive=2)
    _feed(guard, [(1.0, 1.0), (NAN, 1.0), (NAN, 1.0)])
    assert guard.should_stop
    resumed = NonFiniteGuard(max_consecutive=2)
    resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert (resumed.skipped_total, resumed.consecutive, resumed.last_good_step) == (2, 2, 1)
    assert not resumed.should_stop
    assert resumed.update(step=4, loss=NAN, grad_norm=1.0)[CONSECUTIVE_METRIC] == 3.0 and resumed.stop_step == 4
    again = NonFiniteGuard(max_consecutive=2)
    again.load_state_dict(guard.state_dict())
    again.update(step=4, loss=1.0, grad_norm=1.0)
    assert (again.consecutive, again.skipped_total, again.should_stop) == (0, 2, False)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2"])
def test_max_consecutive_is_validated(k):
    with pytest.raises(ValueError, match="max_consecutive must be an integer >= 1"):
        NonFiniteGuard(max_consecutive=k)


class _FakeEngine:
    """verl's engine contract as the mixin sees it: per-micro-batch losses, and an optimizer step
    that (like verl's) skips only on a non-finite gradient norm."""

    def __init__(self, losses, grad):
        self.param = torch.nn.Parameter(torch.ones(2))
        self.optimizer = torch.optim.SGD([self.param], lr=1.0)
        self.losses, self.grad = losses, grad

    def get_data_parallel_group(self):
        return None

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        self.param.grad = torch.full((2,), self.grad)
        return {"loss": list(self.losses), "metrics": {}, "model_output": {}}

    def optimizer_step(self):
        norm = torch.linalg.vector_norm(self.param.grad)
        if torch.isfinite(norm):
            self.optimizer.step()
        else:
            self.optimizer.zero_grad()
        return norm.item()


class _Guarded(SkipNonFiniteLossMixin, _FakeEngine):
    pass


@pytest.mark.parametrize("losses, grad, stepped", [
    ([0.5, 0.25], 1.0, True),
    ([0.5, NAN], 1.0, False),   # a non-finite loss with finite gradients: verl alone would step
    ([INF], 1.0, False),
    ([0.5], NAN, False),        # verl's own skip still applies
])
def test_engine_skips_the_update_on_a_nonfinite_loss(monkeypatch, losses, grad, stepped):
    monkeypatch.setattr("recipe.opsd.engine._device_of", lambda engine: "cpu")
    engine = _Guarded(losses, grad)
    engine.forward_backward_batch(None, None)
    grad_norm = engine.optimizer_step()
    assert torch.equal(engine.param.detach(), torch.zeros(2) if stepped else torch.ones(2))
    assert math.isfinite(grad_norm) == stepped
    # the flag is per update: the next finite mini-batch steps
    engine.losses, engine.grad = [0.5], 1.0
    engine.forward_backward_batch(None, None)
    assert math.isfinite(engine.optimizer_step())


def test_forward_only_batches_do_not_touch_the_flag(monkeypatch):
    monkeypatch.setattr("recipe.opsd.engine._device_of", lambda engine: "cpu")
    engine = _Guarded([NAN], 1.0)
    engine.forward_backward_batch(None, None, forward_only=True)
    assert engine._skip_nonfinite_update is False
