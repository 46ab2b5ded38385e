#!/usr/bin/env bash
# Run OPSD (On-Policy Self-Distillation) with verl.
#
#   bash recipe/opsd/run_opsd.sh                       # CPU: the toy world (recipe/toy/run_toy.sh opsd)
#   CPU_DEMO=tiny bash recipe/opsd/run_opsd.sh         # CPU smoke run: random tiny model, 4 steps
#   MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=train.parquet VAL_FILES=val.parquet \
#       CKPT_DIR=ckpt/opsd bash recipe/opsd/run_opsd.sh trainer.n_gpus_per_node=2   # the paper's recipe on GPUs
#
# Any argument is a verl/hydra override passed through (config: recipe/opsd/config/opsd_trainer.yaml).
# Rerunning the same command resumes from the newest checkpoint in CKPT_DIR (trainer.resume_mode=auto).
#
# Environment:
#   OPSD_DEVICE   cpu | gpu (default: gpu if nvidia-smi sees a GPU, else cpu)
#   CPU_DEMO      CPU without MODEL_PATH / TRAIN_FILES: toy (default: build or reuse the SFT-trained
#                 toy student, OPSD on it, held-out accuracy before/after; docs/toy_world.md) |
#                 tiny (a random tiny Qwen3 on toy addition data, STEPS=4: seconds, no learning)
#   MODEL_PATH    student = teacher initial checkpoint (CPU default: the toy student; CPU_DEMO=tiny: a random tiny Qwen3)
#   TRAIN_FILES / VAL_FILES  verl parquet files (CPU default: toy addition problems)
#   CKPT_DIR      checkpoints + logs (default: $CACHE_DIR/checkpoints/<experiment>)
#   CACHE_DIR     where the CPU defaults are built (default: $OPSD_CACHE or ~/.cache/opsd-verl)
#   STEPS         CPU only: training steps (toy world default 150, recipe/toy/run_toy.sh; CPU_DEMO=tiny
#                 default 4 with a checkpoint every 2 steps and at the last)
#   CPU_NUM_RANKS CPU only: FSDP ranks over gloo (default 1; recipe/cpu/env.sh)
#   NGPUS, NNODES GPU only: GPUs per node (default: all nvidia-smi lists) and nodes (default 1)
#   ROLLOUT_NAME  GPU rollout engine: vllm (default) | sglang
#   PYTHON        python interpreter (default: python)
# Logs: per-step metrics (opsd/*, timing_s/*) in $CKPT_DIR/metrics.jsonl (verl's file logger; a
# resumed launch writes metrics.1.jsonl, ...; VERL_FILE_LOGGER_PATH overrides); one line per launch (wall time, devices, exit code) in
# $CKPT_DIR/run_times.jsonl (recipe/launch/run_log.sh).
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python}"
OPSD_CACHE="${CACHE_DIR:-${OPSD_CACHE:-${HOME}/.cache/opsd-verl}}"
EXPERIMENT_NAME="${EXPERIMENT_NAME:-opsd_default}"

if [[ -z "${OPSD_DEVICE:-}" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then OPSD_DEVICE=gpu; else OPSD_DEVICE=cpu; fi
fi

if [[ "${OPSD_DEVICE}" == cpu && -z "${MODEL_PATH:-}" && -z "${TRAIN_FILES:-}" ]]; then
    case "${CPU_DEMO:-toy}" in
        toy) exec bash "${REPO_DIR}/recipe/toy/run_toy.sh" opsd "$@" ;;
        tiny) ;;
        *) echo "[run_opsd] CPU_DEMO=${CPU_DEMO} is not one of: toy, tiny" >&2; exit 2 ;;
    esac
fi

# ---- CPU smoke defaults (a tiny random Qwen3 and toy addition data; replace to change the demo) ----
CPU_DEFAULT_MODEL_DIR="${OPSD_CACHE}/tiny_qwen3"
CPU_DEFAULT_DATA_DIR="${OPSD_CACHE}/tiny_data"
CPU_DEFAULT_STEPS="${STEPS:-4}"
CPU_DEFAULT_SAVE_FREQ=2
CPU_DEFAULT_BATCH_SIZE=4
CPU_DEFAULT_MICRO_BATCH=2
CPU_DEFAULT_RESPONSE_LENGTH=32
CPU_DEFAULT_LR=1e-4

OVERRIDES=()
if [[ "${OPSD_DEVICE}" == "cpu" ]]; then
    MODEL_PATH="${MODEL_PATH:-${CPU_DEFAULT_MODEL_DIR}}"
    TRAIN_FILES="${TRAIN_FILES:-${CPU_DEFAULT_DATA_DIR}/train.parquet}"
    VAL_FILES="${VAL_FILES:-${CPU_DEFAULT_DATA_DIR}/val.parquet}"
    if [[ "${MODEL_PATH}" == "${CPU_DEFAULT_MODEL_DIR}" && ! -f "${MODEL_PATH}/config.json" ]]; then
        echo "[run_opsd] building the tiny CPU model in ${MODEL_PATH}"
        (cd "${REPO_DIR}" && "${PYTHON}" -c "from recipe.models.tiny import build_tiny_model; build_tiny_model('${MODEL_PATH}', seed=0, overwrite=True)")
    fi
    if [[ "${TRAIN_FILES}" == "${CPU_DEFAULT_DATA_DIR}/train.parquet" && ! -f "${TRAIN_FILES}" ]]; then
        echo "[run_opsd] building toy data in ${CPU_DEFAULT_DATA_DIR}"
        rm -f "${CPU_DEFAULT_DATA_DIR}/val.parquet"
        (cd "${REPO_DIR}" && "${PYTHON}" -c "from recipe.models.tiny import build_tiny_parquet; build_tiny_parquet('${CPU_DEFAULT_DATA_DIR}', num_train=64, num_val=16, seed=0)")
    fi
    # shellcheck source=../cpu/env.sh
    source "${REPO_DIR}/recipe/cpu/env.sh"
    OVERRIDES+=(
        "${CPU_OVERRIDES[@]}"
        data.train_batch_size="${CPU_DEFAULT_BATCH_SIZE}"
        data.max_response_length="${CPU_DEFAULT_RESPONSE_LENGTH}"
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="${CPU_DEFAULT_MICRO_BATCH}"
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="${CPU_DEFAULT_MICRO_BATCH}"
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="${CPU_DEFAULT_MICRO_BATCH}"
        actor_rollout_ref.actor.optim.lr="${CPU_DEFAULT_LR}"
        trainer.total_training_steps="${CPU_DEFAULT_STEPS}"
        trainer.save_freq="${CPU_DEFAULT_SAVE_FREQ}"
    )
    N_DEVICES="${CPU_NUM_RANKS}"
else
    : "${MODEL_PATH:?set MODEL_PATH (HF checkpoint of the student = initial teacher)}"
    : "${TRAIN_FILES:?set TRAIN_FILES (verl parquet, see docs/ARCHITECTURE.md)}"
    : "${VAL_FILES:?set VAL_FILES (verl parquet)}"
    NGPUS="${NGPUS:-$(nvidia-smi -L | wc -l)}"
    OVERRIDES+=(
        actor_rollout_ref.rollout.name="${ROLLOUT_NAME:-vllm}"
        actor_rollout_ref.rollout.gpu_memory_utilization="${GPU_MEMORY_UTILIZATION:-0.5}"
        trainer.n_gpus_per_node="${NGPUS}"
        trainer.nnodes="${NNODES:-1}"
    )
    N_DEVICES=$((NGPUS * ${NNODES:-1}))
fi

CKPT_DIR="${CKPT_DIR:-${OPSD_CACHE}/checkpoints/${EXPERIMENT_NAME}}"
mkdir -p "${CKPT_DIR}"
# shellcheck source=../launch/run_log.sh
source "${REPO_DIR}/recipe/launch/run_log.sh"
# verl's file logger truncates its file: a resumed launch logs to metrics.1.jsonl, ... instead.
export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$(next_free_path "${CKPT_DIR}/metrics" jsonl)}"
echo "[run_opsd] device=${OPSD_DEVICE} model=${MODEL_PATH} train=${TRAIN_FILES} checkpoints=${CKPT_DIR}"
cd "${REPO_DIR}"
timed_launch opsd "${OPSD_DEVICE}" "${N_DEVICES}" "${CKPT_DIR}" "${PYTHON}" -m recipe.opsd.main_opsd \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    data.train_files="${TRAIN_FILES}" \
    data.val_files="${VAL_FILES}" \
    trainer.default_local_dir="${CKPT_DIR}" \
    trainer.experiment_name="${EXPERIMENT_NAME}" \
    reward.custom_reward_function.path="${REPO_DIR}/recipe/common/reward.py" \
    reward.custom_reward_function.name=compute_score \
    'trainer.logger=[console,file]' \
    "${OVERRIDES[@]}" \
    "$@"
