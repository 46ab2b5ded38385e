#!/usr/bin/env bash
# Resolve every GPU extra of pyproject.toml with the GPU torch pin, installing nothing:
# `pip install --dry-run --report` in a throwaway venv. Dependency metadata comes from HTTP range
# requests into the wheels (--use-feature=fast-deps), so no CUDA wheel is downloaded (measured
# 2026-11-25: ~1 min and ~110 MB of range requests per extra; the pip 23 that `python3 -m venv`
# ships falls back to whole wheels, 3.5 GB, hence the pinned pip). Prints the versions a GPU user gets.
#
#   bash .ci/resolve_gpu_extras.sh            # every extra in GPU_EXTRAS, in parallel
set -euo pipefail
cd "$(dirname "$0")/.."
# The extras that install a GPU stack (tests/test_packaging.py checks this list against pyproject.toml).
GPU_EXTRAS=(vllm sglang)
GPU_TORCH=2.11.0   # verl 0.9.1's CUDA torch pin (its vllm / sglang extras)
PIP_VERSION=26.3
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
python3 -m venv "${work}/venv"
"${work}/venv/bin/python" -m pip install -q --disable-pip-version-check "pip==${PIP_VERSION}" 2>/dev/null
start=${SECONDS}
for extra in "${GPU_EXTRAS[@]}"; do
    "${work}/venv/bin/python" -m pip install --disable-pip-version-check --dry-run --ignore-installed \
        --use-feature=fast-deps --report "${work}/${extra}.json" "torch==${GPU_TORCH}" ".[${extra}]" \
        > "${work}/${extra}.log" 2>&1 &
    echo $! > "${work}/${extra}.pid"
done
failed=0
for extra in "${GPU_EXTRAS[@]}"; do
    if ! wait "$(cat "${work}/${extra}.pid")"; then
        echo "[gpu extras] .[${extra}] with torch==${GPU_TORCH} does not resolve:" >&2
        grep -v -E '^WARNING: Location' "${work}/${extra}.log" | grep -E -A12 '^ERROR|conflict' >&2 || tail -20 "${work}/${extra}.log" >&2
        failed=1
        continue
    fi
    python3 - "${work}/${extra}.json" "${extra}" "${GPU_TORCH}" <<'PY'
import json, sys
report, extra, torch_pin = sys.argv[1:]
got = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.load(open(report))["install"]}
engine = {"vllm": "vllm", "sglang": "sglang"}[extra]
assert got.get("torch") == torch_pin, f".[{extra}] resolved torch {got.get('torch')}, not {torch_pin}"
assert engine in got, f".[{extra}] resolved without {engine}"
shown = ["verl", "torch", "transformers", engine, "ray", "flashinfer-python", "transferqueue"]
print(f"[gpu extras] .[{extra}] resolves ({len(got)} packages): " + " ".join(f"{n}=={got[n]}" for n in shown if n in got))
PY
done
echo "[gpu extras] resolved in $((SECONDS - start)) s"
exit "${failed}"
