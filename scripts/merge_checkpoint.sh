#!/usr/bin/env bash
# Merge a verl FSDP checkpoint into a Hugging Face model directory (verl.model_merger).
#
#   bash scripts/merge_checkpoint.sh CKPT TARGET_DIR
#
# CKPT may be a run directory (trainer.default_local_dir: the latest checkpoint is used,
# from latest_checkpointed_iteration.txt), a global_step_N directory of an RL run (its actor/
# shards are merged) or of an SFT run (shards at its top level), or the shard directory itself.
# TARGET_DIR must not exist yet. Works with or without the CPU plugin. Input errors: one
# `error: ...` line on stderr and exit code 2 (recipe/common/checkpoints.py checks the shards first).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 CKPT TARGET_DIR" >&2
    exit 2
fi
CKPT="$1"
TARGET="${2%/}"
PYTHON="${PYTHON:-python}"

if [[ -f "$CKPT/latest_checkpointed_iteration.txt" ]]; then
    CKPT="$CKPT/global_step_$(cat "$CKPT/latest_checkpointed_iteration.txt")"
fi
if [[ -d "$CKPT/actor" ]]; then
    CKPT="$CKPT/actor"
fi
if [[ -e "$TARGET" ]]; then
    echo "error: $TARGET: exists (choose another TARGET_DIR; the merge never overwrites)" >&2
    exit 2
fi
# One line and exit 2 for a partial save (missing / truncated rank shards, no fsdp_config.json) or a
# checkpoint without its huggingface/ config and tokenizer, before the merger loads anything.
PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m recipe.common.checkpoints "$CKPT" > /dev/null

echo "[merge_checkpoint] $CKPT -> $TARGET"
# Written next to TARGET and renamed when complete: a killed merge never leaves a half model under TARGET.
PARTIAL="$TARGET.partial-$$"
"$PYTHON" -m verl.model_merger merge --backend fsdp --local_dir "$CKPT" --target_dir "$PARTIAL"
mv "$PARTIAL" "$TARGET"
