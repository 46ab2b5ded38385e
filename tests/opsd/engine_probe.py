"""Run the OPSD student forward of the real verl FSDP2 engine once, on CPU, and save what it produced.

    python tests/opsd/engine_probe.py <falcon_h1|granite|qwen3> <out_dir> [sft]

Not a test (run by ``test_engine_forward.py`` in a fresh process: the CPU platform patches
process-global state). World size 1 over gloo, fp32 parameters and compute. Writes
``<out_dir>/model`` (a tiny model of the given architecture + the character tokenizer) and
``<out_dir>/result.pt``: the batch, the engine's summed micro-batch loss, every parameter's
gradient after ``forward_backward_batch`` (two micro-batches) and the pre-clip gradient norm
verl's ``optimizer_step`` returns (= ``actor/grad_norm``). With ``sft``: the objective adds
``SFT_WEIGHT`` x the SFT term, and the batch carries SFT rows (``opsd_sft_*``: a prompt of
``SFT_PROMPT_LENS`` tokens, a solution of ``SOLUTION_LENS``), so the engine runs its second
student forward before the loss forward.
"""

from __future__ import annotations

import os
import sys

os.environ.update(
    VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", VERL_USE_EXTERNAL_MODULES="recipe.cpu.plugin",
    MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", HF_HUB_OFFLINE="1",
    TOKENIZERS_PARALLELISM="false",
)

import torch  # noqa: E402

import recipe.cpu.plugin  # noqa: E402,F401  (the cpu platform, before verl resolves devices)

PROMPT_LENS = (3, 5, 2, 4)
RESPONSE_LENS = (4, 2, 5, 3)
LOSS = dict(beta=0.0, clip_tau=0.05, student_temperature=1.1, chunk_size=3)
MICRO_BATCH = 2
SFT_WEIGHT = 0.5
SFT_PROMPT_LENS = (2, 4, 3, 1)
SOLUTION_LENS = (3, 1, 4, 2)


def tiny_model(arch: str, vocab_size: int, pad_token_id: int):
    """A randomly initialised tiny causal LM whose head scales ``h @ W.T`` (seed 0)."""
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, pad_token_id=pad_token_id, tie_word_embeddings=False)
    if arch == "falcon_h1":
        config = transformers.FalconH1Config(
            **common, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
            mamba_d_state=8, mamba_chunk_size=8, lm_head_multiplier=0.37,
        )
        cls = transformers.FalconH1ForCausalLM
    elif arch == "granite":
        config = transformers.GraniteConfig(**common, logits_scaling=8.0)
        cls = transformers.GraniteForCausalLM
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**common, head_dim=16)
        cls = transformers.Qwen3ForCausalLM
    else:
        raise ValueError(f"arch must be falcon_h1, granite or qwen3, got {arch!r}")
    torch.manual_seed(0)
    return cls(config)


def batch(vocab_size: int, hidden_size: int, pad_token_id: int) -> dict:
    """Left-padded prompts + right-padded responses (verl's layout) and a random teacher side."""
    gen = torch.Generator().manual_seed(1)
    b, p, r = len(PROMPT_LENS), max(PROMPT_LENS), max(RESPONSE_LENS)
    input_ids = torch.full((b, p + r), pad_token_id)
    attention_mask = torch.zeros(b, p + r, dtype=torch.long)
    responses = torch.full((b, r), pad_token_id)
    response_mask = torch.zeros(b, r, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        input_ids[i, p - pl:p] = torch.randint(0, vocab_size, (pl,), generator=gen)
        responses[i, :rl] = torch.randint(0, vocab_size, (rl,), generator=gen)
        input_ids[i, p:p + rl] = responses[i, :rl]
        attention_mask[i, p - pl:p + rl] = 1
        response_mask[i, :rl] = 1
    teacher_hidden = torch.randn(b, r, hidden_size, generator=gen) * response_mask[..., None]
    return {
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0), "responses": responses,
        "response_mask": response_mask, "teacher_hidden": teacher_hidden,
    }


def sft_rows(vocab_size: int, pad_token_id: int) -> dict:
    """The SFT rows: random prompt ids + solution ids, spliced as the trainer splices them."""
    from recipe.common.chat import splice_teacher_inputs

    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in SFT_PROMPT_LENS]
    width = max(SOLUTION_LENS)
    solutions = torch.full((len(SOLUTION_LENS), width), pad_token_id)
    mask = torch.zeros(len(SOLUTION_LENS), width, dtype=torch.long)
    for i, n in enumerate(SOLUTION_LENS):
        solutions[i, :n] = torch.randint(0, vocab_size, (n,), generator=gen)
        mask[i, :n] = 1
    spliced = splice_teacher_inputs(prompts, solutions, mask, pad_token_id=pad_token_id)
    return {"opsd_sft_input_ids": spliced["input_ids_BT"], "opsd_sft_attention_mask": spliced["attention_mask_BT"],
            "opsd_sft_position_ids": spliced["position_ids_BT"], "opsd_sft_responses": solutions,
            "opsd_sft_response_mask": mask}


def main(arch: str, out_dir: str, sft: bool = False) -> None:
    import torch.distributed as dist

    from recipe.models.tiny import build_char_tokenizer

    model_dir = os.path.join(out_dir, "model")
    tokenizer = build_char_tokenizer()
    model = tiny_model(arch, len(tokenizer), tokenizer.pad_token_id)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    tensors = batch(len(tokenizer), model.config.hidden_size, tokenizer.pad_token_id)
    if sft:
        tensors |= sft_rows(len(tokenizer), tokenizer.pad_token_id)

    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from verl import DataProto
    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import left_right_2_no_padding

    from recipe.opsd.core.config import LossConfig
    from recipe.opsd.engine import OPSD_FORWARD_KEY, RESPONSE_LENGTHS_KEY, opsd_engine_class
    from recipe.opsd.worker import opsd_loss_function

    model_config = HFModelConfig(
        path=model_dir, override_config={"attn_implementation": "eager"}, use_remove_padding=False,
        enable_gradient_checkpointing=False,
    )
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine = opsd_engine_class(FSDPEngineWithLMHead)(
        model_config=model_config,
        engine_config=FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", mixed_precision=fp32,
                                       use_torch_compile=False),
        optimizer_config=FSDPOptimizerConfig(lr=1e-3, total_training_steps=1, clip_grad=1.0),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    loss_config = LossConfig(**LOSS, sft_weight=SFT_WEIGHT if sft else 0.0)
    loss_fn = opsd_loss_function(loss_config, model_config, frozen_teacher_head=True)

    proto = DataProto.from_dict(
        tensors={**tensors, RESPONSE_LENGTHS_KEY: tensors["response_mask"].sum(-1)},
        meta_info={"temperature": LOSS["student_temperature"]},
    )
    data = left_right_2_no_padding(proto.to_tensordict())
    tu.assign_non_tensor(
        data, **{OPSD_FORWARD_KEY: "student_loss"}, micro_batch_size_per_gpu=MICRO_BATCH, use_dynamic_bsz=False,
        use_remove_padding=False, use_fused_kernels=False,
    )
    with engine.train_mode():
        engine.optimizer_zero_grad()
        output = engine.forward_backward_batch(data, loss_fn)
        grads = {name: p.grad.full_tensor().detach().clone() for name, p in engine.module.named_parameters()}
        grad_norm = engine.optimizer_step()
    # the SFT metrics summed over the micro-batches (SUM metrics; world size 1)
    metrics = {key: sum(m.aggregate() for m in (value if isinstance(value, list) else [value]))
               for key, value in output["metrics"].items() if key.startswith("opsd/sft")}
    torch.save(
        {"batch": tensors, "loss": float(sum(output["loss"])), "grads": grads, "grad_norm": grad_norm,
         "loss_config": LOSS, "sft_metrics": metrics},
        os.path.join(out_dir, "result.pt"),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sft=sys.argv[3:] == ["sft"])
