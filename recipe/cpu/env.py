"""Environment variables of the verl CPU path (the one copy; the hydra side is ``config/platform``).

``cpu_environment(os.environ)`` is what the launcher (``recipe.launch``) adds to a CPU run's environment;
verl reads these when it is imported, so they are set before the process starts. The hydra overrides
are ``+platform=cpu`` (RL trainers) and ``+platform=cpu_sft`` (verl's SFT trainer); why each item is
needed: docs/cpu_path.md. Running verl by hand on a CPU::

    eval "$(python -m recipe.cpu.env)"
    python -m verl.trainer.main_ppo --config-path ... +platform=cpu ...
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

PLUGIN_MODULE = "recipe.cpu.plugin"
# hydra config group of the CPU overrides (searched through pkg://recipe.cpu.config)
CONFIG_PACKAGE = "recipe.cpu.config"

FIXED = {
    # No network at run time: model, tokenizer and data are local.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Selects the plugin's platform (verl/plugin/platform/platform_manager.py).
    "VERL_PLATFORM": "cpu",
    # verl registers its FSDP engine for cuda/npu only; this documented override selects it on CPU.
    "VERL_ENGINE_DEVICE": "cuda",
    # Ray starts no idle workers ahead of the first driver (a tiny launch used none of them; ~4 CPU-seconds).
    "RAY_prestart_worker_first_driver": "0",
}


def cpu_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a CPU run sets on top of ``environ``.

    ``VERL_USE_EXTERNAL_MODULES`` loads the plugin in the driver and every Ray worker; it must be
    listed first, modules the user already listed there follow it.
    """
    user_modules = [m for m in environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != PLUGIN_MODULE]
    # wandb, if a run lists it as a logger, stays local unless the user chose a mode (docs/launch.md).
    return {**FIXED, "WANDB_MODE": environ.get("WANDB_MODE", "offline"),
            "VERL_USE_EXTERNAL_MODULES": ",".join([PLUGIN_MODULE, *user_modules])}


def main() -> int:
    for key, value in cpu_environment(os.environ).items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
