"""The trainer's task-reward step (``RayOPSDTrainer._add_task_advantages``) on a hand-made batch:
the one grader's reward per response, the GRPO advantage within each prompt's group (verl's uid)."""

import numpy as np
import pytest
import torch
from verl import DataProto

from recipe.models.tiny import build_char_tokenizer
from recipe.opsd.actor_loss import TASK_ADVANTAGES_KEY
from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer
from recipe.opsd.worker import RESPONSE_LENGTHS_KEY


class _Trainer:
    tokenizer = build_char_tokenizer()
    _add_task_advantages = RayOPSDTrainer._add_task_advantages


def _batch(texts, truths, uids, *, reward_model=True):
    tok = _Trainer.tokenizer
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids)) + 2
    responses = torch.full((len(ids), width), tok.pad_token_id, dtype=torch.long)
    for row, seq in enumerate(ids):
        responses[row, : len(seq)] = torch.tensor(seq)
    non_tensors = {"uid": np.array(uids, dtype=object)}
    if reward_model:
        non_tensors["reward_model"] = np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object)
    return DataProto.from_dict(
        tensors={"responses": responses, RESPONSE_LENGTHS_KEY: torch.tensor([len(s) for s in ids])},
        non_tensors=non_tensors,
    )


def test_rewards_and_group_advantages_by_hand():
    # prompt a: 2 of 3 correct (the Answer: line counts in reward mode); prompt b: one correct of 2; the
    # padding after each response (not decoded) must not change the grade
    batch = _batch(["so \\boxed{5}", "so \\boxed{4}", "Answer: 5", "\\boxed{8}", "no answer"],
                   ["5", "5", "5", "8", "8"], ["a", "a", "a", "b", "b"])
    metrics = _Trainer()._add_task_advantages(batch)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    # group a: mean 2/3, unbiased std sqrt(1/3); group b: mean 1/2, std sqrt(1/2)
    std_a, std_b = (1 / 3) ** 0.5, 0.5 ** 0.5
    expected = torch.tensor([(1 - 2 / 3) / (std_a + 1e-6), (0 - 2 / 3) / (std_a + 1e-6), (1 - 2 / 3) / (std_a + 1e-6),
                             0.5 / (std_b + 1e-6), -0.5 / (std_b + 1e-6)])
    torch.testing.assert_close(batch.batch[TASK_ADVANTAGES_KEY], expected, rtol=1e-6, atol=1e-6)
    assert metrics["opsd/task_reward"] == pytest.approx(float(rewards.mean()))
    assert metrics["opsd/task_advantage_abs"] == pytest.approx(float(expected.abs().mean()), rel=1e-6)


def test_a_data_set_without_ground_truth_is_named():
    batch = _batch(["\\boxed{5}", "\\boxed{4}"], ["5", "5"], ["a", "a"], reward_model=False)
    with pytest.raises(ValueError, match="reward_model.ground_truth"):
        _Trainer()._add_task_advantages(batch)
