"""The package layout of docs/ARCHITECTURE.md: no import cycle between packages, experiments on top.

Every ``import`` / ``from ... import`` of the project's packages in recipe/ and data_prep/ is read
with ``ast`` (function-level imports included), grouped by package (``recipe.<name>``,
``data_prep``). A new import that closes a cycle, or any import of ``recipe.experiments`` from
below, fails here.
"""

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# What each package may import (docs/ARCHITECTURE.md); anything else is a layering change to discuss.
ALLOWED = {
    "recipe.common": set(),
    "recipe.cpu": set(),
    "recipe.rollout": set(),
    "recipe.models": {"recipe.common"},
    "recipe.opsd": {"recipe.common"},
    "recipe.evaluation": {"recipe.common", "recipe.cpu"},
    "data_prep": {"recipe.common"},
    "recipe.analysis": {"recipe.common", "recipe.cpu", "recipe.opsd"},
    "recipe.launch": {"recipe.common", "recipe.cpu", "recipe.analysis", "recipe.models"},
    "recipe.toy": {"recipe.common", "recipe.cpu", "recipe.evaluation", "recipe.launch", "recipe.models", "data_prep"},
    "recipe.experiments": {"recipe.common", "recipe.cpu", "recipe.evaluation", "recipe.launch", "recipe.models",
                           "recipe.analysis", "recipe.opsd", "recipe.toy", "recipe.rollout", "data_prep"},
    # bench-only code (scripts/bench.py): nothing imports it
    "recipe.bench": {"recipe.common", "recipe.analysis", "recipe.launch", "recipe.models", "recipe.opsd", "recipe.toy",
                     "recipe.evaluation"},
    "recipe.grpo_baseline": set(),
    "recipe.sft": set(),
}


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "data_prep":
        return "data_prep"
    if parts[0] == "recipe" and len(parts) > 1:
        return f"recipe.{parts[1]}"
    return None


def package_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted([*REPO_ROOT.glob("recipe/**/*.py"), *REPO_ROOT.glob("data_prep/*.py")]):
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
