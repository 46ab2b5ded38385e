"""Model builders and fetchers (tiny random model, SmolLM2 from its package wheel) and their cache."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$OPSD_CACHE`` or ``~/.cache/opsd-verl``: where built models and toy data are cached."""
    return Path(os.environ.get("OPSD_CACHE", Path.home() / ".cache" / "opsd-verl")).expanduser()
