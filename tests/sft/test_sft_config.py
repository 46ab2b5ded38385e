"""recipe/sft/config/sft_trainer.yaml against the paper's supervised initialization (the CPU
platform: tests/cpu/test_platform.py; the token budget through the launcher: tests/launch/test_dry_run.py)."""

from recipe.launch.config import compose, get_recipe


def sft_config(overrides=()):
    return compose(get_recipe("sft"), list(overrides))


def test_sft_yaml_matches_the_paper():
    cfg = sft_config()
    # app:sft_configuration
    assert cfg.data.train_batch_size == 64 and cfg.data.max_length == 12288
    assert cfg.trainer.total_training_steps == 15000 and cfg.trainer.save_freq == 500
    assert cfg.optim.lr == 1e-5 and cfg.optim.weight_decay == 0.0 and cfg.optim.clip_grad == 1.0
    assert cfg.optim.lr_scheduler_type == "cosine" and cfg.optim.lr_warmup_steps_ratio == 0.1
    assert cfg.engine.dtype == "bfloat16" and cfg.model.enable_gradient_checkpointing is True
    assert cfg.trainer.seed == 42 and cfg.engine.seed == 42
    assert cfg.data.enable_thinking_default is True  # Qwen3 template, thinking enabled
    assert cfg.data.truncation == "error" and cfg.data.val_files is None
    assert cfg.model.lora_rank == 0  # full-parameter SFT
    assert cfg.data.max_token_len_per_gpu == cfg.data.max_length  # one 12,288-token row fits a micro-batch
