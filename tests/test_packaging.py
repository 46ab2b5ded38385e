"""The install lines of the GPU path: every GPU extra of pyproject.toml is resolved by CI.

``.ci/resolve_gpu_extras.sh`` resolves the extras it lists with the GPU torch pin (a dry run, no
wheel downloaded); an extra added to pyproject.toml without being listed there would never be
resolved, and a CPU extra listed there would pull CUDA metadata for nothing.
"""

import re
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CPU_EXTRAS = {"dev", "real"}  # installed by the CPU quick start and CI (.ci/run)


def _listed_gpu_extras() -> set[str]:
    text = (REPO_ROOT / ".ci" / "resolve_gpu_extras.sh").read_text()
    found = re.search(r"^GPU_EXTRAS=\(([^)]*)\)", text, re.M)
    assert found, "GPU_EXTRAS=(...) not found in .ci/resolve_gpu_extras.sh"
    return set(found.group(1).split())


def test_ci_resolves_every_gpu_extra():
    extras = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert _listed_gpu_extras() == extras - CPU_EXTRAS


def test_sglang_extra_avoids_verls_unresolvable_pin():
    """verl[sglang]==0.9.1 pins transformers==5.9.0 while its sglang==0.5.12 needs 5.6.0 (ResolutionImpossible)."""
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    sglang = extras["sglang"]
    assert not any(req.startswith("verl[sglang]") for req in sglang), sglang
    pins = dict(req.split("==", 1) for req in sglang if "==" in req)
    assert pins["torch"] == "2.11.0" and pins["sglang"] == "0.5.14" and pins["transformers"] == "5.8.1", pins
