#!/usr/bin/env bash
# Post-training pipeline of the paper (sec. "pipeline", app:sft_grpo_control, app:sft_grpo_then_opsd):
# SFT -> merge -> GRPO -> merge -> OPSD, each stage a launch of recipe/launch starting from the
# previous stage's merged HF checkpoint (recipe/tools/pipeline.py).
#
#   bash scripts/pipeline_sft_grpo_opsd.sh                  # CPU: tiny model + toy data, ~2.5 min
#   BASE_MODEL=/models/Qwen3-4B-Base SFT_FILES=/data/omr_sft.parquet GRPO_TRAIN_FILES=/data/dapo.parquet \
#   OPSD_TRAIN_FILES=/data/openthoughts.parquet WORK_DIR=/ckpt/pipeline NGPUS=8 \
#       bash scripts/pipeline_sft_grpo_opsd.sh opsd:+model=qwen3_4b
#   bash scripts/pipeline_sft_grpo_opsd.sh --dry-run        # print every stage's final config, run nothing
#
# Arguments: --dry-run and per-stage hydra overrides <stage>:<override> (stage: sft, grpo, opsd).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m recipe.tools.pipeline "$@"
