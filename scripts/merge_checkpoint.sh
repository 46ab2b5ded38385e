#!/usr/bin/env bash
# Merge a verl FSDP checkpoint into a Hugging Face model directory (recipe/common/merge.py).
#
#   bash scripts/merge_checkpoint.sh CKPT TARGET_DIR
#   CPU_DEMO=tiny CKPT_DIR=runs/tiny_opsd bash recipe/opsd/run_opsd.sh   # CPU: a run to merge, ~1 min
#   bash scripts/merge_checkpoint.sh runs/tiny_opsd runs/tiny_opsd_merged
#
# CKPT: a run directory (its latest checkpoint), a global_step_N directory or the shard directory.
# TARGET_DIR must not exist yet.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m recipe.common.merge "$@"
