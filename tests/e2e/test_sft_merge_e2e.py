"""SFT stage -> FSDP merge -> HF model (the pipeline's wiring: tests/tools/test_pipeline.py).

- e2e: ``bash recipe/sft/run_sft.sh`` (verl's SFT trainer under torchrun, FSDP2 over gloo, the
  recipe's yaml, the tiny demo's run size) trains the tiny model for 2 steps on the toy SFT
  parquet, then ``bash scripts/merge_checkpoint.sh`` (verl.model_merger) writes an HF directory
  that loads with transformers, holds the FSDP checkpoint's weights and differs from the initial model.
- fast: verl's SFT dataset under the recipe's data config puts the loss on the assistant
  turn only, rendered in thinking mode.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from tests.e2e.conftest import bound

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sft_parquet(tiny_data, tmp_path_factory) -> Path:
    from data_prep.sft import main as build_sft

    out = tmp_path_factory.mktemp("sft_data") / "sft.parquet"
    assert build_sft(["--input", str(tiny_data["train"]), "--out", str(out)]) == 0
    return out


def _sft_data_config(max_length: int):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "recipe" / "sft" / "config"), version_base=None):
        return compose(config_name="sft_trainer", overrides=[f"data.max_length={max_length}"]).data


def test_sft_loss_is_on_the_thinking_assistant_turn_only(sft_parquet, tiny_model_dir):
    from transformers import AutoTokenizer

    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = MultiTurnSFTDataset(
        parquet_files=str(sft_parquet), tokenizer=tokenizer, config=_sft_data_config(512)
    )
    row = pd.read_parquet(sft_parquet).iloc[0]
    user, assistant = row["messages"][0], row["messages"][1]
    item = dataset[0]
    # pad_mode no_padding (the recipe's): every token is real, loss_mask marks the targets
    mask = item["loss_mask"].bool()
    trained = tokenizer.decode(item["input_ids"][mask])
    expected = f"<think>\n{assistant['reasoning_content']}\n</think>\n\n{assistant['content']}<|im_end|>"
    assert trained.rstrip("\n") == expected
    context = tokenizer.decode(item["input_ids"][~mask])
    assert user["content"] in context and context.rstrip("\n").endswith("<|im_start|>assistant")


def _fsdp_state_dict(shard_dir: Path) -> dict[str, torch.Tensor]:
    shard = torch.load(shard_dir / "model_world_size_1_rank_0.pt", map_location="cpu", weights_only=False)
    return {name: getattr(t, "_local_tensor", t) for name, t in shard.items()}


@pytest.mark.e2e
def test_sft_two_steps_then_merge_to_hf(run_cpu_verl, tiny_model_dir, sft_parquet, tmp_path):
    from transformers import AutoModelForCausalLM

    ckpt_dir = tmp_path / "sft"
    run = run_cpu_verl(
        "recipe/sft/run_sft.sh",
        [],
        workdir=tmp_path,
        env={
            "DEVICE": "cpu",
            "MODEL_PATH": str(tiny_model_dir),
            "TRAIN_FILES": str(sft_parquet),
            "CKPT_DIR": str(ckpt_dir),
            "OPSD_CACHE": str(tmp_path / "cache"),
            "STEPS": "2",
        },
        script=True,
        timeout=240,
    )
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    losses = [run.metrics[step]["train/loss"] for step in (1, 2)]
    assert all(math.isfinite(loss) and loss > 0 for loss in losses)
    assert losses[1] < losses[0]  # lr 1e-3 on 16 toy conversations: the loss must fall
    launch = json.loads((ckpt_dir / "run_times.jsonl").read_text().splitlines()[-1])
    assert launch["recipe"] == "sft" and launch["exit_code"] == 0 and launch["wall_time_s"] > 0

    merged = tmp_path / "sft_merged"
    merge = ["bash", "scripts/merge_checkpoint.sh", str(ckpt_dir), str(merged)]
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(merge, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(180))
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = subprocess.run(merge, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=bound(60))
    assert again.returncode == 2 and again.stderr.startswith(f"error: {merged}: exists"), again.stderr
    assert [p.name for p in tmp_path.glob("sft_merged*")] == ["sft_merged"]  # written as .partial-<pid>, renamed

    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    checkpoint = _fsdp_state_dict(ckpt_dir / "global_step_2")
    weights = model.state_dict()
    assert weights.keys() == checkpoint.keys() == initial.keys()
    for name, tensor in weights.items():
        # verl.model_merger stores bfloat16 (verl/model_merger/fsdp_model_merger.py:187)
        torch.testing.assert_close(tensor, checkpoint[name].bfloat16().float(), rtol=0, atol=0, msg=name)
    moved = [name for name in weights if not torch.equal(weights[name], initial[name].bfloat16().float())]
    assert len(moved) >= len(weights) // 2, f"SFT left most tensors unchanged: {sorted(set(weights) - set(moved))}"
