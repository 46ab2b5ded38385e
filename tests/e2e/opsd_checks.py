"""What an OPSD launch of the tiny model must log and satisfy (tests/e2e/test_opsd_e2e.py, test_two_nodes_e2e.py),
and the fake Hub id whose local cache holds that model."""

import json
import math

import pandas as pd
import pytest
import torch

# What the paper's diagnostics and the compute tables read, per step.
LOGGED = (
    "opsd/loss", "opsd/loss_token_mean", "opsd/fwd_kl", "opsd/clip_frac", "opsd/clipped_teacher_mass", "opsd/student_entropy",
    "opsd/teacher_entropy", "opsd/top1_agree", "opsd/enc_frac", "opsd/disc_frac", "opsd/loss_tokens",
    "actor/grad_norm", "actor/loss", "actor/lr", "response_length/mean", "opsd/rollout_boxed_rate",
    "timing_s/step", "timing_s/gen", "timing_s/teacher", "timing_s/update_actor", "timing_s/update_weights",
    "timing_s/save_checkpoint", "training/global_step",
    "opsd/actor_param_checksum", "opsd/teacher_param_checksum", "training/data_index_sum",
)
BATCH_SIZE = 4  # data.train_batch_size of the tiny demo preset (recipe/opsd/config/demo/tiny.yaml)
DATA_SEED = 42  # data.seed of config/opsd_trainer.yaml


def float64_sums(model_dir):
    """(sum, sum of squares) over the initial model's parameters, as the trainer's checksum does."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = [p.detach().double() for p in model.parameters()]
    return float(sum(p.sum() for p in params)), float(sum((p * p).sum() for p in params))


def expected_index_sums(train_file, *, steps):
    """(sum, sum of squares) of extra_info.index per step of an uninterrupted run: verl's train
    sampler is torchdata's RandomSampler over the rows with a generator seeded data.seed
    (verl.trainer.ppo.utils.create_rl_sampler); batches are consecutive slices of its order."""
    from torchdata.stateful_dataloader.sampler import RandomSampler

    frame = pd.read_parquet(train_file)
    indices = [int(info["index"]) for info in frame["extra_info"]]
    generator = torch.Generator()
    generator.manual_seed(DATA_SEED)
    order = [indices[i] for i in RandomSampler(data_source=range(len(frame)), generator=generator)]
    batches = [order[i * BATCH_SIZE:(i + 1) * BATCH_SIZE] for i in range(steps)]
    return [(float(sum(b)), float(sum(x * x for x in b))) for b in batches]


def check_step_metrics(metrics, *, step, vocab_size, not_logged=()):
    logged = [key for key in LOGGED if key not in not_logged]
    missing = [key for key in logged if key not in metrics]
    assert not missing, f"step {step} misses {missing}"
    assert all(math.isfinite(metrics[key]) for key in logged), {k: metrics[k] for k in logged}
    assert metrics["training/global_step"] == step
    # positions=all: per token the loss is the per-entry clipped forward KL, never above the unclipped
    # one (opsd/loss itself is the per-rollout mean, the paper's aggregation)
    assert 0.0 <= metrics["opsd/fwd_kl"] and metrics["opsd/loss_token_mean"] <= metrics["opsd/fwd_kl"] + 1e-6
    assert metrics["opsd/loss"] == pytest.approx(metrics["actor/loss"], rel=1e-5, abs=1e-8)
    assert metrics["opsd/loss_tokens"] > 0 and 0.0 <= metrics["opsd/clip_frac"] <= 1.0
    for key in ("opsd/student_entropy", "opsd/teacher_entropy"):
        assert 0.0 < metrics[key] <= math.log(vocab_size) + 1e-6, key
    assert 0.0 <= metrics["opsd/top1_agree"] <= 1.0
    assert metrics["opsd/enc_frac"] >= 0 and metrics["opsd/disc_frac"] >= 0
    assert metrics["opsd/enc_frac"] + metrics["opsd/disc_frac"] <= 1.0 + 1e-6
    assert metrics["actor/grad_norm"] > 0
    assert 1 <= metrics["response_length/mean"] <= 32 and 0.0 <= metrics["opsd/rollout_boxed_rate"] <= 1.0
    assert metrics["timing_s/step"] > metrics["timing_s/gen"] > 0
    assert metrics["timing_s/teacher"] > 0 and metrics["timing_s/update_actor"] > 0


def check_preflight_positions(run, kind, *, checked=True):
    """The pre-flight gate's workers' part printed its table and verdict and logged with the launch's first step;
    ``checked``: the teacher has the student's weights, so the none control must be exactly 0 (the CPU platform
    computes in float32, whose tolerance is 1e-6; it is 0 in bf16 too)."""
    assert "[opsd] preflight positions: divergence of the first 16 response positions (4 rows" in run.log, run.tail()
    verdict = "[opsd] preflight positions: ok: none control max divergence "
    verdict += f"0 <= 1e-06 (teacher {kind} has the student's weights, float32)" if checked else ""
    assert verdict in run.log, run.tail()
    assert checked or f"(reported only: the teacher ({kind}) does not have the student's weights now)" in run.log
    first = min(run.metrics)
    for key in ("context/fwd_kl_p0_3", "context/divergence_p4_15", "none/fwd_kl_p4_15", "none_control_max"):
        assert math.isfinite(run.metrics[first][f"preflight/{key}"]), key
    assert run.metrics[first]["preflight/context/fwd_kl_p0_3"] > 0
    if checked:
        assert run.metrics[first]["preflight/none_control_max"] == 0.0


def vocab_size(model_dir):
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


HUB_ID = "opsd-test/tiny-qwen3"  # a fake Hub id: only the local cache below knows it


def hub_cache(model_dir, hf_home):
    """``hf_home`` laid out as Hugging Face's cache holding ``model_dir`` under ``HUB_ID``
    (``hub/models--org--name/refs/main`` -> ``snapshots/<revision>/``), its weights sharded with a
    ``model.safetensors.index.json`` as large checkpoints are."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    repo = hf_home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / revision
    AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).save_pretrained(
        snapshot, max_shard_size="150KB"
    )
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(snapshot)
    (snapshot / "generation_config.json").write_text((model_dir / "generation_config.json").read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    assert (snapshot / "model.safetensors.index.json").is_file() and len(list(snapshot.glob("*.safetensors"))) > 1
    return hf_home
