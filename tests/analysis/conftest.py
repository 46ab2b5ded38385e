"""Fixtures of the analysis tests.

- ``tiny``: ``(model, tokenizer, rows, train_parquet, model_dir)``: the tiny Qwen3 (seed 0) in eval mode and
  12 toy-addition training rows (``build_tiny_parquet``), once per test module.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.analysis import signal_analysis as sa
    from recipe.common.tiny_model import build_tiny_model, build_tiny_parquet

    root = tmp_path_factory.mktemp("signal_analysis")
    model_dir = build_tiny_model(root / "model", seed=0)
    train, _ = build_tiny_parquet(root / "data", num_train=12, num_val=2, seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer, sa.load_rows(train), train, model_dir
