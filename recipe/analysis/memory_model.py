"""Per-GPU peak memory of one OPSD actor update (pure: stdlib only; docs/cost.md).

The update of the OPSD trainer (recipe/opsd): per micro-batch the frozen teacher's forward
(no grad, its final hidden states kept), the student's forward with gradient checkpointing, the
fused lm_head + divergence loss with its diagnostics (recipe.opsd.core.signals, row chunks of
``chunk_size`` x V), backward; an AdamW step per mini-batch. verl 0.9.1's FSDP2 engine
(``workers/engine/fsdp/transformer_impl.py``): the actor is loaded in fp32 (master weights,
gradients, AdamW's two moments all fp32, sharded over the n data-parallel GPUs) and computes in
bf16 (``MixedPrecisionPolicy(param_dtype=bf16)``); a forward-only model (the teacher) is loaded
in bf16 with ``CPUOffloadPolicy``: its shards live in host memory and each layer is copied to
the GPU for its forward.

Terms (bytes per GPU), P = parameters, n = GPUs, T = tokens of one micro-batch (the callers use
micro-batch x (prompt cap + rollout cap): the worst case, every sample at both caps), V = vocabulary:

- student: P x (4 param + 4 grad + 8 AdamW) / n, plus the unsharded bf16 working copies FSDP2
  gathers (two decoder layers: current + prefetched; the root module's embedding, final norm and
  lm_head, which stay gathered from forward to backward).
- teacher: offloaded: the gathered bf16 working copies only (two layers + root); not offloaded:
  P x 2 / n resident plus the same working copies. Its final hidden states [T, H] are kept for the loss.
- activations: gradient checkpointing on: every layer's input [T, H], plus one layer's saved
  tensors while it is recomputed in backward; off: every layer's saved tensors
  (``ModelShape.saved_bytes_per_token_per_layer``: sdpa / flash attention, no T x T score
  matrix; RMSNorms save fp32 copies). Plus the final norm's saved tensors.
- loss: the fused loss's [chunk, V] workspace (five fp32 buffers, a bool clip mask, and with
  bf16 weights two bf16 raw-logit buffers and a bf16 gradient copy), the diagnostics'
  transients (two fp32 [chunk, V] and one bool), and the gradients it forms in forward: lm_head
  [V, H] fp32 and hidden [T, H].

Peak = the persistent terms + the saved activations + the larger of the loss's transient and
one layer's recomputation in backward (they do not overlap: the loss runs before the layers'
backward). Not modelled: the CUDA context and allocator fragmentation (typically 1-3 GB on a GPU),
the rollout engine's memory (vLLM sleeps during the update in verl's colocated layout), the
optimizer's fp32 temporaries inside ``step``.
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
    """One actor update's layout. Defaults: verl 0.9.1's FSDP2 engine on GPUs (module docstring)."""

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
    """Bytes per GPU of every term and their ``peak`` (module docstring)."""
    s, n, t, h, v = setting, setting.n_gpus, setting.tokens, shape.hidden, shape.vocab
    p = shape.params
    working = 2 * shape.layer_params + shape.root_params  # gathered by FSDP2: two layers + root
    terms = {
        "student_params": p * s.param_bytes // n,
        "student_grads": p * s.grad_bytes // n,
        "optimizer": p * s.optimizer_bytes // n,
        "student_gathered": working * s.compute_bytes if s.fsdp else 0,
        "teacher_resident": 0 if s.teacher_offload else p * s.teacher_bytes // n,
        "teacher_gathered": working * s.teacher_bytes if s.fsdp else 0,
        "teacher_hidden": t * h * s.teacher_bytes,
    }
    layer_saved = t * shape.saved_bytes_per_token_per_layer(compute_bytes=s.compute_bytes)
    final_norm = t * h * (8 + s.compute_bytes)  # as each layer norm (see saved_bytes_per_token_per_layer)
    if s.gradient_checkpointing:
        terms["activations"] = shape.layers * t * h * s.compute_bytes + final_norm
        recompute = layer_saved
    else:
        terms["activations"] = shape.layers * layer_saved + final_norm
        recompute = 0
    rows = min(s.chunk_size, t)
    per_entry = 5 * 4 + 1 + (3 * 2 if s.compute_bytes == 2 else 0)  # loss workspace, bytes per [chunk, V] entry
    per_entry += 2 * 4 + 1  # diagnostics transients
    terms["loss_workspace"] = rows * v * per_entry + v * h * 4 + t * h * s.compute_bytes
    terms["layer_recompute"] = recompute
    persistent = sum(value for key, value in terms.items() if key not in ("loss_workspace", "layer_recompute"))
    terms["peak"] = persistent + max(terms["loss_workspace"], recompute)
    return terms


def preset_micro_batch(*, by_cap: Mapping[int, int], default: int, cap: int) -> int:
    """The OPSD model presets' rule (recipe/opsd/config/model/*.yaml): ``micro_batch_by_cap[cap]``, else
    the preset's ``micro_batch``."""
    return int(by_cap.get(cap, default))
