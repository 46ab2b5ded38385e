"""Per-GPU peak memory of one OPSD actor update (pure: stdlib only).

``memory_terms`` adds up, term by term, the student's sharded fp32 state, FSDP2's gathered working copies,
the (offloaded) teacher, the saved activations and the fused loss's workspace of verl 0.9.1's FSDP2 update
for a ``ModelShape`` (``QWEN3``: the paper's models) and an ``UpdateSetting``. Used by
``scripts/bench.py memory-model`` (``benchmarks/memory.py``), ``benchmarks/gpu.py`` and
``recipe.tools.gpu_check``; the terms, the peak rule and what is not modelled: ``memory_terms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

GiB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (Llama / Qwen3 family)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qk_norm: bool

    def __post_init__(self):
        for field in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
                raise ValueError(f"ModelShape.{field} must be a positive int, got {getattr(self, field)!r}")

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attention + 3 * h * self.intermediate + norms

    @property
    def root_params(self) -> int:
        """Embedding, final norm and (untied) lm_head: the parameters outside the decoder layers."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def saved_bytes_per_token_per_layer(self, *, compute_bytes: int) -> int:
        """Bytes one decoder layer saves for backward per token (Hugging Face Llama / Qwen3 modules,
        sdpa attention; ``compute_bytes`` = 2 for bf16 autocast, 4 for fp32):

        - each RMSNorm (two per layer): its fp32 upcast input and fp32 normalized value (saved by
          ``pow`` / ``mul``) and its output in the compute dtype (saved by the next matmul):
          H x (8 + c);
        - q: with a q norm (Qwen3) that norm's two fp32 tensors (8 q) and its output; rope saves the
          input and ``rotate_half`` of it, sdpa its roped input and its output, o_proj the
          contiguous copy of that output: 5 c q (+ 8 q with the norm); k likewise without the
          output: 3 c kv (+ 8 kv); v: c kv; sdpa's fp32 log-sum-exp: 4 per head;
        - the MLP: gate and up outputs, act(gate), act x up: 4 c I.
        """
        c = compute_bytes
        norm = 8 if self.qk_norm else 0
        return (2 * self.hidden * (8 + c) + self.q_dim * (norm + 5 * c) + self.kv_dim * (norm + 4 * c)
                + 4 * self.heads + 4 * c * self.intermediate)

    @classmethod
    def from_hf_config(cls, config: Mapping, *, name: str) -> "ModelShape":
        """From a Hugging Face ``config.json`` dict (Llama, Qwen2/3, Mistral keys)."""
        heads = int(config["num_attention_heads"])
        return cls(
            name=name, hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]), heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)), qk_norm=config.get("model_type") == "qwen3",
        )


# The public config.json values of the released Qwen3 checkpoints (hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size, tie_word_embeddings).
QWEN3 = {
    "Qwen3-1.7B": ModelShape(name="Qwen3-1.7B", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                             intermediate=6144, vocab=151936, tied=True, qk_norm=True),
    "Qwen3-4B": ModelShape(name="Qwen3-4B", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                           intermediate=9728, vocab=151936, tied=True, qk_norm=True),
    "Qwen3-8B": ModelShape(name="Qwen3-8B", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                           intermediate=12288, vocab=151936, tied=False, qk_norm=True),
}


@dataclass(frozen=True)
class UpdateSetting:
    """One actor update's layout. Defaults: verl 0.9.1's FSDP2 engine on GPUs (``memory_terms``)."""

    n_gpus: int
    micro_batch: int
    seq_tokens: int
    chunk_size: int = 1024
    gradient_checkpointing: bool = True
    fsdp: bool = True
    teacher_offload: bool = True
    param_bytes: int = 4
    grad_bytes: int = 4
    optimizer_bytes: int = 8
    compute_bytes: int = 2
    teacher_bytes: int = 2

    def __post_init__(self):
        for field in ("n_gpus", "micro_batch", "seq_tokens", "chunk_size"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
                raise ValueError(f"UpdateSetting.{field} must be a positive int, got {getattr(self, field)!r}")
        for field in ("param_bytes", "grad_bytes", "compute_bytes", "teacher_bytes"):
            if getattr(self, field) not in (2, 4):
                raise ValueError(f"UpdateSetting.{field} must be 2 (bf16) or 4 (fp32), got {getattr(self, field)!r}")

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_tokens


def memory_terms(*, shape: ModelShape, setting: UpdateSetting) -> dict[str, int]:
    """Bytes per GPU of every term and their ``peak``.

    The update modelled (verl 0.9.1's FSDP2 engine): per micro-batch the teacher's forward (no grad, final
    hidden states kept), the student's forward, the fused lm_head + loss with its diagnostics in row chunks,
    backward; AdamW per mini-batch. P parameters, n GPUs, T = ``setting.tokens`` (the callers use micro-batch
    x (prompt cap + rollout cap): every sample at both caps), V vocabulary:

    - student: P x (4 param + 4 grad + 8 AdamW) / n (fp32, sharded), plus the bf16 working copies FSDP2
      gathers: two decoder layers (current + prefetched) and the root (embedding, final norm, lm_head, which
      stay gathered from forward to backward);
    - teacher: bf16 with ``CPUOffloadPolicy`` (shards in host memory), so only the same gathered copies; not
      offloaded, P x 2 / n more; its final hidden states [T, H];
    - activations: with gradient checkpointing every layer's input [T, H], plus one layer's saved tensors
      while it is recomputed in backward; without, every layer's saved tensors
      (``ModelShape.saved_bytes_per_token_per_layer``); plus the final norm's;
    - loss: the fused loss's [chunk, V] workspace, the diagnostics' transients and the gradients it forms in
      forward.

    Peak = the persistent terms (saved activations included) + the larger of the loss's workspace and one
    layer's recomputation (they do not overlap: the loss runs before the layers' backward). Not modelled: the
    CUDA context and allocator fragmentation (1-3 GB on a GPU), the rollout engine (vLLM sleeps during the
    update in verl's colocated layout), the optimizer's fp32 temporaries inside ``step``.
    """
    n_gpus, tokens, hidden, vocab = setting.n_gpus, setting.tokens, shape.hidden, shape.vocab
    params = shape.params
    working = 2 * shape.layer_params + shape.root_params  # gathered by FSDP2: two layers + root
    terms = {
        "student_params": params * setting.param_bytes // n_gpus,
        "student_grads": params * setting.grad_bytes // n_gpus,
        "optimizer": params * setting.optimizer_bytes // n_gpus,
        "student_gathered": working * setting.compute_bytes if setting.fsdp else 0,
        "teacher_resident": 0 if setting.teacher_offload else params * setting.teacher_bytes // n_gpus,
        "teacher_gathered": working * setting.teacher_bytes if setting.fsdp else 0,
        "teacher_hidden": tokens * hidden * setting.teacher_bytes,
    }
    layer_saved = tokens * shape.saved_bytes_per_token_per_layer(compute_bytes=setting.compute_bytes)
    final_norm = tokens * hidden * (8 + setting.compute_bytes)  # as each layer norm (saved_bytes_per_token_per_layer)
    if setting.gradient_checkpointing:
        terms["activations"] = shape.layers * tokens * hidden * setting.compute_bytes + final_norm
        recompute = layer_saved
    else:
        terms["activations"] = shape.layers * layer_saved + final_norm
        recompute = 0
    chunk_rows = min(setting.chunk_size, tokens)
    # loss workspace, bytes per [chunk, V] entry: five fp32 buffers, a bool clip mask, and with bf16 weights
    # two bf16 raw-logit buffers and a bf16 gradient copy
    per_entry = 5 * 4 + 1 + (3 * 2 if setting.compute_bytes == 2 else 0)
    per_entry += 2 * 4 + 1  # diagnostics transients: two fp32 [chunk, V] and one bool
    # plus the gradients the fused loss forms in forward: lm_head [V, H] fp32 and hidden [T, H]
    terms["loss_workspace"] = (chunk_rows * vocab * per_entry + vocab * hidden * 4
                               + tokens * hidden * setting.compute_bytes)
    terms["layer_recompute"] = recompute
    persistent = sum(value for key, value in terms.items() if key not in ("loss_workspace", "layer_recompute"))
    terms["peak"] = persistent + max(terms["loss_workspace"], recompute)
    return terms


def preset_micro_batch(*, by_cap: Mapping[int, int], default: int, cap: int) -> int:
    """The OPSD model presets' rule (recipe/opsd/config/model/*.yaml): ``micro_batch_by_cap[cap]``, else
    the preset's ``micro_batch``."""
    return int(by_cap.get(cap, default))
