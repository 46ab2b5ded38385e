"""recipe/sft/config/sft_trainer.yaml against the paper's supervised initialization, and the
CPU SFT overrides of recipe/cpu/env.sh against verl 0.9.1's SFT schema."""

import subprocess
from pathlib import Path

from hydra import compose, initialize_config_dir

REPO_ROOT = Path(__file__).resolve().parents[2]


def sft_config(overrides=()):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "recipe" / "sft" / "config"), version_base=None):
        return compose(config_name="sft_trainer", overrides=list(overrides))


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


def test_cpu_sft_overrides_compose():
    out = subprocess.run(
        ["bash", "-c", 'source recipe/cpu/env.sh && printf "%s\\n" "${CPU_SFT_OVERRIDES[@]}"'],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout
    cfg = sft_config([line for line in out.splitlines() if line])
    assert cfg.engine.strategy == "fsdp2" and cfg.trainer.device == "cpu" and cfg.engine.use_torch_compile is False
    assert cfg.optim.lr == 1e-5  # the CPU path changes the machinery, not the recipe
