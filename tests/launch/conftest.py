"""Fixtures of the launcher tests (``launch_inputs`` and ``make_save``: tests/conftest.py).

- autouse: this process is offline (``huggingface_hub.constants.HF_HUB_OFFLINE``), so that a start-up
  check that loads a preset's tokenizer fails at once instead of retrying the network.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

