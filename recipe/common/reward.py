"""verl custom reward function backed by the one grader in its reward mode.

``compute_score`` grades with ``grade(..., mode="reward")``: the final balanced ``\\boxed{}`` answer, else
the ``Answer:`` line (the paper's GRPO reward); evaluation uses ``mode="evaluation"``. In a verl config::

    reward.custom_reward_function.path=<repo>/recipe/common/reward.py
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

from recipe.common.grader import DEFAULT_TIMEOUT_S, REWARD, grade


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info: dict | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **kwargs,
) -> dict:
    """Grade one decoded response: ``{"score", "acc", "pred", "has_boxed"}``.

    ``data_source`` and ``extra_info`` are accepted for verl's signature and not used: every
    source is graded the same way. ``timeout_s`` can be set through
    ``reward.custom_reward_function.reward_kwargs.timeout_s``; other keyword arguments verl
    passes (e.g. ``reward_router_address``) are ignored.

    verl 0.9.1's reward managers (``verl/experimental/reward_loop/reward_manager/naive.py``) call this on the
    response decoded with ``skip_special_tokens=True``; ``score`` is the reward, every key becomes
    ``reward_extra_info`` (stacked with ``np.array`` across the batch, so every call returns the same keys) and
    numeric keys are averaged into the validation metrics (``val-core/<data_source>/acc/mean@N``, ...). Hence
    ``acc`` and ``has_boxed`` are floats 0.0/1.0 and ``pred`` is a string, ``""`` when no answer was found
    (verl skips string fields when averaging and uses ``pred`` for majority voting).
    """
    result = grade(solution_str, ground_truth, mode=REWARD, timeout_s=timeout_s)
    return {
        "score": result.score,
        "acc": float(result.acc),
        "pred": result.pred if result.pred is not None else "",
        "has_boxed": float(result.has_boxed),
    }
