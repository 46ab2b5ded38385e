"""Model heads as the losses see them (pure: torch only, no verl).

The OPSD losses and the signal analysis work on final hidden states and the lm_head weight instead
of logits. Two facts about a model make that exact, and both the trainer
(``recipe.opsd.teacher_worker``) and the analysis (``recipe.analysis.signal_analysis``) take them
from here, so they apply one policy:

- ``output_logit_scale(hf_config)``: the factor the head multiplies ``h @ W.T`` by (folded into the
  weight); non-linear heads (soft-capping) are refused;
- ``response_rows(...)``: which hidden-state rows predict each response token.
"""

from __future__ import annotations

import torch


# Model configs whose causal-LM head is ``scale * (h @ W.T)`` instead of ``h @ W.T`` (transformers
# 5.x): attribute -> how it turns into the scale. The OPSD losses work on hidden states and the
# lm_head weight, so the scale is folded into the weight (logits are linear in it).
_LINEAR_LOGIT_SCALES = {
    "lm_head_multiplier": lambda v: float(v),  # Falcon-H1 (Falcon-H1R-7B)
    "logit_scale": lambda v: float(v),  # Cohere
    "logits_scaling": lambda v: 1.0 / float(v),  # Granite divides
}


def output_logit_scale(hf_config) -> float:
    """The factor the model's head multiplies ``h @ W.T`` by (1.0 for Qwen3, Llama, OLMo, ...).

    A non-linear head (Gemma's ``final_logit_softcapping``) cannot be folded into the weight and is
    refused: the fused loss would otherwise train on logits the model never produces.
    """
    configs = [hf_config] + [getattr(hf_config, "text_config", None)]
    scale = 1.0
    for cfg in filter(None, configs):
        if getattr(cfg, "final_logit_softcapping", None) is not None:
            raise ValueError(
                f"{type(cfg).__name__}.final_logit_softcapping={cfg.final_logit_softcapping}: the OPSD fused loss "
                "needs logits linear in the lm_head weight (soft-capped heads are not supported)"
            )
        for name, to_scale in _LINEAR_LOGIT_SCALES.items():
            value = getattr(cfg, name, None)
            if value is not None:
                scale *= to_scale(value)
    return scale


def response_rows(*, starts_b, seq_lens_b, response_lens_b, max_response_len: int):
    """Flat row indices of the hidden states that predict each response token.

    Sequence i occupies rows ``starts_b[i] .. starts_b[i] + seq_lens_b[i] - 1`` (prompt then
    response, no pad in between); its response is the last ``response_lens_b[i]`` tokens, and
    response token j is predicted by the hidden state one row before it. Returns
    ``(rows_bR, valid_bR)``; invalid entries point at row ``starts_b[i]`` and must be masked.
    """
    starts_b = starts_b.long()
    seq_lens_b = seq_lens_b.long().to(starts_b.device)
    response_lens_b = response_lens_b.long().to(starts_b.device)
    if bool((response_lens_b > seq_lens_b - 1).any()):
        raise ValueError(
            f"response longer than the sequence minus one prompt token: responses {response_lens_b.tolist()}, "
            f"sequences {seq_lens_b.tolist()}"
        )
    j_R = torch.arange(max_response_len, device=starts_b.device)
    first_b = starts_b + seq_lens_b - response_lens_b - 1
    valid_bR = j_R.unsqueeze(0) < response_lens_b.unsqueeze(1)
    rows_bR = torch.where(valid_bR, first_b.unsqueeze(1) + j_R.unsqueeze(0), starts_b.unsqueeze(1))
    return rows_bR, valid_bR
