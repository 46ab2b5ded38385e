"""recipe.rollout.sync_probe (the weight-sync probe): the pure parts (the Ray/vLLM part runs in tests/e2e/test_vllm_cpu_e2e.py)."""

import math

import pytest
import torch

from recipe.rollout.sync_probe import probe_prompt_ids, response_log_probs, tee_weights


def test_probe_prompt_ids():
    assert probe_prompt_ids(vocab_size=100, length=4) == [11, 18, 25, 32]
    assert probe_prompt_ids(vocab_size=20, length=3) == [11, 18, 5]
    with pytest.raises(ValueError, match="vocab_size"):
        probe_prompt_ids(vocab_size=1)


def test_response_log_probs_by_hand():
    # 3 tokens, prompt of 1: the response tokens are ids[1], ids[2], scored by logits rows 0 and 1.
    logits_TV = torch.tensor([[0.0, math.log(3.0)], [math.log(4.0), 0.0], [5.0, 5.0]])
    token_ids_T = torch.tensor([0, 1, 0])
    got = response_log_probs(logits_TV=logits_TV, token_ids_T=token_ids_T, prompt_length=1)
    # row 0: p = (1/4, 3/4) -> token 1: log 3/4; row 1: p = (4/5, 1/5) -> token 0: log 4/5
    assert got.dtype == torch.float64
    assert torch.allclose(got, torch.tensor([math.log(0.75), math.log(0.8)], dtype=torch.float64), atol=1e-12)


def test_response_log_probs_matches_float64_reference():
    generator = torch.Generator().manual_seed(0)
    logits_TV = torch.randn(7, 11, generator=generator)
    token_ids_T = torch.randint(0, 11, (7,), generator=generator)
    got = response_log_probs(logits_TV=logits_TV, token_ids_T=token_ids_T, prompt_length=3)
    expected = [
        logits_TV[t - 1].double()[token_ids_T[t]] - torch.logsumexp(logits_TV[t - 1].double(), dim=0) for t in range(3, 7)
    ]
    assert torch.allclose(got, torch.stack(expected), atol=1e-12)


def test_response_log_probs_rejects_bad_shapes():
    with pytest.raises(ValueError, match="logits rows"):
        response_log_probs(logits_TV=torch.zeros(3, 4), token_ids_T=torch.zeros(4, dtype=torch.long), prompt_length=1)
    with pytest.raises(ValueError, match="prompt_length"):
        response_log_probs(logits_TV=torch.zeros(3, 4), token_ids_T=torch.zeros(3, dtype=torch.long), prompt_length=3)


def test_tee_weights_passes_through_and_keeps_float32_copies():
    weight = torch.ones(2, dtype=torch.bfloat16)
    store = {}
    out = list(tee_weights(iter([("w", weight)]), store))
    assert out[0][1] is weight
    assert store["w"].dtype == torch.float32 and torch.equal(store["w"], torch.ones(2))
    weight.add_(1)  # the sender reuses its buffers: the copy must not follow
    assert torch.equal(store["w"], torch.ones(2))
