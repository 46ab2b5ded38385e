"""The OPSD student forward of verl's real FSDP2 engine on models whose head scales ``h @ W.T``.

Falcon-H1 multiplies its lm_head output by ``lm_head_multiplier``, Granite divides it by
``logits_scaling``. The OPSD forward returns the loss in place of the lm_head output, and the
model then applies its scale to whatever that output is: the value and the gradients the
optimizer sees (and ``actor/grad_norm``, hence the grad clip) must still be the core function's.

``engine_probe.py`` runs one ``forward_backward_batch`` (two micro-batches) of the engine with the
OPSD loss in a fresh process (world size 1, gloo, fp32); here the reference is the pure
``losses.token_divergence`` on the float64 model's OWN logits (its head scale included) and a
teacher whose logits are the scaled frozen head applied to the probe's teacher hidden states,
differentiated by autograd. ~20 s per architecture on 2 shared cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipe.opsd.core.losses import token_divergence

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "engine_probe.py"
# the head scale each architecture applies (from its config; independent of recipe.common.heads)
HEAD_SCALE = {"falcon_h1": lambda c: c.lm_head_multiplier, "granite": lambda c: 1.0 / c.logits_scaling}


def _probe(arch: str, out_dir: Path, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    proc = subprocess.run([sys.executable, str(PROBE), arch, str(out_dir), *extra], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out_dir / "result.pt", weights_only=False)


def _reference(model_dir: Path, result: dict, scale: float, sft_weight: float = 0.0):
    """(loss, {name: grad}) of the clipped divergence on the model's own float64 logits, averaged as the
    paper does (the default loss_agg_mode): over each rollout's positions, then over rollouts; with
    ``sft_weight`` plus that weight x the NLL of the SFT rows' solutions (temperature 1, the model's own
    logits), averaged over all solution tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    frozen_head = model.get_output_embeddings().weight.detach().clone() * scale
    batch, opts = result["batch"], result["loss_config"]
    total, rollouts = 0.0, batch["input_ids"].shape[0]
    for i in range(rollouts):
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()]
        n = int(batch["response_mask"][i].sum())
        logits = model(ids[None], use_cache=False).logits[0, len(ids) - n - 1: len(ids) - 1]
        teacher = batch["teacher_hidden"][i, :n].double() @ frozen_head.T
        total = total + token_divergence(
            logits, teacher, beta=opts["beta"], clip_tau=opts["clip_tau"],
            student_temperature=opts["student_temperature"],
        ).mean()
    loss = total / rollouts
    if sft_weight:
        nll, tokens = 0.0, int(batch["opsd_sft_response_mask"].sum())
        for i in range(rollouts):
            ids = batch["opsd_sft_input_ids"][i][batch["opsd_sft_attention_mask"][i].bool()]
            n = int(batch["opsd_sft_response_mask"][i].sum())
            logits = model(ids[None], use_cache=False).logits[0, len(ids) - n - 1: len(ids) - 1]
            nll = nll - torch.log_softmax(logits, -1).gather(-1, ids[len(ids) - n:, None]).sum()
        loss = loss + sft_weight * nll / tokens
    loss.backward()
    return float(loss), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["falcon_h1", "granite"])
def test_scaled_head_loss_and_gradients_equal_the_core_function(arch, tmp_path):
    result = _probe(arch, tmp_path)
    from transformers import AutoConfig

    scale = HEAD_SCALE[arch](AutoConfig.from_pretrained(tmp_path / "model"))
    assert scale != 1.0
    loss, grads = _reference(tmp_path / "model", result, scale)
    # fp32 engine vs float64 reference: the clipped sum over the vocabulary cancels to ~1e-4 of its terms
    assert result["loss"] == pytest.approx(loss, rel=1e-3)
    assert result["grads"].keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(result["grads"][name].double(), grad, rtol=1e-4, atol=1e-7, msg=name)
    norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))
    assert result["grad_norm"] == pytest.approx(float(norm), rel=1e-5)  # actor/grad_norm, before clipping


@pytest.mark.slow
def test_the_sft_term_runs_a_second_student_forward_under_one_backward(tmp_path):
    """opsd.loss.sft_weight: the engine runs the student on the SFT rows (a forward of its own), then
    the loss forward; one backward of the summed loss must give the gradient of divergence + w x NLL of
    the model's own float64 logits (Granite: its head scale applies to both), split into 2 micro-batches."""
    from transformers import AutoConfig

    result = _probe("granite", tmp_path, "sft")
    scale = HEAD_SCALE["granite"](AutoConfig.from_pretrained(tmp_path / "model"))
    loss, grads = _reference(tmp_path / "model", result, scale, sft_weight=0.5)
    without, _ = _reference(tmp_path / "model", result, scale)
    assert abs(loss - without) > 0.1  # the term is there (NLL ~ ln V of a random model)
    assert result["loss"] == pytest.approx(loss, rel=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(result["grads"][name].double(), grad, rtol=1e-4, atol=1e-7, msg=name)
    tokens = int(result["batch"]["opsd_sft_response_mask"].sum())
    assert result["sft_metrics"]["opsd/sft_tokens"] == tokens
    assert result["sft_metrics"]["opsd/sft_nll"] == pytest.approx((loss - without) / 0.5, rel=1e-4)
