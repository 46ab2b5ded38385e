#!/usr/bin/env bash
# OPSD or GRPO on the toy student, on the CPU, with a held-out before/after table.
#
#   bash recipe/toy/run_toy.sh opsd                      # what `bash recipe/opsd/run_opsd.sh` runs on CPU
#   STEPS=10 bash recipe/toy/run_toy.sh grpo actor_rollout_ref.actor.optim.lr=1e-4
#
# Builds (or reuses) the toy student and its data in ${OPSD_CACHE:-~/.cache/opsd-verl}/toy/<hash>
# (recipe/toy/student.py: verl SFT on CPU, ~2.6 min on 2 cores the first time), evaluates it
# on the held-out problems, trains with recipe/opsd/run_opsd.sh (teacher = frozen copy of the
# student with the full-solution context) or recipe/grpo_baseline/run_grpo.sh, merges the last
# checkpoint, evaluates it, and prints Avg@n / Pass@n / greedy accuracy / mean length before and
# after, the wall time and the time per step. Extra arguments are verl overrides.
# Environment: STEPS (default: recipe.toy.compare.ToyRunConfig.steps), OPSD_CACHE (or CACHE_DIR),
# CKPT_DIR (the run root; default <student cache dir>/runs/<UTC time>), PYTHON, EVAL_N (default 4),
# EVAL_LIMIT (default all 256).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"
if [[ $# -lt 1 || ( "$1" != opsd && "$1" != grpo ) ]]; then
    echo "usage: $0 {opsd|grpo} [verl overrides...]" >&2
    exit 2
fi
METHOD="$1"
shift
PYTHON="${PYTHON:-python}"
export OPSD_CACHE="${CACHE_DIR:-${OPSD_CACHE:-$HOME/.cache/opsd-verl}}"
ARGS=(--methods "$METHOD" --eval-n "${EVAL_N:-4}")
[[ -n "${STEPS:-}" ]] && ARGS+=(--steps "$STEPS")
[[ -n "${CKPT_DIR:-}" ]] && ARGS+=(--run-root "$CKPT_DIR")
[[ -n "${EVAL_LIMIT:-}" ]] && ARGS+=(--eval-limit "$EVAL_LIMIT")
exec "$PYTHON" scripts/compare_opsd_grpo.py "${ARGS[@]}" -- "$@"
