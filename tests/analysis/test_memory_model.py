"""recipe.analysis.memory_model on a hand-computed small shape, and the Qwen3 shapes against their model cards."""

import pytest

from recipe.analysis.memory_model import QWEN3, ModelShape, UpdateSetting, memory_terms, preset_micro_batch

# H 4, 2 layers, 2 heads x 2 dims (q 4), 1 kv head (kv 2), MLP 8, vocab 10, tied, no q/k norm
SMALL = ModelShape(name="small", hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10,
                   tied=True, qk_norm=False)


def test_small_shape_by_hand():
    assert (SMALL.q_dim, SMALL.kv_dim) == (4, 2)
    # q 4x4 + k, v 2 x 4x2 + o 4x4 = 48; MLP 3 x 4x8 = 96; two norms 8
    assert SMALL.layer_params == 152
    assert SMALL.root_params == 44  # tied embedding 10x4 + final norm 4
    assert SMALL.params == 348
    # bf16: norms 2 x 4 x (8 + 2) = 80, q 4 x 5 x 2 = 40, k + v 2 x 4 x 2 = 16, log-sum-exp 2 x 4 = 8, MLP 4 x 2 x 8 = 64
    assert SMALL.saved_bytes_per_token_per_layer(compute_bytes=2) == 208
    # fp32: 96 + 80 + 32 + 8 + 128
    assert SMALL.saved_bytes_per_token_per_layer(compute_bytes=4) == 344
    qwen_like = ModelShape(name="q", hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10,
                           tied=False, qk_norm=True)
    assert qwen_like.layer_params == 152 + 4  # q_norm, k_norm weights (head_dim each)
    assert qwen_like.root_params == 84  # untied lm_head adds 10x4
    # the q / k norms' fp32 copies: + 8 x (4 + 2)
    assert qwen_like.saved_bytes_per_token_per_layer(compute_bytes=4) == 344 + 48


def test_small_terms_by_hand_gpu_layout():
    setting = UpdateSetting(n_gpus=2, micro_batch=1, seq_tokens=3, chunk_size=2)
    terms = memory_terms(shape=SMALL, setting=setting)
    assert terms["student_params"] == 696  # 348 x 4 / 2
    assert terms["student_grads"] == 696
    assert terms["optimizer"] == 1392  # 348 x 8 / 2
    assert terms["student_gathered"] == 696  # (2 layers 304 + root 44) x 2 bytes
    assert terms["teacher_resident"] == 0
    assert terms["teacher_gathered"] == 696
    assert terms["teacher_hidden"] == 24  # 3 tokens x 4 x 2 bytes
    assert terms["activations"] == 48 + 120  # 2 layers x 3 x 4 x 2 + final norm 3 x 4 x (8 + 2)
    assert terms["layer_recompute"] == 624  # 3 tokens x 208
    # 2 rows x 10 x (21 + 6 + 9) + lm_head grad 10 x 4 x 4 + hidden grad 3 x 4 x 2
    assert terms["loss_workspace"] == 720 + 160 + 24
    assert terms["peak"] == 696 + 696 + 1392 + 696 + 696 + 24 + 168 + 904


def test_small_terms_by_hand_cpu_check_layout():
    setting = UpdateSetting(n_gpus=1, micro_batch=2, seq_tokens=3, chunk_size=4, gradient_checkpointing=False,
                            fsdp=False, teacher_offload=False, compute_bytes=4, teacher_bytes=4)
    terms = memory_terms(shape=SMALL, setting=setting)
    assert terms["student_gathered"] == terms["teacher_gathered"] == 0
    assert terms["teacher_resident"] == 348 * 4
    # no checkpointing: 2 layers x 6 tokens x 344 + final norm 6 x 4 x 12
    assert terms["activations"] == 4128 + 288
    assert terms["layer_recompute"] == 0
    # fp32 weights: no bf16 buffers; 4 rows x 10 x (21 + 9) + 160 + 6 x 4 x 4
    assert terms["loss_workspace"] == 1200 + 160 + 96
    assert terms["peak"] == 348 * (4 + 4 + 8 + 4) + 6 * 4 * 4 + 4416 + 1456


@pytest.mark.parametrize("name, total, non_embedding", [
    ("Qwen3-1.7B", 1.7, 1.4), ("Qwen3-4B", 4.0, 3.6), ("Qwen3-8B", 8.2, 6.9)])
def test_qwen3_shapes_match_the_model_cards(name, total, non_embedding):
    shape = QWEN3[name]
    assert round(shape.params / 1e9, 1) == total
    assert round(shape.layers * shape.layer_params / 1e9, 1) == non_embedding


def test_from_hf_config_and_preset_rule():
    config = {"hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 8, "vocab_size": 10, "tie_word_embeddings": True, "model_type": "llama"}
    assert ModelShape.from_hf_config(config, name="small") == SMALL
    assert preset_micro_batch(by_cap={1024: 8, 2048: 4}, default=8, cap=2048) == 4
    assert preset_micro_batch(by_cap={1024: 8, 2048: 4}, default=8, cap=8192) == 8


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="UpdateSetting.micro_batch"):
        UpdateSetting(n_gpus=1, micro_batch=0, seq_tokens=3)
    with pytest.raises(ValueError, match="UpdateSetting.compute_bytes"):
        UpdateSetting(n_gpus=1, micro_batch=1, seq_tokens=3, compute_bytes=8)
    with pytest.raises(ValueError, match="ModelShape.vocab"):
        ModelShape(name="x", hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=0,
                   tied=True, qk_norm=False)
