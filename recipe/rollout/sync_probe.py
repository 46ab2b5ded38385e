"""Does the rollout server serve the trainer's weights? A log-prob probe after every weight push.

After each push ``recipe.rollout.vllm_adapter.SyncCheckedvLLMServerAdapter`` calls ``probe_and_log``:
the server samples ``PROBE_NEW_TOKENS`` tokens after a fixed prompt, their log-probs are compared with a
float32 CPU forward of exactly the pushed tensors, and one JSON line per push goes to
``OPSD_SYNC_CHECK_LOG``. Turned on by the external module ``recipe.rollout.sync_check``
(``scripts/gpu_check.py``; the tests' rollout hook uses the same functions). Tolerances and the rollout
dtype a check needs: docs/vllm_cpu.md#is-the-rollout-in-sync; measured: docs/results/cpu_path.md.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator

import torch

PROBE_PROMPT_LENGTH = 16
PROBE_NEW_TOKENS = 8

_REFERENCE_MODELS: dict[int, torch.nn.Module] = {}
# replica rank -> the weights of the previous push (for update_max_abs_logprob_diff)
_PREVIOUS_PUSH: dict[int, dict[str, torch.Tensor]] = {}


def probe_prompt_ids(*, vocab_size: int, length: int = PROBE_PROMPT_LENGTH) -> list[int]:
    """A fixed, vocabulary-spread prompt: ids ``(7 i + 11) mod vocab_size``."""
    if vocab_size < 2:
        raise ValueError(f"probe_prompt_ids: vocab_size must be >= 2, got {vocab_size}")
    return [(7 * i + 11) % vocab_size for i in range(length)]


def tee_weights(
    weights: Iterable[tuple[str, torch.Tensor]], store: dict[str, torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``weights`` unchanged while keeping a float32 CPU copy of each tensor in ``store``."""
    for name, tensor in weights:
        store[name] = tensor.detach().to("cpu", torch.float32, copy=True)
        yield name, tensor


def response_log_probs(*, logits_TV: torch.Tensor, token_ids_T: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """Log-probs (float64) of ``token_ids_T[prompt_length:]`` under the logits of the preceding positions.

    ``logits_TV[t]`` is the next-token distribution after ``token_ids_T[: t + 1]``.
    """
    if logits_TV.shape[0] != token_ids_T.shape[0]:
        raise ValueError(f"response_log_probs: {logits_TV.shape[0]} logits rows for {token_ids_T.shape[0]} tokens")
    if not 1 <= prompt_length < token_ids_T.shape[0]:
        raise ValueError(f"response_log_probs: prompt_length {prompt_length} outside [1, {token_ids_T.shape[0] - 1}]")
    log_probs_TV = torch.log_softmax(logits_TV[prompt_length - 1 : -1].double(), dim=-1)
    return log_probs_TV.gather(-1, token_ids_T[prompt_length:, None]).squeeze(-1)


def _reference_model(hf_config, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A float32 HF model of ``hf_config`` holding ``state_dict`` (built once per config, then reloaded)."""
    from transformers import AutoModelForCausalLM

    model = _REFERENCE_MODELS.get(id(hf_config))
    if model is None:
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
        _REFERENCE_MODELS[id(hf_config)] = model
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    tied = {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"rollout sync probe: pushed weights do not match {type(model).__name__}: "
            f"missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model


async def probe_and_log(*, server, hf_config, pushed: dict[str, torch.Tensor], global_steps, replica_rank: int, log_path: str) -> dict:
    """Sample the probe from ``server``, compare with the float32 reference of ``pushed``, append a line.

    The probe samples at temperature 1 with top-k / top-p off, so the returned (``processed_logprobs``)
    log-probs are the plain full-vocabulary ones. The line: ``global_steps``, ``replica_rank``,
    ``max_abs_logprob_diff`` / ``mean_abs_logprob_diff`` (rollout against the pushed weights),
    ``response_ids``, ``rollout_log_probs``, ``trainer_log_probs`` and ``update_max_abs_logprob_diff``: the
    same comparison between the previous push's weights and this push's (null at the first push), i.e.
    how far a rollout that missed this push would be off, so a test can check that its tolerance could
    have failed. A rollout that kept stale weights differs by the size of an update, one in sync by the
    engine's numerics only.
    """
    prompt_ids = probe_prompt_ids(vocab_size=int(hf_config.vocab_size))
    sampling_params = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": True,
        "max_tokens": PROBE_NEW_TOKENS,
        "ignore_eos": True,
    }
    output = await server.generate.remote(
        prompt_ids=prompt_ids, sampling_params=sampling_params, request_id=f"sync-probe-{uuid.uuid4().hex}"
    )
    if not output.token_ids or output.log_probs is None:
        raise RuntimeError(f"rollout sync probe: the server returned no tokens/log-probs ({output.stop_reason=})")
    token_ids_T = torch.tensor(prompt_ids + list(output.token_ids), dtype=torch.long)

    def reference_log_probs(state_dict: dict[str, torch.Tensor]) -> torch.Tensor:
        model = _reference_model(hf_config, state_dict)
        with torch.no_grad():
            logits_TV = model(input_ids=token_ids_T[None]).logits[0]
        return response_log_probs(logits_TV=logits_TV, token_ids_T=token_ids_T, prompt_length=len(prompt_ids))

    trainer_log_probs_R = reference_log_probs(pushed)
    rollout_log_probs_R = torch.tensor(output.log_probs, dtype=torch.float64)
    abs_diff_R = (rollout_log_probs_R - trainer_log_probs_R).abs()
    previous = _PREVIOUS_PUSH.get(replica_rank)
    update_diff = None if previous is None else (reference_log_probs(previous) - trainer_log_probs_R).abs().max().item()
    _PREVIOUS_PUSH[replica_rank] = pushed
    record = {
        "global_steps": global_steps,
        "replica_rank": replica_rank,
        "max_abs_logprob_diff": abs_diff_R.max().item(),
        "mean_abs_logprob_diff": abs_diff_R.mean().item(),
        "response_ids": [int(t) for t in output.token_ids],
        "rollout_log_probs": rollout_log_probs_R.tolist(),
        "trainer_log_probs": trainer_log_probs_R.tolist(),
        "update_max_abs_logprob_diff": update_diff,
    }
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record
