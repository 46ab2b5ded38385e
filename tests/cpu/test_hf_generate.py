"""recipe.cpu.hf_generate.sample_batch on the tiny model, against float64 recomputation."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from recipe.cpu.hf_generate import SampleParams, left_pad, sample_batch
from recipe.models.tiny import build_tiny_model

EOS, PAD = [2, 0], 3
PROMPTS = [[1, 40, 41, 42, 43], [1, 50], [1, 60, 61, 62, 63, 64, 65, 66]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()


def reference_logprobs(model, prompt, response, *, temperature, top_k=0):
    """log p(token) of each response token, recomputed unpadded in float64."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=PAD)
    assert ids.tolist() == [[5, 6, 7], [PAD, PAD, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]"):
        left_pad([[1], []], pad_token_id=PAD)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, -1), (0.6, -1), (0.6, 5)])
def test_logprobs_match_the_sampling_distribution(model, temperature, top_k):
    params = SampleParams(max_new_tokens=10, temperature=temperature, top_k=top_k)
    out = sample_batch(model, PROMPTS, params=params, eos_token_ids=EOS, pad_token_id=PAD, seed=11)
    for prompt, response, logprobs in zip(PROMPTS, out.response_ids, out.logprobs):
        assert len(logprobs) == len(response) >= 1
        expected = reference_logprobs(model, prompt, response, temperature=temperature, top_k=max(top_k, 0))
        torch.testing.assert_close(torch.tensor(logprobs, dtype=torch.float64), expected, atol=2e-5, rtol=0)


def output_scores_reference(model, prompts, *, temperature, top_k, top_p, max_new_tokens, seed):
    """The memory-hungry way: keep every step's processed scores ([B, R, V]) and gather at the end."""
    input_ids, attention_mask = left_pad(prompts, pad_token_id=PAD)
    config = GenerationConfig(
        do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens,
        eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None, output_scores=True, return_dict_in_generate=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    new_ids = out.sequences[:, input_ids.shape[1] :]
    scores = torch.stack(out.scores, dim=1).float()
    return new_ids, torch.log_softmax(scores, dim=-1).gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 20, 0.95), (1.1, 5, 0.5)])
def test_step_recorder_equals_output_scores_exactly(model, temperature, top_k, top_p):
    params = SampleParams(max_new_tokens=9, temperature=temperature, top_k=top_k if top_k else -1, top_p=top_p)
    out = sample_batch(model, PROMPTS, params=params, eos_token_ids=EOS, pad_token_id=PAD, seed=3)
    new_ids, logprobs = output_scores_reference(
        model, PROMPTS, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=9, seed=3
    )
    for row, (response, row_logprobs) in enumerate(zip(out.response_ids, out.logprobs)):
        assert response == new_ids[row, : len(response)].tolist()
        assert torch.equal(torch.tensor(row_logprobs), logprobs[row, : len(response)])


def test_model_level_min_p_is_refused(model):
    model.generation_config.min_p = 0.1
    try:
        with pytest.raises(ValueError, match="min_p"):
            sample_batch(model, PROMPTS, params=SampleParams(max_new_tokens=2), eos_token_ids=EOS, pad_token_id=PAD)
    finally:
        model.generation_config.min_p = None


@pytest.mark.slow
def test_same_seed_same_batch_and_different_seed_differs(model):
    params = SampleParams(max_new_tokens=12, temperature=1.0)
    first = sample_batch(model, PROMPTS, params=params, eos_token_ids=EOS, pad_token_id=PAD, seed=5)
    again = sample_batch(model, PROMPTS, params=params, eos_token_ids=EOS, pad_token_id=PAD, seed=5)
    other = sample_batch(model, PROMPTS, params=params, eos_token_ids=EOS, pad_token_id=PAD, seed=6)
    assert first.response_ids == again.response_ids and first.logprobs == again.logprobs
    assert first.response_ids != other.response_ids
    state = torch.get_rng_state()
    sample_batch(model, PROMPTS, params=params, eos_token_ids=EOS, pad_token_id=PAD, seed=5)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is left untouched


def test_max_new_tokens_and_eos(model):
    out = sample_batch(
        model, PROMPTS * 4, params=SampleParams(max_new_tokens=6), eos_token_ids=EOS, pad_token_id=PAD, seed=0
    )
    for response, reason in zip(out.response_ids, out.finish_reasons):
        assert 1 <= len(response) <= 6
        if reason == "stop":
            assert response[-1] in EOS and not set(response[:-1]) & set(EOS)
        else:
            assert len(response) == 6 and not set(response) & set(EOS)
    # Make one token an end-of-sequence id: greedy decoding must stop right at its first occurrence.
    greedy = sample_batch(
        model, PROMPTS, params=SampleParams(max_new_tokens=8, temperature=0), eos_token_ids=EOS, pad_token_id=PAD
    )
    stop_id = greedy.response_ids[0][2]
    stopped = sample_batch(
        model, PROMPTS, params=SampleParams(max_new_tokens=8, temperature=0), eos_token_ids=[stop_id], pad_token_id=PAD
    )
    first = greedy.response_ids[0].index(stop_id)
    assert stopped.response_ids[0] == greedy.response_ids[0][: first + 1]
    assert stopped.finish_reasons[0] == "stop"
    # ignore_eos (vLLM's): the same greedy decoding runs through that token to the cap
    through = sample_batch(model, PROMPTS, params=SampleParams(max_new_tokens=8, temperature=0, ignore_eos=True),
                           eos_token_ids=[stop_id], pad_token_id=PAD)
    assert through.response_ids[0] == greedy.response_ids[0] and len(through.response_ids[0]) == 8
    assert set(through.finish_reasons) == {"length"}
    # ... also when that token is the model's own end of sequence (its generation config), which transformers
    # would otherwise stop on
    own_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = stop_id
    try:
        through = sample_batch(model, PROMPTS, params=SampleParams(max_new_tokens=8, temperature=0, ignore_eos=True),
                               eos_token_ids=[stop_id], pad_token_id=PAD)
    finally:
        model.generation_config.eos_token_id = own_eos
    assert through.response_ids[0] == greedy.response_ids[0] and set(through.finish_reasons) == {"length"}


def test_sample_params_validation():
    with pytest.raises(ValueError, match="max_new_tokens"):
        SampleParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SampleParams(max_new_tokens=1, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SampleParams(max_new_tokens=1, temperature=-1.0)
