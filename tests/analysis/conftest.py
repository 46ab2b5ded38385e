"""Fixtures of the analysis tests.

- ``tiny``: ``(model, tokenizer, rows, train_parquet, model_dir)``: the tiny Qwen3 (seed 0) in eval mode and
  12 toy training rows (``recipe.toy.demo.write_tiny_data``, the tiny demo's generator), once per test module.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe.analysis import signal_rollouts as sr
    from recipe.models.tiny import build_tiny_model
    from recipe.toy.demo import write_tiny_data
    from recipe.toy.task import TaskConfig

    root = tmp_path_factory.mktemp("signal_analysis")
    model_dir = build_tiny_model(root / "model", seed=0)
    train = write_tiny_data(root / "data", TaskConfig(num_operands=2, digits=2, n_train=12, n_heldout=2))["train"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer, sr.load_rows(train), train, model_dir
