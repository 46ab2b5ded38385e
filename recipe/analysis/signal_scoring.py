"""Scoring of a signal analysis: the token signals of every rollout under every condition, and their
per-condition summaries.

One forward pass of the model on [student prompt || response] and one on [teacher prompt ||
response] give the final hidden states at the response positions (``response_hidden_states``);
``recipe.opsd.core.signals.token_signals_from_hidden`` projects them through the lm_head in chunks
(nothing of size [N, V] beyond a chunk) at the scoring temperature, as in training. Model heads: the
logit scale of ``recipe.common.heads.output_logit_scale`` is folded into the lm_head weight
(``output_head``, the trainer's policy); any other head whose logits are not ``h @ W.T + b`` is
refused by a check on one sequence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from recipe.analysis.signal_conditions import Condition, SignalAnalysisConfig
from recipe.analysis.signal_rollouts import PromptItem, Rollout
from recipe.common import heads
from recipe.opsd.core import signals

# Per-rollout features of the PCA (means over the rollout's response positions).
ROLLOUT_FEATURES = ("fwd_kl", "kl_gt_rate", "abs_adv", "top1_agree", "enc", "disc", "teacher_entropy")


def response_hidden_states(model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """Final hidden states ``[N, H]`` that predict each response token, for a batch of
    (prompt ids, response ids) pairs; N = total response tokens, in input order.

    The sequences are right-padded (causal attention: pads after a sequence never affect it)
    and the row for response token j of a prompt of length P is position P + j - 1.
    """
    device = model.device
    lengths = [len(p) + len(r) for p, r in sequences]
    width = max(lengths)
    pad = 0
    input_ids_BT = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask_BT = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, (prompt_ids, response_ids) in enumerate(sequences):
        if not prompt_ids or not response_ids:
            raise ValueError(f"sequence {b}: prompt and response must both be non-empty")
        ids = list(prompt_ids) + list(response_ids)
        input_ids_BT[b, : len(ids)] = torch.as_tensor(ids)
        mask_BT[b, : len(ids)] = 1
    backbone = getattr(model, model.base_model_prefix)
    hidden_BTH = backbone(input_ids=input_ids_BT.to(device), attention_mask=mask_BT.to(device)).last_hidden_state
    rows = []
    for b, (prompt_ids, response_ids) in enumerate(sequences):
        start = len(prompt_ids) - 1
        rows.append(hidden_BTH[b, start : start + len(response_ids)])
    return torch.cat(rows, dim=0)


def output_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight_VH, bias_V)`` with the head's logit scale folded in: logits = h @ W.T + b.

    One policy with the trainer (``recipe.common.heads.output_logit_scale``): a linear logit scale
    (Falcon-H1's ``lm_head_multiplier``, Cohere, Granite) multiplies the weight and bias; a soft-capped
    head is refused there.
    """
    head = model.get_output_embeddings()
    scale = heads.output_logit_scale(model.config)
    weight_VH, bias_V = head.weight, getattr(head, "bias", None)
    if scale != 1.0:
        weight_VH = weight_VH * scale
        bias_V = bias_V * scale if bias_V is not None else None
    return weight_VH, bias_V


def check_head_matches_logits(model, ids: Sequence[int], weight_VH: torch.Tensor, bias_V: torch.Tensor | None) -> None:
    """Refuse a model whose logits are not ``h @ W.T + b`` with the folded head (a head the policy misses)."""
    input_ids = torch.as_tensor([list(ids)], device=model.device)
    logits = model(input_ids=input_ids).logits[0].float()
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids).last_hidden_state[0]
    rebuilt = torch.nn.functional.linear(hidden, weight_VH, bias_V).float()
    if not torch.allclose(logits, rebuilt, atol=1e-3, rtol=1e-3):
        raise ValueError(
            f"{type(model).__name__}: logits are not output_logit_scale x lm_head(last_hidden_state) (max diff "
            f"{(logits - rebuilt).abs().max().item():.3g}); this model's output head is not supported "
            "(recipe.common.heads.output_logit_scale)"
        )


def sampler_view_logp(
    student_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None, sampled_N: torch.Tensor, *,
    config: SignalAnalysisConfig,
) -> torch.Tensor:
    """log-prob of each sampled token under the distribution the sampler drew it from: the student
    logits at the sampling temperature, then top-k, then top-p (transformers' warpers, the order of
    ``recipe.cpu.hf_generate``). Compared with the sampler's own log-probs by the rescoring check."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    warpers = []
    if config.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
    if config.top_p < 1:
        warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    out = []
    for start in range(0, student_NH.shape[0], config.chunk_size):
        rows = slice(start, start + config.chunk_size)
        scores = torch.nn.functional.linear(student_NH[rows], weight_VH, bias_V).float() / config.temperature
        for warper in warpers:
            scores = warper(None, scores)
        out.append(torch.log_softmax(scores, dim=-1).gather(-1, sampled_N[rows].unsqueeze(-1)).squeeze(-1))
    return torch.cat(out) if out else student_NH.new_zeros(0)


@torch.no_grad()
def score_rollouts(
    model, items: Sequence[PromptItem], rollouts: Sequence[Rollout], *, config: SignalAnalysisConfig,
    top_push: bool = False,
) -> dict[str, dict[str, torch.Tensor]]:
    """Token signals of every rollout under every condition (with ``top_push`` also ``signals.TOP_PUSH_KEYS``).

    Returns ``{condition: {signal: Tensor[N]}}`` (the keys of ``signals.token_signals_from_hidden``
    plus ``sampled_id``, ``rollout``, ``position``: token id, rollout index and 0-based response
    position of each row, and ``sampler_view_logp`` (``sampler_view_logp``); rows are the response
    tokens of all rollouts in order)
    and ``mass_V``: the float64 [V] divergence mass sum_i d_{i,v} per vocabulary id.
    """
    weight_VH, bias_V = output_head(model)
    conditions = [Condition.parse(c) for c in config.conditions]
    temperature = config.scoring_temperature
    check_head_matches_logits(model, (items[0].student_ids + rollouts[0].response_ids)[:64], weight_VH, bias_V)
    parts: dict[str, list[dict[str, torch.Tensor]]] = {c.name: [] for c in conditions}
    mass = {c.name: None for c in conditions}
    for start in range(0, len(rollouts), config.score_batch_size):
        batch = list(range(start, min(start + config.score_batch_size, len(rollouts))))
        responses = [rollouts[i].response_ids for i in batch]
        sampled_N = torch.as_tensor([t for r in responses for t in r], dtype=torch.long, device=model.device)
        index = {
            "sampled_id": sampled_N.cpu(),
            "rollout": torch.as_tensor([i for i, r in zip(batch, responses) for _ in r], dtype=torch.long),
            "position": torch.as_tensor([j for r in responses for j in range(len(r))], dtype=torch.long),
        }
        student_NH = response_hidden_states(model, [(items[rollouts[i].prompt].student_ids, rollouts[i].response_ids) for i in batch])
        index["sampler_view_logp"] = sampler_view_logp(student_NH, weight_VH, bias_V, sampled_N, config=config).cpu()
        for cond in conditions:
            teacher_NH = response_hidden_states(
                model, [(items[rollouts[i].prompt].teacher_ids[cond.name], rollouts[i].response_ids) for i in batch]
            )
            head_args = dict(student_bias=bias_V, teacher_bias=bias_V, student_temperature=temperature,
                             teacher_temperature=temperature, chunk_size=config.chunk_size)
            out = signals.token_signals_from_hidden(
                student_NH, weight_VH, teacher_NH, weight_VH, sampled_N, clip_tau=config.clip_tau, top_push=top_push,
                **head_args
            )
            parts[cond.name].append({**{k: v.detach().cpu() for k, v in out.items()}, **index})
            mass[cond.name] = signals.divergence_mass_by_token_from_hidden(
                student_NH, weight_VH, teacher_NH, weight_VH, mass_V=mass[cond.name], **head_args
            )
    return {
        name: {**{k: torch.cat([p[k] for p in chunks]) for k in chunks[0]}, "mass_V": mass[name].cpu()}
        for name, chunks in parts.items()
    }


def sampler_logp_gap(rollouts: Sequence[Rollout], token_signals: Mapping[str, torch.Tensor]) -> float | None:
    """Max |rescored log-prob - sampler log-prob| of the sampled tokens, both under the sampling
    distribution (``sampler_view_logp``: sampling temperature, top-k, top-p): a check that the
    rescoring sees the rollouts exactly as they were sampled (prompt, alignment, template, dtype).
    None when the sampler reported no log-probs (vLLM backend).
    """
    if any(r.logprobs is None for r in rollouts):
        return None
    sampled = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=torch.float64)
    return float((token_signals["sampler_view_logp"].double() - sampled).abs().max())


def rollout_features(token_signals: Mapping[str, torch.Tensor], *, num_rollouts: int) -> torch.Tensor:
    """``[num_rollouts, len(ROLLOUT_FEATURES)]`` per-rollout means over response positions:
    forward KL, D > .05 rate, |adv|, top-1 agreement, Enc (a > 0), Disc (a < 0), teacher entropy."""
    adv = token_signals["adv"].double()
    columns = {
        "fwd_kl": token_signals["fwd_kl"].double(),
        "kl_gt_rate": (token_signals["fwd_kl"] > signals.HIGH_KL_THRESHOLD).double(),
        "abs_adv": adv.abs(),
        "top1_agree": token_signals["top1_agree"].double(),
        "enc": (adv > 0).double(),
        "disc": (adv < 0).double(),
        "teacher_entropy": token_signals["teacher_entropy"].double(),
    }
    index = token_signals["rollout"]
    counts = torch.zeros(num_rollouts, dtype=torch.float64).index_add_(0, index, torch.ones_like(adv))
    out = torch.stack(
        [torch.zeros(num_rollouts, dtype=torch.float64).index_add_(0, index, columns[f]) for f in ROLLOUT_FEATURES], dim=1
    )
    return out / counts.clamp_min(1).unsqueeze(1)


def entropy_strata(fwd_kl_N: torch.Tensor, entropy_N: torch.Tensor, *, fraction: float) -> dict[str, float]:
    """Mean forward KL and D > .05 rate (%) of the highest- and the lowest-student-entropy ``fraction``
    of the pooled positions (paper ``tab:token_entropy_signal_app``, "Highest 20%" / "Lowest 20%").

    Selection as ``signals.entropy_tail_shares``: ceil(fraction x N) positions, stable sort, ties
    broken by index. Keys ``highest_kl``, ``highest_d_gt_005``, ``lowest_kl``, ``lowest_d_gt_005``.
    """
    n = fwd_kl_N.numel()
    keep = math.ceil(n * fraction - 1e-9)
    kl = fwd_kl_N.double()
    out = {}
    for name, descending in (("highest", True), ("lowest", False)):
        chosen = kl[torch.sort(entropy_N.double(), descending=descending, stable=True).indices[:keep]]
        out[f"{name}_kl"] = float(chosen.mean()) if keep else math.nan
        out[f"{name}_d_gt_005"] = 100.0 * float((chosen > signals.HIGH_KL_THRESHOLD).double().mean()) if keep else math.nan
    return out


def condition_report(
    token_signals: Mapping[str, torch.Tensor], tokenizer, *, config: SignalAnalysisConfig, num_rollouts: int
) -> dict[str, Any]:
    """Tables of one condition, from the shared signal functions (``recipe.opsd.core.signals``)."""
    sig = {k: token_signals[k] for k in signals.SIGNAL_KEYS}
    summary = signals.summarize_signals(sig)
    tails = signals.entropy_tail_shares(
        sig["fwd_kl"], sig["adv"].abs(), sig["student_entropy"], fraction=config.entropy_fraction
    )
    windows = signals.position_windows(sig["fwd_kl"], token_signals["position"], windows=config.windows)
    for window in windows:
        window["window"] = _window_label(window["lo"], window["hi"])
    mass_V = token_signals["mass_V"]
    total = float(mass_V.sum())
    # Per-entry terms are signed (d_v < 0 where pT(v) < pS(v)); list the largest positive masses.
    top_ids = [t for t in torch.argsort(mass_V, descending=True, stable=True)[: config.top_tokens].tolist() if mass_V[t] > 0]
    top = [
        {
            "token_id": int(t),
            "token": tokenizer.decode([int(t)]),
            "mass": float(mass_V[t]),
            "share": 100.0 * float(mass_V[t]) / total if total > 0 else math.nan,
        }
        for t in top_ids
    ]
    return {
        "summary": summary,
        "entropy_tails": {"fraction": config.entropy_fraction, **tails,
                          **entropy_strata(sig["fwd_kl"], sig["student_entropy"], fraction=config.entropy_fraction)},
        "position_windows": windows,
        "top_tokens": top,
        "rollout_features": rollout_features(token_signals, num_rollouts=num_rollouts).tolist(),
    }


def _window_label(lo: int, hi: int) -> str:
    def k(x: int) -> str:
        return f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)

    return f"[{k(lo)},{k(hi)})"
