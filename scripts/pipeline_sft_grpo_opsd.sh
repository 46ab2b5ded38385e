#!/usr/bin/env bash
# Post-training pipeline of the paper (sec. "pipeline", app:sft_grpo_control, app:sft_grpo_then_opsd):
#   SFT -> merge -> GRPO -> merge -> OPSD, each stage starting from the previous stage's merged
#   HF checkpoint (for OPSD: student and frozen teacher both = the merged GRPO actor).
#
#   bash scripts/pipeline_sft_grpo_opsd.sh              # CPU: tiny model + toy data, a few minutes
#   BASE_MODEL=/models/Qwen3-4B-Base SFT_FILES=/data/omr_sft.parquet \
#   GRPO_TRAIN_FILES=/data/dapo.parquet OPSD_TRAIN_FILES=/data/openthoughts.parquet \
#   OPSD_VAL_FILES=/data/openthoughts_val.parquet WORK_DIR=/ckpt/pipeline NGPUS=8 \
#       bash scripts/pipeline_sft_grpo_opsd.sh
#
#   bash scripts/pipeline_sft_grpo_opsd.sh --dry-run    # print the stage commands, run nothing
#
# Layout under WORK_DIR: sft/, sft_merged/, grpo/, grpo_merged/, opsd/. A stage whose merged
# directory exists is skipped, so rerunning the command continues an interrupted pipeline
# (each stage's own run script also resumes from its last checkpoint).
# Extra verl overrides per stage: SFT_ARGS, GRPO_ARGS, OPSD_ARGS (whitespace-separated).
# Environment: BASE_MODEL, SFT_FILES, GRPO_TRAIN_FILES, GRPO_VAL_FILES, OPSD_TRAIN_FILES,
# OPSD_VAL_FILES, WORK_DIR, CACHE_DIR, NGPUS, DEVICE (cpu|gpu; default gpu iff BASE_MODEL is
# set), PYTHON, DRY_RUN=1 (same as --dry-run).
# Compute per stage: $WORK_DIR/<stage>/run_times.jsonl (wall time) and the metrics jsonl
# next to it (timing_s/step per step); docs/cpu_path.md.
set -euo pipefail

DRY_RUN="${DRY_RUN:-0}"
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY_RUN=1
    shift
fi
if [[ $# -ne 0 ]]; then
    echo "usage: $0 [--dry-run]   (stage overrides go in SFT_ARGS / GRPO_ARGS / OPSD_ARGS)" >&2
    exit 2
fi

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
export PYTHON="${PYTHON:-python}"
DEVICE="${DEVICE:-$([[ -n "${BASE_MODEL:-}" ]] && echo gpu || echo cpu)}"
WORK_DIR="${WORK_DIR:-$REPO_ROOT/checkpoints/pipeline_${DEVICE}}"
CACHE_DIR="${CACHE_DIR:-${OPSD_CACHE:-$HOME/.cache/opsd-verl}}"
[[ "$DRY_RUN" == 1 ]] || mkdir -p "$WORK_DIR"
# Each stage logs metrics under its own CKPT_DIR; an inherited path would mix the stages.
unset VERL_FILE_LOGGER_PATH
read -r -a SFT_EXTRA <<< "${SFT_ARGS:-}"
read -r -a GRPO_EXTRA <<< "${GRPO_ARGS:-}"
read -r -a OPSD_EXTRA <<< "${OPSD_ARGS:-}"

# Print a command (shell-quoted, so it can be copied), then run it unless DRY_RUN=1.
run() {
    echo "[pipeline] +$(printf ' %q' "$@")"
    [[ "$DRY_RUN" == 1 ]] || "$@"
}

stage() {
    echo "[pipeline] ===== $1 ($(date -u +%H:%M:%S)) ====="
}

merge_latest() {
    run bash scripts/merge_checkpoint.sh "$1" "$2"
}

if [[ "$DEVICE" == cpu ]]; then
    BASE_MODEL="${BASE_MODEL:-$CACHE_DIR/tiny_qwen3}"
    run "$PYTHON" scripts/build_tiny_model.py --if-missing --out-dir "$BASE_MODEL" --data-dir "$CACHE_DIR/tiny_data"
else
    : "${BASE_MODEL:?set BASE_MODEL (HF checkpoint the SFT stage starts from)}"
    : "${SFT_FILES:?set SFT_FILES (python -m data_prep.sft output)}"
    : "${GRPO_TRAIN_FILES:?set GRPO_TRAIN_FILES (verl parquet)}"
    : "${OPSD_TRAIN_FILES:?set OPSD_TRAIN_FILES (verl parquet)}"
    : "${OPSD_VAL_FILES:?set OPSD_VAL_FILES (verl parquet)}"
fi

START=$(date +%s)

if [[ ! -d "$WORK_DIR/sft_merged" ]]; then
    stage "SFT from $BASE_MODEL"
    run env DEVICE="$DEVICE" MODEL_PATH="$BASE_MODEL" CKPT_DIR="$WORK_DIR/sft" CACHE_DIR="$CACHE_DIR" \
        ${SFT_FILES:+SFT_FILES="$SFT_FILES"} bash recipe/sft/run_sft.sh "${SFT_EXTRA[@]}"
    merge_latest "$WORK_DIR/sft" "$WORK_DIR/sft_merged"
fi

if [[ ! -d "$WORK_DIR/grpo_merged" ]]; then
    stage "GRPO from $WORK_DIR/sft_merged"
    run env DEVICE="$DEVICE" MODEL_PATH="$WORK_DIR/sft_merged" CKPT_DIR="$WORK_DIR/grpo" CACHE_DIR="$CACHE_DIR" \
        ${GRPO_TRAIN_FILES:+TRAIN_FILES="$GRPO_TRAIN_FILES"} ${GRPO_VAL_FILES:+VAL_FILES="$GRPO_VAL_FILES"} \
        bash recipe/grpo_baseline/run_grpo.sh "${GRPO_EXTRA[@]}"
    merge_latest "$WORK_DIR/grpo" "$WORK_DIR/grpo_merged"
fi

stage "OPSD from $WORK_DIR/grpo_merged (student = teacher = GRPO actor)"
run env OPSD_DEVICE="$DEVICE" MODEL_PATH="$WORK_DIR/grpo_merged" CKPT_DIR="$WORK_DIR/opsd" OPSD_CACHE="$CACHE_DIR" \
    ${OPSD_TRAIN_FILES:+TRAIN_FILES="$OPSD_TRAIN_FILES"} ${OPSD_VAL_FILES:+VAL_FILES="$OPSD_VAL_FILES"} \
    bash recipe/opsd/run_opsd.sh "${OPSD_EXTRA[@]}"

END=$(date +%s)
[[ "$DRY_RUN" == 1 ]] || echo "[pipeline] done in $((END - START)) s; checkpoints in $WORK_DIR"
