"""Our forward KL (beta 0, no clip) against verl's own distillation loss, code the project did not write.

Checked against verl 0.9.1 (``verl.__version__``, asserted below):

- ``verl/trainer/distillation/fsdp/losses.py::compute_forward_kl_topk``: the per-position top-k forward
  KL of verl's FSDP engine (the ``forward_kl_topk`` loss mode; the registered
  ``verl/trainer/distillation/losses.py::compute_forward_kl_topk`` only re-pads its output, logs metrics
  and applies ``clamp_min(0.0)``, a no-op for an exact KL, which is >= 0);
- ``verl/trainer/ppo/core_algos.py::agg_loss``: the aggregation verl's ``distillation_loss`` applies to it
  in the supervised branch (``use_policy_gradient=False``).

Mapping of conventions (ours -> verl):

- k = V: ``teacher_topk_ids`` holds every vocabulary id, so the top-k KL is the exact full-vocabulary
  forward KL(pT || pS) = our ``token_divergence(..., beta=0.0, clip_tau=None)``; verl's
  ``student_mass`` / ``teacher_mass`` (the probability on the support) are then 1.
- temperature: verl's function applies none. Its engine divides the student logits by the rollout
  temperature before calling it (``verl/workers/engine/fsdp/transformer_impl.py``,
  ``_scale_logits_by_temperature``), and the teacher log-probs are an input (the teacher server's). So
  verl gets ``student_logits / student_temperature`` and
  ``log_softmax(teacher_logits / teacher_temperature)``.
- clamps off: ``DistillationLossConfig(log_prob_min_clamp=None)`` (default -10.0: it clamps both sides'
  log-probs before the KL) and ``loss_max_clamp=None`` (default 10.0: ``distillation_loss`` clamps the
  per-position loss; not called here, set to None all the same).
- layout: verl takes packed ("thd") rows: teacher tensors are jagged nested tensors over the rollouts,
  the student logits ``[1, total_positions, V]``; the output is ``[1, total_positions]``.
- aggregation: ``agg_loss(loss_BT, mask_BT, mode)`` = ``sum(aggregation_weights(mask_BT, mode=mode) *
  loss_BT)`` for the modes tested (every rollout has a loss position).

Tolerance: verl's ``kl_divergence`` casts both log-prob tensors to float32 (``.float()``) whatever the
input dtype, so its values and gradients carry float32 rounding (measured max abs error 5e-7 on values
~1-3, 3e-7 on the logit gradients, 3e-8 on the fused loss's hidden/weight gradients); compared with rtol
2e-6, atol 1e-6. Our side runs in float64.

Run: python -m pytest tests/conformance/test_verl_distillation.py
"""

import pytest
import torch
import torch.nn.functional as F
import verl
from verl.trainer.distillation.fsdp.losses import compute_forward_kl_topk
from verl.trainer.ppo.core_algos import agg_loss
from verl.workers.config import DistillationConfig, DistillationLossConfig

from recipe.opsd.core.losses import aggregation_weights, fused_linear_weighted_divergence, token_divergence

V = 11
LENGTHS = (3, 4)  # two rollouts, N = 7 packed positions
FLOAT32_TOL = dict(rtol=2e-6, atol=1e-6)
TEMPERATURES = [(1.0, 1.0), (1.1, 1.1), (1.1, 1.0)]  # (student, teacher)


def _config(*, use_chunked_topk: bool = False) -> DistillationConfig:
    return DistillationConfig(distillation_loss=DistillationLossConfig(
        loss_mode="forward_kl_topk", topk=V, use_policy_gradient=False,
        log_prob_min_clamp=None, loss_max_clamp=None, use_chunked_topk=use_chunked_topk,
    ))


def _verl_forward_kl(*, student_logits_NV, teacher_logits_NV, student_temperature, teacher_temperature,
                     use_chunked_topk=False) -> dict[str, torch.Tensor]:
    """verl's outputs [N] for packed rows of LENGTHS, the whole vocabulary as the teacher's "top-k"."""
    n = student_logits_NV.shape[0]
    offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    teacher_log_probs_NV = F.log_softmax(teacher_logits_NV / teacher_temperature, dim=-1)
    all_ids_NV = torch.arange(V).expand(n, V).contiguous()
    out = compute_forward_kl_topk(
        student_logits=(student_logits_NV / student_temperature).unsqueeze(0),
        teacher_topk_log_probs=torch.nested.nested_tensor_from_jagged(teacher_log_probs_NV, offsets),
        teacher_topk_ids=torch.nested.nested_tensor_from_jagged(all_ids_NV, offsets),
        config=_config(use_chunked_topk=use_chunked_topk), data_format="thd",
    )
    return {k: v.squeeze(0) for k, v in out.items()}


def _logits(seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)
    student_logits_NV = (torch.randn(n, V, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    teacher_logits_NV = torch.randn(n, V, generator=g, dtype=torch.float64) * 2
    return student_logits_NV, teacher_logits_NV


def test_checks_verl_0_9_1():
    assert verl.__version__ == "0.9.1", "the conformance targets verl 0.9.1's code: re-read it for a new version"


@pytest.mark.parametrize("use_chunked_topk", [False, True], ids=["log_softmax", "chunked"])
@pytest.mark.parametrize("student_temperature,teacher_temperature", TEMPERATURES)
def test_token_divergence_matches_verl_forward_kl_at_k_equals_v(student_temperature, teacher_temperature,
                                                                use_chunked_topk):
    student_logits_NV, teacher_logits_NV = _logits()
    verl_out = _verl_forward_kl(student_logits_NV=student_logits_NV, teacher_logits_NV=teacher_logits_NV,
                                student_temperature=student_temperature, teacher_temperature=teacher_temperature,
                                use_chunked_topk=use_chunked_topk)
    ours_N = token_divergence(student_logits_NV, teacher_logits_NV, beta=0.0, clip_tau=None,
                              student_temperature=student_temperature, teacher_temperature=teacher_temperature)
    ones_N = torch.ones(sum(LENGTHS), dtype=torch.float64)
    torch.testing.assert_close(verl_out["student_mass"].double(), ones_N, **FLOAT32_TOL)  # k = V covers everything
    torch.testing.assert_close(verl_out["teacher_mass"].double(), ones_N, **FLOAT32_TOL)
    assert (ours_N > 0.1).all()  # well away from 0: verl's registered wrapper's clamp_min(0.0) cannot act
    torch.testing.assert_close(verl_out["distillation_losses"].double(), ours_N, **FLOAT32_TOL)

    # gradient w.r.t. the raw student logits of a position-weighted sum (weights break the symmetry)
    weights_N = torch.linspace(0.5, 2.0, sum(LENGTHS), dtype=torch.float64)
    (verl_grad_NV,) = torch.autograd.grad((verl_out["distillation_losses"].double() * weights_N).sum(), student_logits_NV)
    (ours_grad_NV,) = torch.autograd.grad((ours_N * weights_N).sum(), student_logits_NV)
    torch.testing.assert_close(verl_grad_NV, ours_grad_NV, **FLOAT32_TOL)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("student_temperature,teacher_temperature", TEMPERATURES[1:])
def test_fused_loss_matches_verl_supervised_distillation_loss(mode, student_temperature, teacher_temperature):
    """The training loss (hidden states and lm_head weights in, analytic gradient) against verl's supervised
    distillation loss: its per-position forward KL on the same logits, aggregated by ``agg_loss``."""
    g = torch.Generator().manual_seed(1)
    n, h, t = sum(LENGTHS), 5, max(LENGTHS)
    student_hidden_NH = torch.randn(n, h, generator=g, dtype=torch.float64).requires_grad_(True)
    student_weight_VH = torch.randn(V, h, generator=g, dtype=torch.float64).requires_grad_(True)
    teacher_hidden_NH = torch.randn(n, h, generator=g, dtype=torch.float64)
    teacher_weight_VH = torch.randn(V, h, generator=g, dtype=torch.float64)
    mask_BT = torch.arange(t)[None, :] < torch.tensor(LENGTHS)[:, None]  # rows packed in mask order

    weights_BT = aggregation_weights(mask_BT, mode=mode, global_tokens=n, global_sequences=len(LENGTHS))
    ours_loss, ours_N = fused_linear_weighted_divergence(
        student_hidden_NH, student_weight_VH, teacher_hidden_NH, teacher_weight_VH,
        row_weights_N=weights_BT[mask_BT], beta=0.0, clip_tau=None, student_temperature=student_temperature,
        teacher_temperature=teacher_temperature, chunk_size=3,  # several row chunks
    )
    ours_grads = torch.autograd.grad(ours_loss, (student_hidden_NH, student_weight_VH))

    verl_N = _verl_forward_kl(student_logits_NV=student_hidden_NH @ student_weight_VH.T,
                              teacher_logits_NV=teacher_hidden_NH @ teacher_weight_VH.T,
                              student_temperature=student_temperature,
                              teacher_temperature=teacher_temperature)["distillation_losses"].double()
    verl_loss_BT = torch.zeros(mask_BT.shape, dtype=torch.float64).masked_scatter(mask_BT, verl_N)
    verl_loss = agg_loss(loss_mat=verl_loss_BT, loss_mask=mask_BT.double(), loss_agg_mode=mode)
    verl_grads = torch.autograd.grad(verl_loss, (student_hidden_NH, student_weight_VH))

    torch.testing.assert_close(ours_N, verl_N.detach(), **FLOAT32_TOL)
    torch.testing.assert_close(ours_loss, verl_loss, **FLOAT32_TOL)
    for ours_grad, verl_grad in zip(ours_grads, verl_grads):
        torch.testing.assert_close(ours_grad, verl_grad, **FLOAT32_TOL)
