"""verl custom reward function: dict fields and types verl aggregates."""

import inspect

import numpy as np

from recipe.common.reward import compute_score


def test_compute_score_correct_boxed():
    out = compute_score("aime2024", "so \\boxed{025}", "25", extra_info={"index": 0})
    assert out == {"score": 1.0, "acc": 1.0, "pred": "025", "has_boxed": 1.0}


def test_compute_score_answer_fallback_and_wrong():
    assert compute_score("dapo", "Answer: 7", "7") == {"score": 1.0, "acc": 1.0, "pred": "7", "has_boxed": 0.0}
    assert compute_score("dapo", "\\boxed{8}", "7") == {"score": 0.0, "acc": 0.0, "pred": "8", "has_boxed": 1.0}


def test_compute_score_no_answer_has_string_pred():
    out = compute_score("dapo", "I give up", "7")
    assert out == {"score": 0.0, "acc": 0.0, "pred": "", "has_boxed": 0.0}


def test_verl_call_convention_and_extra_kwargs():
    # verl's naive reward manager calls with keywords and may add reward_router_address etc.
    out = compute_score(
        data_source="x", solution_str="\\boxed{\\sqrt{8}}", ground_truth="2\\sqrt{2}", extra_info={},
        reward_router_address=None, timeout_s=5.0,
    )
    assert out["score"] == 1.0
    assert list(inspect.signature(compute_score).parameters)[:4] == [
        "data_source", "solution_str", "ground_truth", "extra_info"
    ]


def test_batch_of_results_stacks_like_verl_reward_loop():
    # verl stacks each key with np.array over the batch and averages numeric ones
    outs = [compute_score("s", r, "3") for r in ["\\boxed{3}", "nothing", "Answer: 4"]]
    assert np.array([o["acc"] for o in outs]).mean() == 1 / 3
    assert np.array([o["has_boxed"] for o in outs]).mean() == 1 / 3
    assert np.array([o["pred"] for o in outs]).dtype.kind == "U"


def test_loads_through_verl_custom_reward_function_path():
    from pathlib import Path

    from verl.utils.import_utils import load_extern_object

    path = Path(__file__).resolve().parents[2] / "recipe" / "common" / "reward.py"
    loaded = load_extern_object(module_path=str(path), object_name="compute_score")
    assert loaded("aime", "\\boxed{5}", "5") == {"score": 1.0, "acc": 1.0, "pred": "5", "has_boxed": 1.0}


def test_reward_uses_the_reward_mode():
    # boxed first, then the Answer: line; \fbox and `\boxed 5` are not boxed answers in either mode
    assert compute_score("dapo", "\\boxed{7}\nAnswer: 8", "7")["score"] == 1.0
    assert compute_score("dapo", "\\fbox{7}", "7") == {"score": 0.0, "acc": 0.0, "pred": "", "has_boxed": 0.0}
    assert compute_score("dapo", "\\boxed 7\nAnswer: 7", "7") == {"score": 1.0, "acc": 1.0, "pred": "7", "has_boxed": 0.0}
