#!/usr/bin/env bash
# Merge a verl FSDP checkpoint into a Hugging Face model directory (verl.model_merger).
#
#   bash scripts/merge_checkpoint.sh CKPT TARGET_DIR
#
# CKPT may be a run directory (trainer.default_local_dir: the latest checkpoint is used,
# from latest_checkpointed_iteration.txt), a global_step_N directory of an RL run (its actor/
# shards are merged) or of an SFT run (shards at its top level), or the shard directory itself.
# TARGET_DIR must not exist yet. Works with or without the CPU plugin.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 CKPT TARGET_DIR" >&2
    exit 2
fi
CKPT="$1"
TARGET="$2"
PYTHON="${PYTHON:-python}"

if [[ -f "$CKPT/latest_checkpointed_iteration.txt" ]]; then
    CKPT="$CKPT/global_step_$(cat "$CKPT/latest_checkpointed_iteration.txt")"
fi
if [[ -d "$CKPT/actor" ]]; then
    CKPT="$CKPT/actor"
fi
if ! compgen -G "$CKPT/model_world_size_*_rank_0.pt" > /dev/null; then
    echo "merge_checkpoint: no FSDP shards (model_world_size_*_rank_0.pt) in $CKPT" >&2
    exit 1
fi
if [[ -e "$TARGET" ]]; then
    echo "merge_checkpoint: $TARGET exists; refusing to overwrite it" >&2
    exit 1
fi

echo "[merge_checkpoint] $CKPT -> $TARGET"
"$PYTHON" -m verl.model_merger merge --backend fsdp --local_dir "$CKPT" --target_dir "$TARGET"
