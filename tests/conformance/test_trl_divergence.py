"""Our beta-divergence (clip_tau None) against TRL's self-distillation divergence, code the project did not write.

Checked against TRL 1.12.0 (``trl.__version__``, asserted below; a pinned test-only dependency: the
``dev`` extra and .ci/constraints.txt), module ``trl/experimental/sdft/loss_utils.py`` (byte-identical in
1.12.0 through 1.16.0; 1.12.0 is the newest release that still ships ``trl.experimental.ppo``, which verl
0.9.1's FSDP engine imports whenever trl is installed):

- ``compute_divergence(student_log_probs, teacher_log_probs, alpha)``: per-position divergence from
  log-probs (``F.kl_div(..., reduction="none", log_target=True)`` per entry, then ``.sum(-1)``: no
  reduction over positions, no clip, no temperature);
- ``compute_full_logit_self_distillation_loss(student_logits, teacher_logits, *, distillation_alpha)``:
  ``log_softmax`` of both, then ``compute_divergence``;
- ``compute_topk_self_distillation_loss(..., distillation_topk, distillation_alpha, distillation_add_tail)``;
- the reduction of ``trl/experimental/sdft/sdft_trainer.py::SDFTTrainer._compute_self_distillation_loss``.

Mapping of conventions (TRL -> ours):

- ``alpha`` IS our ``beta``, same side: alpha 0 = ``kl_div(student, teacher)`` = sum pT (log pT - log pS),
  forward KL(pT || pS); alpha 1 = ``kl_div(teacher, student)`` = reverse KL(pS || pT); in between
  m = (1 - alpha) pS + alpha pT and ``lerp(kl_student, kl_teacher, alpha)`` = alpha KL(pT || m) +
  (1 - alpha) KL(pS || m), our generalized JSD. The endpoints are dispatched separately in both.
  beta 0.5 is symmetric (swapping the two sides leaves it unchanged), so beta 0.25 is tested as well:
  it would catch a mixture weighted on the wrong side.
- temperature: TRL's trainer divides the logits of both models by one ``args.temperature``
  (``SDFTTrainer._forward_logits``: ``logits / self.temperature``), so TRL gets ``logits / T`` and we
  pass ``student_temperature=teacher_temperature=T``.
- top-k: with ``distillation_add_tail=False`` TRL renormalises both on the STUDENT's top-k ids; ours
  takes the student's top-k for reverse KL (the teacher's for forward KL / JSD), so the two agree at
  beta 1 only (tested there).
- reduction: TRL's loss is ``mean_b(sum_t l_bt m_bt / max(sum_t m_bt, 1))``, the mean over rollouts of
  each rollout's mean over its loss positions = our ``aggregation_weights(mode="seq-mean-token-mean")``
  when every rollout has a loss position (TRL counts a rollout without any in the mean, ours does not).

Both sides float64 throughout: rtol 1e-10, atol 1e-12 (measured max abs error ~1e-15).

Run: python -m pytest tests/conformance/test_trl_divergence.py
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

with warnings.catch_warnings():  # TRL warns on every import of trl.experimental
    warnings.filterwarnings("ignore", message=r"You are importing from 'trl\.experimental'")
    loss_utils = pytest.importorskip(
        "trl.experimental.sdft.loss_utils",
        reason="trl is not installed: it is a pinned test-only dependency, pip install -c .ci/constraints.txt -e '.[dev]'",
    )
import trl  # noqa: E402  (after the skip)

from recipe.opsd.core.losses import aggregation_weights, fused_linear_weighted_divergence, token_divergence  # noqa: E402

V = 11
FLOAT64_TOL = dict(rtol=1e-10, atol=1e-12)
BETAS = [0.0, 0.25, 0.5, 1.0]


def _logits(n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    student_logits_NV = (torch.randn(n, V, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    teacher_logits_NV = torch.randn(n, V, generator=g, dtype=torch.float64) * 2
    return student_logits_NV, teacher_logits_NV


def _grad(values_N, logits_NV):
    """Gradient of a position-weighted sum (the weights break the symmetry between positions)."""
    weights_N = torch.linspace(0.5, 2.0, values_N.shape[0], dtype=values_N.dtype)
    return torch.autograd.grad((values_N * weights_N).sum(), logits_NV)[0]


def test_checks_trl_1_12_0():
    assert trl.__version__ == "1.12.0", "the conformance targets TRL 1.12.0's code: re-read it for a new version"


@pytest.mark.parametrize("temperature", [1.0, 1.1])
@pytest.mark.parametrize("beta", BETAS)
def test_token_divergence_matches_trl_compute_divergence(beta, temperature):
    student_logits_NV, teacher_logits_NV = _logits()
    ours_N = token_divergence(student_logits_NV, teacher_logits_NV, beta=beta, clip_tau=None,
                              student_temperature=temperature, teacher_temperature=temperature)
    trl_N = loss_utils.compute_divergence(
        student_log_probs=F.log_softmax(student_logits_NV / temperature, dim=-1),
        teacher_log_probs=F.log_softmax(teacher_logits_NV / temperature, dim=-1), alpha=beta,
    )
    trl_full_logits_N = loss_utils.compute_full_logit_self_distillation_loss(
        student_logits_NV / temperature, teacher_logits_NV / temperature, distillation_alpha=beta,
    )
    assert trl_N.shape == ours_N.shape == (7,)  # per position: TRL reduces only the vocabulary here
    torch.testing.assert_close(ours_N, trl_N, **FLOAT64_TOL)
    torch.testing.assert_close(ours_N, trl_full_logits_N, **FLOAT64_TOL)
    torch.testing.assert_close(_grad(ours_N, student_logits_NV), _grad(trl_N, student_logits_NV), **FLOAT64_TOL)


def test_topk_reverse_kl_matches_trl_student_topk_support():
    student_logits_NV, teacher_logits_NV = _logits(seed=1)
    ours_N = token_divergence(student_logits_NV, teacher_logits_NV, beta=1.0, clip_tau=None, topk=4)
    trl_N = loss_utils.compute_topk_self_distillation_loss(
        student_logits_NV, teacher_logits_NV, distillation_topk=4, distillation_alpha=1.0, distillation_add_tail=False,
    )
    full_N = token_divergence(student_logits_NV, teacher_logits_NV, beta=1.0, clip_tau=None)
    assert not torch.allclose(ours_N, full_N)  # the support restriction does act
    torch.testing.assert_close(ours_N, trl_N, **FLOAT64_TOL)
    torch.testing.assert_close(_grad(ours_N, student_logits_NV), _grad(trl_N, student_logits_NV), **FLOAT64_TOL)


def _trl_sequence_mean(per_token_loss_BT, loss_mask_BT):
    """SDFTTrainer._compute_self_distillation_loss's reduction (TRL 1.12.0), written out."""
    loss = (per_token_loss_BT * loss_mask_BT).sum(-1) / loss_mask_BT.sum(-1).clamp(min=1.0)
    return loss.mean()


@pytest.mark.parametrize("beta", BETAS)
def test_fused_loss_matches_trl_full_logit_loss_and_reduction(beta):
    """The training loss (hidden states and lm_head weights in, analytic gradient) against TRL's full-logit
    loss on the same logits [B, T, V], reduced as TRL's trainer does."""
    g = torch.Generator().manual_seed(2)
    b, t, h, temperature = 2, 4, 5, 1.1
    student_hidden_BTH = torch.randn(b, t, h, generator=g, dtype=torch.float64).requires_grad_(True)
    student_weight_VH = torch.randn(V, h, generator=g, dtype=torch.float64).requires_grad_(True)
    teacher_hidden_BTH = torch.randn(b, t, h, generator=g, dtype=torch.float64)
    teacher_weight_VH = torch.randn(V, h, generator=g, dtype=torch.float64)
    mask_BT = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)  # padding on both sides
    n = int(mask_BT.sum())

    weights_BT = aggregation_weights(mask_BT, mode="seq-mean-token-mean", global_tokens=n, global_sequences=b)
    ours_loss, ours_N = fused_linear_weighted_divergence(
        student_hidden_BTH[mask_BT], student_weight_VH, teacher_hidden_BTH[mask_BT], teacher_weight_VH,
        row_weights_N=weights_BT[mask_BT], beta=beta, clip_tau=None, student_temperature=temperature,
        teacher_temperature=temperature, chunk_size=2,  # several row chunks
    )
    ours_grads = torch.autograd.grad(ours_loss, (student_hidden_BTH, student_weight_VH))

    trl_BT = loss_utils.compute_full_logit_self_distillation_loss(
        (student_hidden_BTH @ student_weight_VH.T) / temperature, (teacher_hidden_BTH @ teacher_weight_VH.T) / temperature,
        distillation_alpha=beta,
    )
    trl_loss = _trl_sequence_mean(trl_BT, mask_BT.double())
    trl_grads = torch.autograd.grad(trl_loss, (student_hidden_BTH, student_weight_VH))

    torch.testing.assert_close(ours_N, trl_BT[mask_BT].detach(), **FLOAT64_TOL)
    torch.testing.assert_close(ours_loss, trl_loss, **FLOAT64_TOL)
    for ours_grad, trl_grad in zip(ours_grads, trl_grads):
        torch.testing.assert_close(ours_grad, trl_grad, **FLOAT64_TOL)
