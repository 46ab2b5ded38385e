# Environment and hydra overrides of the verl 0.9.1 CPU path (source it; do not execute it).
#
#   source recipe/cpu/env.sh
#   python -m verl.trainer.main_ppo ... "${CPU_OVERRIDES[@]}" "$@"
#
# Why each item is needed: docs/cpu_path.md. GPU runs must not source this file.

# No network at run time: everything (model, tokenizer, data) is local.
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export WANDB_MODE=disabled
export TOKENIZERS_PARALLELISM=false
# Loaded by `import verl` in every process (driver + Ray workers): cpu platform + hf rollout.
# The plugin must stay first; append your own modules after it (comma-separated).
export VERL_USE_EXTERNAL_MODULES="recipe.cpu.plugin${EXTRA_VERL_MODULES:+,${EXTRA_VERL_MODULES}}"
export VERL_PLATFORM=cpu
# verl registers its FSDP engine for cuda/npu only; this documented override selects it on CPU.
export VERL_ENGINE_DEVICE=cuda

# Number of FSDP ranks (= placeholder Ray GPUs = hf rollout replicas).
CPU_NUM_RANKS="${CPU_NUM_RANKS:-1}"

CPU_OVERRIDES=(
    # No flash-attn on CPU (HFModelConfig defaults to flash_attention_2).
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
    # Remove-padding relies on flash-attn varlen kernels.
    actor_rollout_ref.model.use_remove_padding=False
    # FSDP1 requires GPU-resident parameters (sync_module_states); FSDP2 runs over gloo.
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.fsdp_config.strategy=fsdp2
    actor_rollout_ref.ref.strategy=fsdp2
    # Offloading parameters to the host is meaningless when the device is the host.
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.ref.fsdp_config.param_offload=False
    # The batched HF-generate rollout server of recipe.cpu.rollout, one process per replica.
    actor_rollout_ref.rollout.name=hf
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    # One agent-loop worker, one reward worker, one TransferQueue storage unit: the
    # defaults (8 each) start ~24 extra Ray processes (~0.4 GB and seconds of start-up each).
    actor_rollout_ref.rollout.agent.num_workers=1
    reward.num_workers=1
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
    # Placeholder Ray GPUs: verl's resource pools only request Ray "GPU" resources.
    trainer.device=cpu
    trainer.nnodes=1
    trainer.n_gpus_per_node="${CPU_NUM_RANKS}"
    +ray_kwargs.ray_init.num_gpus="${CPU_NUM_RANKS}"
    # Logical CPUs for Ray's placement bundles (TaskRunner, TQ controller/storage, workers).
    +ray_kwargs.ray_init.num_cpus=32
    # The tokenised parquet loading runs in the trainer process.
    data.dataloader_num_workers=0
)

# The same shims for verl's SFT trainer (verl.trainer.sft_trainer, launched with torchrun).
CPU_SFT_OVERRIDES=(
    +model.override_config.attn_implementation=sdpa
    model.use_remove_padding=False
    engine.strategy=fsdp2
    # torch.compile of the loss helpers adds minutes of CPU compile time for tiny models.
    engine.use_torch_compile=False
    trainer.device=cpu
    trainer.nnodes=1
    trainer.n_gpus_per_node="${CPU_NUM_RANKS}"
    data.num_workers=0
)
