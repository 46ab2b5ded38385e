r"""``purified``: Purified OPSD (Shen et al., "Purified OPSD: On-Policy Self-Distillation Without
Losing How to Think", arXiv:2607.02234), replicated in the paper's appendix "Replications of Recent
OPSD Variants".

A reference-only teacher pR (the same frozen model on the reference alone, without the question: a second
teacher forward, ``needs_reference_forward``) turns the privileged teacher pT into the PMI-corrected target
q (:func:`purified_target_log_probs`); the loss is the symmetric JSD of pS and q (its preset: ``beta: 0.5``,
``clip_tau: null``). The formulas, which parts are our reading, and the memory: docs/core_math.md,
"Objectives" (Purified OPSD); the measured memory: :func:`purified_token_loss_from_hidden`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from recipe.opsd.core.losses import compute_dtype, entry_terms, log_probs, validate_loss_options
from recipe.opsd.core.objectives.base import Objective, ObjectiveBatch, ObjectiveLoss, register_objective
from recipe.opsd.core.objectives.terms import chunked_rows, positive, same_shape

__all__ = ["PurifiedParams", "soft_clip", "purified_target_log_probs", "purified_token_loss",
           "purified_token_loss_from_hidden", "Purified"]


@dataclass(frozen=True)
class PurifiedParams:
    """``opsd.loss.params`` of ``objective: purified``.

    pmi_strength: lambda in q ~ pT exp(lambda soft_clip(Delta)) (paper: 1).
    pmi_clip: soft-clip threshold c of Delta (paper: 10).
    The reference-only teacher pR sees the privileged field of ``opsd.teacher_context`` without
    the question (the trainer renders that prompt).
    """

    pmi_strength: float = 1.0
    pmi_clip: float = 10.0

    def __post_init__(self):
        positive("opsd.loss.params.pmi_strength", self.pmi_strength)
        positive("opsd.loss.params.pmi_clip", self.pmi_clip)


def soft_clip(x: torch.Tensor, *, threshold: float) -> torch.Tensor:
    """``threshold * tanh(x / threshold)``: ~x for |x| << threshold, saturates at +-threshold."""
    c = positive("threshold", threshold)
    return c * torch.tanh(x / c)


def purified_target_log_probs(
    teacher_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    *,
    teacher_temperature: float = 1.0,
    pmi_strength: float = 1.0,
    pmi_clip: float = 10.0,
) -> torch.Tensor:
    """log q of the PMI-corrected target, q_v proportional to pT_v exp(lambda soft_clip(log pT_v - log pR_v)).

    ``teacher_logits``: the privileged teacher pT = pi_0(. | Q, C, y_<i) (question + reference);
    ``reference_logits``: the same frozen model on the reference alone, pR = pi_0(. | C, y_<i). Both are
    divided by ``teacher_temperature``. No gradient (the target is a constant). Returns ``[..., V]`` in
    float32 (float64 inputs: float64).

    Delta_v = log pT_v - log pR_v is the PMI of the question and v given C; the soft clip
    c tanh(Delta_v / c) (c = pmi_clip = 10) is smooth, odd, slope 1 at 0 and saturates at +-c. Our reading
    (the method text and code were not retrievable; the paper gives "symmetric JSD, PMI strength 1, and PMI
    soft-clip threshold 10"): Delta is the log-ratio of the two teachers, the soft clip is the tanh form, the
    strength lambda multiplies the clipped Delta.
    """
    same_shape(teacher_logits=teacher_logits, reference_logits=reference_logits)
    lam = positive("pmi_strength", pmi_strength)
    tau = positive("teacher_temperature", teacher_temperature)
    cdt = compute_dtype(teacher_logits, reference_logits)
    with torch.no_grad():
        logp_t = log_probs(teacher_logits.detach(), temperature=tau, dtype=cdt)
        logp_r = log_probs(reference_logits.detach(), temperature=tau, dtype=cdt)
        scores = logp_t + lam * soft_clip(logp_t - logp_r, threshold=pmi_clip)
        return scores - torch.logsumexp(scores, dim=-1, keepdim=True)


def purified_token_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    *,
    beta: float = 0.5,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    pmi_strength: float = 1.0,
    pmi_clip: float = 10.0,
) -> torch.Tensor:
    """Per-position divergence between the student and the PMI target, shape ``logits.shape[:-1]``.

    ``beta`` selects the divergence of ``losses.entry_terms`` against q (0.5 = symmetric JSD,
    the Purified OPSD setting); ``clip_tau`` caps each vocabulary entry before the sum as in
    OPSD (None = off, the Purified OPSD setting). Gradient flows to ``student_logits`` only.
    Row-wise: callers may split rows into chunks (e.g. under ``torch.utils.checkpoint``).
    """
    same_shape(student_logits=student_logits, teacher_logits=teacher_logits, reference_logits=reference_logits)
    options = validate_loss_options(beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
                                    teacher_temperature=teacher_temperature, topk=None, chunk_size=None,
                                    vocab_size=student_logits.shape[-1])
    cdt = compute_dtype(student_logits, teacher_logits, reference_logits)
    logq = purified_target_log_probs(
        teacher_logits, reference_logits, teacher_temperature=options.teacher_temperature,
        pmi_strength=pmi_strength, pmi_clip=pmi_clip,
    ).to(cdt)
    logp_s = log_probs(student_logits, temperature=options.student_temperature, dtype=cdt)
    terms = entry_terms(logp_s, logq, beta=options.beta)
    if options.clip_tau is not None:
        terms = terms.clamp(max=options.clip_tau)
    return terms.sum(-1)


def purified_token_loss_from_hidden(
    student_hidden_NH: torch.Tensor,
    student_weight_VH: torch.Tensor,
    teacher_hidden_NH: torch.Tensor,
    teacher_weight_VH: torch.Tensor,
    reference_hidden_NH: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.5,
    clip_tau: float | None = None,
    student_temperature: float = 1.0,
    teacher_temperature: float | None = None,
    pmi_strength: float = 1.0,
    pmi_clip: float = 10.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """:func:`purified_token_loss` [N] with logits = hidden @ weight.T (+ bias), chunked.

    The privileged and the reference-only teacher share the frozen ``teacher_weight_VH``.
    Gradient flows to ``student_hidden_NH``, ``student_weight_VH`` and ``student_bias``.

    Memory: logits are formed per row chunk under activation checkpointing (recomputed in backward), so
    memory is O(chunk x V) but larger than the fused path: ~13 float32 [chunk, V] blocks at peak against
    ~3.5 (measured on CPU, V = 151,936: 1.1 GB at chunk_size 128, independent of N; lower
    opsd.loss.chunk_size for this objective on GPU).
    """
    if teacher_hidden_NH.shape != student_hidden_NH.shape or reference_hidden_NH.shape != student_hidden_NH.shape:
        raise ValueError(f"student, teacher and reference hidden states must share [N, H]; got "
                         f"{tuple(student_hidden_NH.shape)}, {tuple(teacher_hidden_NH.shape)}, {tuple(reference_hidden_NH.shape)}")
    teacher_weight = teacher_weight_VH.detach()
    teacher_bias = None if teacher_bias is None else teacher_bias.detach()
    options = dict(beta=beta, clip_tau=clip_tau, student_temperature=student_temperature,
                   teacher_temperature=teacher_temperature, pmi_strength=pmi_strength, pmi_clip=pmi_clip)

    def chunk_loss(hs, ht, hr, ws, bs):
        with torch.no_grad():
            teacher_logits = F.linear(ht, teacher_weight, teacher_bias)
            reference_logits = F.linear(hr, teacher_weight, teacher_bias)
        return purified_token_loss(F.linear(hs, ws, bs), teacher_logits, reference_logits, **options)

    return chunked_rows(chunk_loss, chunk_size,
                    rows=(student_hidden_NH, teacher_hidden_NH.detach(), reference_hidden_NH.detach()),
                    shared=(student_weight_VH, student_bias))


@register_objective
class Purified(Objective):
    name = "purified"
    order = 2
    Params = PurifiedParams
    needs_reference_forward = True

    @classmethod
    def check(cls, loss_config, *, teacher_context: str) -> None:
        from recipe.common.prompts import REFERENCE_CONTEXTS

        if teacher_context not in REFERENCE_CONTEXTS:
            raise ValueError(
                f"opsd.teacher_context must be one of {list(REFERENCE_CONTEXTS)} with opsd.loss.objective=purified "
                f"(its reference-only teacher needs a reference), got {teacher_context!r}"
            )

    def loss(self, batch: ObjectiveBatch) -> ObjectiveLoss:
        cfg, mask_bR = self.loss_config, batch.loss_mask_bR
        per_token_N = purified_token_loss_from_hidden(
            batch.student_hidden_bRH[mask_bR], batch.student_weight_VH, batch.teacher_hidden_bRH[mask_bR],
            batch.teacher_weight_VH, batch.reference_hidden_bRH[mask_bR], student_bias=batch.student_bias_V,
            teacher_bias=batch.teacher_bias_V, beta=cfg.beta, clip_tau=cfg.clip_tau,
            pmi_strength=self.params.pmi_strength, pmi_clip=self.params.pmi_clip, chunk_size=cfg.chunk_size,
            student_temperature=cfg.student_temperature, teacher_temperature=cfg.effective_teacher_temperature,
        )
        loss = (per_token_N * batch.weight_bR[mask_bR].to(per_token_N.dtype)).sum()
        return ObjectiveLoss(loss=loss, per_token_N=per_token_N, signals=batch.signals)
