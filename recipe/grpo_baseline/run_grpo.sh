#!/usr/bin/env bash
# GRPO control of the paper (appendix "GRPO Control Configuration") on verl 0.9.1's own trainer:
# the launcher (recipe/launch) composes recipe/grpo_baseline/config/grpo_trainer.yaml + presets +
# your hydra overrides (each key once), prints the effective settings and starts
# python -m verl.trainer.main_ppo.
#
#   bash recipe/grpo_baseline/run_grpo.sh                 # CPU: the toy demo, GRPO on the toy student
#   CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh   # CPU: 4-step smoke run on a random tiny model, ~2 min
#   CPU_DEMO=tiny CPU_NUM_RANKS=2 bash recipe/grpo_baseline/run_grpo.sh   # the same on 2 FSDP ranks over gloo
#   MODEL_PATH=/ckpt/sft_merged TRAIN_FILES=/data/dapo.parquet NGPUS=8 bash recipe/grpo_baseline/run_grpo.sh
#   MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=omr.parquet bash recipe/grpo_baseline/run_grpo.sh +experiment=released_grpo
#   python -m data_prep.dapo --out data/parquet/dapo/train.parquet      # the bundled DAPO-Math-17k as verl parquet
#   DEVICE=gpu MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=data/parquet/dapo/train.parquet \
#       bash recipe/grpo_baseline/run_grpo.sh --dry-run +experiment=released_grpo   # config only
#
# Token budgets of dynamic batching are derived from the caps (max_prompt_length +
# max_response_length). Environment: docs/launch.md.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m recipe.launch grpo "$@"
