# Environment and hydra overrides for verl's real vLLM rollout server on a CPU (source it).
#
#   bash recipe/cpu/vllm_cpu_venv.sh                 # once: builds $VLLM_VENV (main venv active)
#   source recipe/cpu/vllm_cpu_env.sh
#   CPU_DEMO=tiny STEPS=2 bash recipe/grpo_baseline/run_grpo.sh "${VLLM_CPU_OVERRIDES[@]}"
#   CPU_DEMO=tiny STEPS=2 bash recipe/opsd/run_opsd.sh "${VLLM_CPU_OVERRIDES[@]}"
#
# The launchers' CPU path (cpu_env.sh) stays as it is; these overrides come last and switch its
# rollout from `hf` to `vllm`. Why each item is needed: docs/vllm_cpu.md.

VLLM_VENV="${VLLM_VENV:-${CACHE_DIR:-${OPSD_CACHE:-${HOME}/.cache/opsd-verl}}/venv_vllm_cpu}"
if [[ ! -x "${VLLM_VENV}/bin/python" ]]; then
    echo "[vllm_cpu_env] no vLLM-CPU venv at ${VLLM_VENV}: run recipe/cpu/vllm_cpu_venv.sh first" >&2
    return 2 2>/dev/null || exit 2
fi
# Every process of the run (driver, Ray workers, vLLM engine) uses the vLLM venv's interpreter.
export PYTHON="${VLLM_VENV}/bin/python"
# vLLM's CPU platform, not its CUDA default (without it: "Illegal instruction" in the TaskRunner).
export VLLM_TARGET_DEVICE=cpu
# KV-cache size in GiB (vLLM-CPU reserves it up front).
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"

VLLM_CPU_OVERRIDES=(
    actor_rollout_ref.rollout.name=vllm
    # No CUDA graphs / torch.compile on CPU.
    actor_rollout_ref.rollout.enforce_eager=True
    # Sleep mode (freeing weights/KV between rollouts) is CUDA-only: "Sleep mode is not supported on current platform".
    actor_rollout_ref.rollout.free_cache_engine=False
    +actor_rollout_ref.rollout.enable_sleep_mode=False
    # Small engine limits for the CPU runs (vLLM sizes its buffers by them).
    actor_rollout_ref.rollout.max_model_len="${VLLM_MAX_MODEL_LEN:-512}"
    actor_rollout_ref.rollout.max_num_batched_tokens="${VLLM_MAX_NUM_BATCHED_TOKENS:-1024}"
)
