# Compute bookkeeping shared by the run scripts (source it; CPU and GPU paths alike).
#
#   source recipe/launch/run_log.sh
#   export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$(next_free_path "$CKPT_DIR/metrics" jsonl)}"
#   timed_launch grpo "$DEVICE" "$N_DEVICES" "$CKPT_DIR" python -m verl.trainer.main_ppo ...
#
# Per step, verl's file logger writes `timing_s/step` (wall seconds of the step) and the
# per-phase `timing_s/*` to VERL_FILE_LOGGER_PATH. Per launch, timed_launch appends one line
# to $CKPT_DIR/run_times.jsonl:
#   {"recipe", "device", "n_devices", "start_utc", "wall_time_s", "exit_code", "metrics"}
# Device time = wall time x n_devices (all ranks are busy or waiting for the whole step).
# docs/cpu_path.md ("Compute logs") lists the paths.

# BASE.EXT if it does not exist, else BASE.1.EXT, BASE.2.EXT, ... (verl's file logger
# truncates the file it opens; a resumed launch must not erase the earlier steps).
next_free_path() {
    local base="$1" ext="$2" n=1
    if [[ ! -e "$base.$ext" ]]; then
        echo "$base.$ext"
        return
    fi
    while [[ -e "$base.$n.$ext" ]]; do
        n=$((n + 1))
    done
    echo "$base.$n.$ext"
}

# timed_launch RECIPE DEVICE N_DEVICES CKPT_DIR COMMAND...: run COMMAND, append the launch
# record to CKPT_DIR/run_times.jsonl (also when COMMAND fails), return COMMAND's exit code.
timed_launch() {
    local recipe="$1" device="$2" n_devices="$3" ckpt_dir="$4"
    shift 4
    local start start_utc rc=0
    start=$(date +%s)
    start_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    "$@" || rc=$?
    local wall=$(($(date +%s) - start))
    printf '{"recipe": "%s", "device": "%s", "n_devices": %d, "start_utc": "%s", "wall_time_s": %d, "exit_code": %d, "metrics": "%s"}\n' \
        "$recipe" "$device" "$n_devices" "$start_utc" "$wall" "$rc" "${VERL_FILE_LOGGER_PATH:-}" >> "$ckpt_dir/run_times.jsonl"
    echo "[$recipe] exit code $rc after $wall s; per-step timing_s/* in ${VERL_FILE_LOGGER_PATH:-<verl default>}, launches in $ckpt_dir/run_times.jsonl"
    return "$rc"
}
