"""Model heads as the losses see them (pure: torch, safetensors, huggingface_hub; no verl).

The OPSD losses and the signal analysis work on final hidden states and the lm_head weight instead of
logits; the facts that make that exact live here, so the trainer (``recipe.opsd.worker``) and the
analysis (``recipe.analysis.signal_scoring``) apply one policy: ``output_logit_scale`` (the head's scale,
folded into the weight; soft-capped heads refused), ``response_rows`` (the hidden-state rows that
predict each response token), ``checkpoint_lm_head`` / ``local_checkpoint_dir`` (the frozen teacher
head read from a checkpoint's files, a local directory or a cached Hub id, without loading the model).
"""

from __future__ import annotations

import json
import os

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


def local_checkpoint_dir(model_path: str) -> str:
    """The local directory of the checkpoint ``model_path`` names.

    A directory is returned as is. Anything else is taken as a Hub id (``org/name``) and resolved
    the way ``from_pretrained`` resolves it, without network: the snapshot directory of its
    ``main`` revision in the local Hugging Face cache (``$HF_HUB_CACHE``, default
    ``$HF_HOME/hub``: ``models--org--name/refs/main`` -> ``snapshots/<revision>/``). On the trainer
    workers the model has already been loaded by then, so its files are in that cache.
    """
    path = os.fspath(model_path)
    if os.path.isdir(path):
        return path
    from huggingface_hub import constants, snapshot_download

    try:
        return snapshot_download(repo_id=path, local_files_only=True)
    except Exception as err:  # not a valid repo id, or not in the cache
        raise FileNotFoundError(
            f"model path {path!r} is neither a local directory nor a Hub id in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}): {type(err).__name__}: {err}"
        ) from None


def checkpoint_lm_head(model_path: str, *, tie_word_embeddings: bool) -> torch.Tensor:
    """The lm_head weight [V, H] stored in the safetensors checkpoint ``model_path`` (directory or
    Hub id, see ``local_checkpoint_dir``); the input embedding if ``tie_word_embeddings`` and no
    ``lm_head.weight`` is stored. Sharded checkpoints are read through their
    ``model.safetensors.index.json`` (only the shard holding the tensor is opened)."""
    from safetensors import safe_open

    directory = local_checkpoint_dir(model_path)
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as handle:
            weight_map = json.load(handle)["weight_map"]
        names = list(weight_map)
        file_of = {name: os.path.join(directory, weight_map[name]) for name in names}
    else:
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        file_of = {}
        for name in files:
            with safe_open(os.path.join(directory, name), framework="pt") as handle:
                file_of.update({key: os.path.join(directory, name) for key in handle.keys()})
        names = list(file_of)
    if not names:
        raise FileNotFoundError(f"no safetensors checkpoint in {directory} (model path {model_path!r})")
    wanted = ("lm_head.weight",) + (("embed_tokens.weight",) if tie_word_embeddings else ())
    for suffix in wanted:
        for name in names:
            if name.endswith(suffix):
                with safe_open(file_of[name], framework="pt") as handle:
                    return handle.get_tensor(name)
    raise KeyError(f"{directory}: no tensor named *{' or *'.join(wanted)} among {len(names)} tensors")
