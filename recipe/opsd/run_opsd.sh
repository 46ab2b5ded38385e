#!/usr/bin/env bash
# OPSD (On-Policy Self-Distillation) with verl: the launcher (recipe/launch) composes the config
# (recipe/opsd/config/opsd_trainer.yaml + presets + your hydra overrides, each key once), prints
# the effective settings and starts python -m recipe.opsd.main_opsd.
#
#   bash recipe/opsd/run_opsd.sh                          # CPU: the toy demo (docs/toy_world.md), ~9 min
#   CPU_DEMO=tiny bash recipe/opsd/run_opsd.sh            # CPU: 4-step smoke run on a random tiny model, ~2 min
#   MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=train.parquet NGPUS=8 bash recipe/opsd/run_opsd.sh
#   TRAIN_FILES=train.parquet bash recipe/opsd/run_opsd.sh +model=qwen3_4b +experiment=rollout_256
#   python -m recipe.toy.demo --out-dir tiny              # toy problems as verl parquet (tiny/train.parquet, ...)
#   DEVICE=gpu TRAIN_FILES=tiny/train.parquet bash recipe/opsd/run_opsd.sh --dry-run +model=falcon_h1r_7b  # config only
#
# Arguments: hydra overrides (and --dry-run). Rerunning the same command resumes from the newest
# checkpoint in CKPT_DIR. Environment (DEVICE, MODEL_PATH, TRAIN_FILES, VAL_FILES, CKPT_DIR,
# OPSD_CACHE, STEPS, NGPUS, NNODES, CPU_NUM_RANKS, CPU_DEMO, PYTHON): docs/launch.md.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m recipe.launch opsd "$@"
