"""The package layout of docs/ARCHITECTURE.md: no import cycle between packages, experiments on top.

Every ``import`` / ``from ... import`` of the project's packages in recipe/ and data_prep/ is read
with ``ast`` (function-level imports included), grouped by package (``recipe.<name>``,
``data_prep``). A new import that closes a cycle, or any import of ``recipe.experiments`` from
below, fails here.
"""

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# What each package may import (docs/ARCHITECTURE.md); anything else is a layering change to discuss.
ALLOWED = {
    "recipe.common": set(),
    "recipe.cpu": set(),
    "recipe.rollout": set(),
    "recipe.models": {"recipe.common"},
    "recipe.async_rl": set(),
    "recipe.opsd": {"recipe.common", "recipe.async_rl"},
    "recipe.evaluation": {"recipe.common", "recipe.cpu"},
    "data_prep": {"recipe.common"},
    "recipe.analysis": {"recipe.common", "recipe.cpu", "recipe.opsd"},
    "recipe.launch": {"recipe.common", "recipe.cpu", "recipe.analysis", "recipe.models", "recipe.async_rl"},
    "recipe.toy": {"recipe.common", "recipe.cpu", "recipe.evaluation", "recipe.launch", "recipe.models", "data_prep"},
    "recipe.experiments": {"recipe.common", "recipe.cpu", "recipe.evaluation", "recipe.launch", "recipe.models",
                           "recipe.analysis", "recipe.opsd", "recipe.toy", "recipe.rollout", "recipe.async_rl", "data_prep"},
    "recipe.grpo_baseline": set(),
    "recipe.sft": set(),
    # bench-only code (scripts/bench.py; not installed): nothing imports it
    "benchmarks": {"recipe.common", "recipe.analysis", "recipe.launch", "recipe.models", "recipe.opsd", "recipe.toy",
                     "recipe.evaluation"},
}
# Frameworks the pure OPSD core never imports (its modules are math, prompts and decisions).
FRAMEWORKS = ("verl", "ray", "vllm", "sglang", "hydra")


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ("data_prep", "benchmarks"):
        return parts[0]
    if parts[0] == "recipe" and len(parts) > 1:
        return f"recipe.{parts[1]}"
    return None


def package_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted([*REPO_ROOT.glob("recipe/**/*.py"), *REPO_ROOT.glob("data_prep/*.py"), *REPO_ROOT.glob("benchmarks/*.py")]):
        me = _package(".".join(path.relative_to(REPO_ROOT).with_suffix("").parts))
        if me == "recipe.__init__":
            continue
        targets = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                target = _package(name)
                if target and target != me:
                    targets.add(target)
    return graph


def test_every_package_imports_only_what_the_layout_allows():
    graph = package_imports()
    assert set(graph) == set(ALLOWED), sorted(set(graph) ^ set(ALLOWED))
    extra = {pkg: sorted(targets - ALLOWED[pkg]) for pkg, targets in graph.items() if targets - ALLOWED[pkg]}
    assert not extra, extra


def test_the_allowed_layout_has_no_cycle():
    order, done, active = [], set(), set()

    def visit(pkg):
        assert pkg not in active, f"import cycle through {pkg}"
        if pkg in done:
            return
        active.add(pkg)
        for target in ALLOWED[pkg]:
            visit(target)
        active.discard(pkg)
        done.add(pkg)
        order.append(pkg)

    for pkg in ALLOWED:
        visit(pkg)
    assert not any("recipe.experiments" in targets for pkg, targets in ALLOWED.items() if pkg != "recipe.experiments")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


@pytest.mark.slow
def test_the_opsd_core_is_pure():
    """recipe/opsd/core imports torch, the standard library, recipe.common and itself: no verl, Ray or
    glue module, in any function either; importing all of it loads neither verl nor Ray."""
    import subprocess
    import sys

    modules = sorted(REPO_ROOT.glob("recipe/opsd/core/**/*.py"))
    assert len(modules) > 10
    for path in modules:
        for name in _imports(path):
            root = name.split(".")[0]
            assert root not in FRAMEWORKS, f"{path.relative_to(REPO_ROOT)} imports {name}"
            if root == "recipe":
                assert name.startswith(("recipe.common", "recipe.opsd.core")), f"{path.relative_to(REPO_ROOT)} imports {name}"
    dotted = [".".join(p.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__") for p in modules]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in dotted) + \
        "print(sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (FRAMEWORKS,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
