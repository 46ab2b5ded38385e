"""Non-finite loss or gradient: skip the update, count it, stop after K in a row.

verl 0.9.1 skips the optimizer step on a non-finite gradient norm; ``recipe.opsd.engine.SkipNonFiniteLossMixin``
adds the loss; ``NonFiniteGuard`` (pure, driven by the trainer once per step) counts the skipped steps and asks
to stop after ``max_consecutive`` in a row (who does what, and what verl leaves out: ``NonFiniteGuard``). A
skipped step leaves the weights and optimizer moments as they were, so the checkpoint saved at the stop holds
the last finite step's weights. What a user sees: docs/errors_and_outputs.md, "Non-finite loss or gradient".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the skipped-step metrics (per step): 1 if this step's update was skipped; consecutive skipped steps
SKIPPED_METRIC = "opsd/nonfinite_skipped"
CONSECUTIVE_METRIC = "opsd/nonfinite_consecutive"
# the guard's counts, saved next to verl's data.pt in every global_step_<s>/ folder
STATE_FILE = "opsd_nonfinite.json"


class NonFiniteTrainingError(RuntimeError):
    """Raised by the trainer after the guard stopped the run (its checkpoint is saved first)."""


def is_finite_number(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@dataclass
class NonFiniteGuard:
    """Counts steps whose update was skipped for a non-finite loss or gradient norm.

    ``update(step=, loss=, grad_norm=)`` once per step, in order (the trainer's ``actor/loss`` and
    ``actor/grad_norm``); ``should_stop`` after ``max_consecutive`` skipped steps in a row. A missing value
    (None) counts as non-finite: the step cannot be shown to have trained.

    Who does what:

    - verl 0.9.1 already skips the optimizer step when the gradient norm is not finite
      (``FSDPEngine.optimizer_step``, verl/workers/engine/fsdp/transformer_impl.py: it prints
      ``WARN: grad_norm is not finite``, zeroes the gradients and does not call ``optimizer.step()``;
      with a grad scaler, ``scaler.step`` skips). It does NOT look at the loss, it does not count, it
      never stops, and its learning-rate scheduler still advances.
    - ``recipe.opsd.engine.SkipNonFiniteLossMixin`` (mixed into the actor's engine by
      ``engine.opsd_engine_class``) adds the loss: when a mini-batch's loss is not finite on any dp rank,
      the update is skipped the same way even if the gradients happen to be finite, and ``grad_norm`` is
      reported as NaN.
    - this guard counts skipped steps and asks to stop.
    """

    max_consecutive: int
    skipped_total: int = 0
    consecutive: int = 0
    # first step of the current run of skipped steps; last step whose update was applied (0: none yet)
    first_skipped_step: int | None = None
    last_good_step: int = 0
    stop_step: int | None = None

    def __post_init__(self):
        k = self.max_consecutive
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"max_consecutive must be an integer >= 1, got {k!r}")

    def update(self, *, step: int, loss, grad_norm) -> dict[str, float]:
        """Record one step; return its ``opsd/nonfinite_*`` metrics."""
        skipped = not (is_finite_number(loss) and is_finite_number(grad_norm))
        if skipped:
            self.skipped_total += 1
            self.consecutive += 1
            if self.consecutive == 1:
                self.first_skipped_step = step
            if self.consecutive >= self.max_consecutive and self.stop_step is None:
                self.stop_step = step
        else:
            self.consecutive = 0
            self.first_skipped_step = None
            self.last_good_step = step
        return {SKIPPED_METRIC: float(skipped), CONSECUTIVE_METRIC: float(self.consecutive)}

    @property
    def should_stop(self) -> bool:
        return self.stop_step is not None

    def stop_message(self) -> str:
        last_good = f"step {self.last_good_step}" if self.last_good_step else "the initial model (no step was applied)"
        return (
            f"step {self.stop_step}: {self.consecutive} consecutive steps with a non-finite loss or gradient norm "
            f"(steps {self.first_skipped_step}-{self.stop_step}, updates skipped; opsd.diagnostics.max_consecutive_nonfinite="
            f"{self.max_consecutive}); the checkpoint global_step_{self.stop_step} holds the weights of {last_good}"
        )

    def state_dict(self) -> dict:
        return {
            "skipped_total": self.skipped_total, "consecutive": self.consecutive,
            "first_skipped_step": self.first_skipped_step, "last_good_step": self.last_good_step,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the counts of a checkpoint. A run stopped by the guard and resumed gets one more
        try: its next non-finite step stops it again, a finite one resets the count."""
        self.skipped_total = int(state["skipped_total"])
        self.consecutive = int(state["consecutive"])
        self.first_skipped_step = state["first_skipped_step"]
        self.last_good_step = int(state["last_good_step"])
        self.stop_step = None
