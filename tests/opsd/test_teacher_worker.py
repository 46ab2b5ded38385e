"""Teacher hidden-state capture on the tiny Qwen3: hidden @ W.T reproduces the model's logits.

The OPSD teacher ships final hidden states (``capture_final_hidden``) of the positions that predict
the response tokens (``_response_hidden``), and the actor forms the logits with the frozen lm_head.
Here the frozen float64 tiny model's own logits on [teacher prompt || response] are the reference,
in verl's two layouts: right-padded [b, Lmax] and packed [1, total tokens] (no padding).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recipe.models.tiny import tiny_qwen3_config
from recipe.opsd.core.signals import sampled_token_rank_from_hidden
from recipe.opsd.engine import RESPONSE_LENGTHS_KEY, _response_hidden, capture_final_hidden

VOCAB = 97
PROMPT_LENS = (6, 3, 9)
RESPONSE_LENS = (4, 5, 1)
R = max(RESPONSE_LENS)


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(tiny_qwen3_config(vocab_size=VOCAB)).double().eval()


@pytest.fixture(scope="module")
def sequences():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (p + r,), generator=gen) for p, r in zip(PROMPT_LENS, RESPONSE_LENS)]


def _micro_batch(sequences):
    """The fields _response_hidden reads, as verl's no-padding micro-batch holds them."""
    responses_bR = torch.zeros(len(sequences), R, dtype=torch.long)
    response_mask_bR = torch.zeros(len(sequences), R, dtype=torch.bool)
    for i, (seq, r) in enumerate(zip(sequences, RESPONSE_LENS)):
        responses_bR[i, :r] = seq[-r:]
        response_mask_bR[i, :r] = True
    return {
        "input_ids": torch.nested.nested_tensor_from_jagged(
            torch.cat(sequences), offsets=torch.tensor([0, *torch.tensor([len(s) for s in sequences]).cumsum(0)])
        ),
        RESPONSE_LENGTHS_KEY: torch.tensor(RESPONSE_LENS),
        "response_mask": response_mask_bR,
        "responses": responses_bR,
    }


def _reference_logits(model, sequences):
    """[b, R, V] logits of each sequence's own forward at the positions predicting its response."""
    out = torch.zeros(len(sequences), R, VOCAB, dtype=torch.float64)
    with torch.no_grad():
        for i, (seq, r) in enumerate(zip(sequences, RESPONSE_LENS)):
            logits = model(seq[None]).logits[0]
            out[i, :r] = logits[len(seq) - r - 1: len(seq) - 1]
    return out


def _check(hidden_bRH, model, sequences):
    logits_bRV = F.linear(hidden_bRH, model.lm_head.weight.detach())
    ref = _reference_logits(model, sequences)
    mask = _micro_batch(sequences)["response_mask"]
    torch.testing.assert_close(logits_bRV[mask], ref[mask], rtol=0, atol=1e-12)
    assert torch.all(hidden_bRH[~mask] == 0)  # no token: zero rows, never another sequence's state


def test_padded_layout_reproduces_the_model_logits(model, sequences):
    lmax = max(len(s) for s in sequences)
    input_ids = torch.zeros(len(sequences), lmax, dtype=torch.long)
    attention = torch.zeros(len(sequences), lmax, dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, : len(seq)] = seq
        attention[i, : len(seq)] = 1
    with torch.no_grad(), capture_final_hidden(model) as store:
        full = model(input_ids=input_ids, attention_mask=attention).logits
    assert store["hidden"].shape == (len(sequences), lmax, model.config.hidden_size)
    # the captured state is the lm_head input of the same forward
    torch.testing.assert_close(F.linear(store["hidden"], model.lm_head.weight), full, rtol=0, atol=1e-12)
    hidden_bRH = _response_hidden(store["hidden"], micro_batch=_micro_batch(sequences), packed=False)
    assert hidden_bRH.shape == (len(sequences), R, model.config.hidden_size)
    _check(hidden_bRH, model, sequences)


def test_packed_layout_picks_the_same_rows(model, sequences):
    # packed [1, total, H]: what a varlen (flash-attention) forward returns = each sequence's own states
    with torch.no_grad():
        parts = []
        for seq in sequences:
            with capture_final_hidden(model) as store:
                model(seq[None], logits_to_keep=1)
            parts.append(store["hidden"][0])
    packed = torch.cat(parts)[None]
    hidden_bRH = _response_hidden(packed, micro_batch=_micro_batch(sequences), packed=True)
    _check(hidden_bRH, model, sequences)


def test_capture_with_logits_to_keep_one_still_gives_every_position(model, sequences):
    seq = sequences[0]
    with torch.no_grad(), capture_final_hidden(model) as store:
        out = model(seq[None], logits_to_keep=1)
    assert out.logits.shape[1] == 1  # no [N, V] tensor
    torch.testing.assert_close(F.linear(store["hidden"][0], model.lm_head.weight), model(seq[None]).logits[0],
                               rtol=0, atol=1e-12)
    assert not model.get_decoder()._forward_hooks  # the hook is removed


def test_teacher_rank_from_hidden_matches_the_model_logits(model, sequences):
    micro = _micro_batch(sequences)
    lmax = max(len(s) for s in sequences)
    input_ids = torch.zeros(len(sequences), lmax, dtype=torch.long)
    attention = torch.zeros(len(sequences), lmax, dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, : len(seq)] = seq
        attention[i, : len(seq)] = 1
    with torch.no_grad(), capture_final_hidden(model) as store:
        model(input_ids=input_ids, attention_mask=attention, logits_to_keep=1)
    mask = micro["response_mask"]
    hidden_NH = _response_hidden(store["hidden"], micro_batch=micro, packed=False)[mask]
    ids_N = micro["responses"][mask]
    rank_N = sampled_token_rank_from_hidden(hidden_NH, model.lm_head.weight, ids_N, chunk_size=3)
    ref = _reference_logits(model, sequences)[mask]
    want = (ref > ref.gather(1, ids_N[:, None])).sum(1)
    assert rank_N.dtype == torch.int64 and torch.equal(rank_N, want)
    # hand check on a 1x4 row: logits (2, 5, 5, -1); id 1 -> rank 0 (tie shares the best), id 3 -> rank 3
    w = torch.eye(4, dtype=torch.float64)
    h = torch.tensor([[2.0, 5.0, 5.0, -1.0]], dtype=torch.float64).repeat(2, 1)
    assert sampled_token_rank_from_hidden(h, w, torch.tensor([1, 3])).tolist() == [0, 3]


# ---------------------------------------------------------------- heads that scale h @ W.T
def test_output_logit_scale_of_the_paper_heads():
    from transformers import FalconH1Config, Gemma2Config, GraniteConfig

    from recipe.common.heads import output_logit_scale

    assert output_logit_scale(tiny_qwen3_config(vocab_size=VOCAB)) == 1.0
    assert output_logit_scale(FalconH1Config(lm_head_multiplier=0.25)) == 0.25
    assert output_logit_scale(GraniteConfig(logits_scaling=8.0)) == 0.125
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        output_logit_scale(Gemma2Config(final_logit_softcapping=30.0))


def test_falcon_h1_logits_are_hidden_times_the_scaled_head():
    """Falcon-H1 (Falcon-H1R-7B preset) multiplies its lm_head output: the folded weight reproduces it."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    from recipe.common.heads import output_logit_scale

    config = FalconH1Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=8, mamba_chunk_size=8, lm_head_multiplier=0.37, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = FalconH1ForCausalLM(config).double().eval()
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), capture_final_hidden(model) as store:
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=0).logits
    weight = model.get_output_embeddings().weight * output_logit_scale(config)
    assert output_logit_scale(config) == pytest.approx(0.37)
    torch.testing.assert_close(store["hidden"] @ weight.T, logits, rtol=0, atol=1e-12)
