#!/usr/bin/env bash
# GRPO control (paper appendix "GRPO Control Configuration") on verl 0.9.1's own trainer.
#
#   bash recipe/grpo_baseline/run_grpo.sh                       # CPU: the toy world (recipe/toy/run_toy.sh grpo)
#   CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh         # CPU smoke run: tiny model, toy data
#   MODEL_PATH=/ckpt/sft_merged TRAIN_FILES=/data/dapo_train.parquet VAL_FILES=/data/val.parquet \
#   CKPT_DIR=/ckpt/grpo NGPUS=8 bash recipe/grpo_baseline/run_grpo.sh [verl overrides...]
#
# Without MODEL_PATH the run is the CPU path (recipe/cpu/env.sh). Without TRAIN_FILES either,
# CPU_DEMO=toy (default) runs GRPO on the toy student with a held-out table before/after
# (docs/toy_world.md); CPU_DEMO=tiny builds a random tiny model and toy data into $CACHE_DIR,
# 4 short steps, ~2 minutes on 2 cores.
# With MODEL_PATH it is the paper's configuration (config/grpo_trainer.yaml) with vLLM
# rollouts (ROLLOUT=sglang to switch). Extra arguments are verl/hydra overrides, appended last.
#
# Environment (stable names; docs/cpu_path.md):
#   MODEL_PATH   HF model directory (unset: CPU path, CPU_DEMO=toy | tiny)
#   TRAIN_FILES, VAL_FILES  verl parquet files (CPU default: toy addition data in $CACHE_DIR)
#   CKPT_DIR     checkpoints + logs (default: <repo>/checkpoints/grpo_<device>)
#   DEVICE       cpu | gpu (default: gpu iff MODEL_PATH is set)
#   NGPUS, NNODES  GPUs per node and nodes (GPU path); CPU_NUM_RANKS FSDP ranks (CPU path)
#   ROLLOUT      vllm (default) | sglang;  ROLLOUT_TP  rollout tensor-parallel size
#   STEPS        CPU only: training steps (toy world default 150 (recipe/toy/run_toy.sh); CPU_DEMO=tiny default 4; checkpoint at the last step)
#   CACHE_DIR    where the CPU tiny model / data are built (default ~/.cache/opsd-verl)
#   PYTHON       interpreter (default python)
# Logs: console; per-step metrics incl. timing_s/step in $CKPT_DIR/metrics.jsonl (verl file
# logger; a resumed launch writes metrics.1.jsonl, ...; VERL_FILE_LOGGER_PATH overrides);
# one line per launch (wall time, devices, exit code) in $CKPT_DIR/run_times.jsonl.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"
PYTHON="${PYTHON:-python}"
DEVICE="${DEVICE:-$([[ -n "${MODEL_PATH:-}" ]] && echo gpu || echo cpu)}"
CACHE_DIR="${CACHE_DIR:-${OPSD_CACHE:-$HOME/.cache/opsd-verl}}"
if [[ "$DEVICE" == cpu && -z "${MODEL_PATH:-}" && -z "${TRAIN_FILES:-}" ]]; then
    case "${CPU_DEMO:-toy}" in
        toy) exec bash "$REPO_ROOT/recipe/toy/run_toy.sh" grpo "$@" ;;
        tiny) ;;
        *) echo "[run_grpo] CPU_DEMO=${CPU_DEMO} is not one of: toy, tiny" >&2; exit 2 ;;
    esac
fi
CKPT_DIR="${CKPT_DIR:-$REPO_ROOT/checkpoints/grpo_${DEVICE}}"
mkdir -p "$CKPT_DIR"
source "$REPO_ROOT/recipe/launch/run_log.sh"
# verl's file logger truncates its file: a resumed launch logs to metrics.1.jsonl, ... instead.
export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$(next_free_path "$CKPT_DIR/metrics" jsonl)}"

ARGS=(
    --config-path="$REPO_ROOT/recipe/grpo_baseline/config"
    --config-name=grpo_trainer
    reward.custom_reward_function.path="$REPO_ROOT/recipe/common/reward.py"
    trainer.default_local_dir="$CKPT_DIR"
)

if [[ "$DEVICE" == cpu ]]; then
    source "$REPO_ROOT/recipe/cpu/env.sh"
    MODEL_PATH="${MODEL_PATH:-$CACHE_DIR/tiny_qwen3}"
    TRAIN_FILES="${TRAIN_FILES:-$CACHE_DIR/tiny_data/train.parquet}"
    VAL_FILES="${VAL_FILES:-$CACHE_DIR/tiny_data/val.parquet}"
    "$PYTHON" scripts/build_tiny_model.py --if-missing --out-dir "$MODEL_PATH" --data-dir "$CACHE_DIR/tiny_data"
    STEPS="${STEPS:-4}"
    N_DEVICES="$CPU_NUM_RANKS"
    ARGS+=(
        "${CPU_OVERRIDES[@]}"
        data.max_prompt_length=192
        data.max_response_length=32
        data.train_batch_size=4
        actor_rollout_ref.rollout.n=4
        actor_rollout_ref.actor.ppo_mini_batch_size=4
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.optim.lr=1e-4
        trainer.total_training_steps="$STEPS"
        trainer.save_freq="$STEPS"
        trainer.experiment_name=grpo_cpu_tiny
    )
else
    : "${MODEL_PATH:?set MODEL_PATH to an HF model directory}"
    : "${TRAIN_FILES:?set TRAIN_FILES to the training parquet}"
    VAL_FILES="${VAL_FILES:-$TRAIN_FILES}"
    NGPUS="${NGPUS:-8}"
    N_DEVICES=$((NGPUS * ${NNODES:-1}))
    MAX_TOKENS_PER_GPU=$((1024 + 20480))
    ARGS+=(
        actor_rollout_ref.rollout.name="${ROLLOUT:-vllm}"
        actor_rollout_ref.rollout.tensor_model_parallel_size="${ROLLOUT_TP:-1}"
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MAX_TOKENS_PER_GPU"
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu="$MAX_TOKENS_PER_GPU"
        actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.ref.log_prob_max_token_len_per_gpu="$MAX_TOKENS_PER_GPU"
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        trainer.n_gpus_per_node="$NGPUS"
        trainer.nnodes="${NNODES:-1}"
    )
fi

ARGS+=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    data.train_files="$TRAIN_FILES"
    data.val_files="$VAL_FILES"
)

echo "[run_grpo] device=$DEVICE model=$MODEL_PATH ckpt=$CKPT_DIR metrics=$VERL_FILE_LOGGER_PATH"
timed_launch grpo "$DEVICE" "$N_DEVICES" "$CKPT_DIR" "$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
