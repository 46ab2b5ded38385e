#!/usr/bin/env bash
# Supervised initialization (paper appendix "Supervised-Initialization Configuration") on verl
# 0.9.1's SFT trainer: the launcher (recipe/launch) composes recipe/sft/config/sft_trainer.yaml +
# your hydra overrides (each key once), prints the effective settings and starts
# torchrun -m verl.trainer.sft_trainer (one process per GPU, one node).
#
#   bash recipe/sft/run_sft.sh                            # CPU: the tiny demo, 3 SFT steps on a random tiny model, ~1 min
#   MODEL_PATH=/models/Qwen3-4B-Base TRAIN_FILES=/data/omr_cot_sft.parquet NGPUS=8 bash recipe/sft/run_sft.sh
#   python -m recipe.toy.demo --out-dir tiny              # toy conversations as a messages parquet (tiny/sft.parquet)
#   DEVICE=gpu MODEL_PATH=Qwen/Qwen3-4B-Base TRAIN_FILES=tiny/sft.parquet bash recipe/sft/run_sft.sh --dry-run  # config only
#
# TRAIN_FILES is a parquet with a `messages` column (python -m data_prep.sft). Merge a checkpoint
# to HF format: bash scripts/merge_checkpoint.sh $CKPT_DIR <out>. Environment: docs/launch.md.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m recipe.launch sft "$@"
