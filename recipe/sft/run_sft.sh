#!/usr/bin/env bash
# Supervised initialization (paper appendix "Supervised-Initialization Configuration") on
# verl 0.9.1's SFT trainer: assistant-token loss, Qwen3 thinking template.
#
#   bash recipe/sft/run_sft.sh                                  # CPU smoke run: tiny model, toy data
#   MODEL_PATH=/models/Qwen3-4B-Base SFT_FILES=/data/omr_cot_sft.parquet CKPT_DIR=/ckpt/sft \
#   NGPUS=8 bash recipe/sft/run_sft.sh [verl overrides...]
#
# SFT_FILES is a parquet with a `messages` column (python -m data_prep.sft).
# Without MODEL_PATH the run is the CPU path: the tiny model, toy data and its SFT parquet are
# built into $CACHE_DIR if missing, 3 steps. Extra arguments are verl/hydra overrides.
# Environment: MODEL_PATH, SFT_FILES, CKPT_DIR, NGPUS, NNODES, CACHE_DIR, PYTHON, DEVICE (cpu|gpu).
# Merge a checkpoint to HF format: bash scripts/merge_checkpoint.sh $CKPT_DIR/global_step_N <out>.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"
PYTHON="${PYTHON:-python}"
DEVICE="${DEVICE:-$([[ -n "${MODEL_PATH:-}" ]] && echo gpu || echo cpu)}"
CACHE_DIR="${CACHE_DIR:-${OPSD_CACHE:-$HOME/.cache/opsd-verl}}"
CKPT_DIR="${CKPT_DIR:-$REPO_ROOT/checkpoints/sft_${DEVICE}}"
mkdir -p "$CKPT_DIR"
source "$REPO_ROOT/recipe/launch/run_log.sh"
# verl's file logger truncates its file: a resumed launch logs to metrics.1.jsonl, ... instead.
export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$(next_free_path "$CKPT_DIR/metrics" jsonl)}"

ARGS=(
    --config-path="$REPO_ROOT/recipe/sft/config"
    --config-name=sft_trainer
    trainer.default_local_dir="$CKPT_DIR"
)

if [[ "$DEVICE" == cpu ]]; then
    source "$REPO_ROOT/recipe/cpu/env.sh"
    NPROC="$CPU_NUM_RANKS"
    MODEL_PATH="${MODEL_PATH:-$CACHE_DIR/tiny_qwen3}"
    "$PYTHON" scripts/build_tiny_model.py --if-missing --out-dir "$MODEL_PATH" --data-dir "$CACHE_DIR/tiny_data"
    if [[ -z "${SFT_FILES:-}" ]]; then
        SFT_FILES="$CACHE_DIR/tiny_data/sft_train.parquet"
        [[ -f "$SFT_FILES" ]] || "$PYTHON" -m data_prep.sft \
            --input "$CACHE_DIR/tiny_data/train.parquet" --out "$SFT_FILES"
    fi
    STEPS="${STEPS:-3}"
    ARGS+=(
        "${CPU_SFT_OVERRIDES[@]}"
        data.train_batch_size=8
        data.micro_batch_size_per_gpu=4
        data.max_length=256
        data.max_token_len_per_gpu=1024
        optim.lr=1e-3
        trainer.total_training_steps="$STEPS"
        trainer.save_freq="$STEPS"
        trainer.experiment_name=sft_cpu_tiny
    )
else
    : "${MODEL_PATH:?set MODEL_PATH to an HF model directory}"
    : "${SFT_FILES:?set SFT_FILES to the SFT parquet (messages column)}"
    NPROC="${NGPUS:-8}"
    if [[ "${NNODES:-1}" != 1 ]]; then
        echo "run_sft.sh launches one node (torchrun --standalone); for NNODES=$NNODES run torchrun per node" >&2
        exit 2
    fi
    ARGS+=(
        trainer.n_gpus_per_node="$NPROC"
        trainer.nnodes="${NNODES:-1}"
    )
fi

ARGS+=(
    model.path="$MODEL_PATH"
    data.train_files="$SFT_FILES"
)

echo "[run_sft] device=$DEVICE model=$MODEL_PATH data=$SFT_FILES ckpt=$CKPT_DIR metrics=$VERL_FILE_LOGGER_PATH"
timed_launch sft "$DEVICE" $((NPROC * ${NNODES:-1})) "$CKPT_DIR" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
    -m verl.trainer.sft_trainer "${ARGS[@]}" "$@"
