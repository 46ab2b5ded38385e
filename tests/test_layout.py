"""The package layout of docs/ARCHITECTURE.md: no import cycle between packages, experiments on top, small modules.

Every ``import`` / ``from ... import`` of the project's packages in recipe/, data_prep/ and benchmarks/ is read
with ``ast`` (function-level imports included), and so is every string literal that names a project module
(``"recipe.toy.demo:toy"``, ``importlib.import_module("recipe.x")``, ``[python, "-m", "recipe.x"]``): both are
edges between packages (``recipe.<name>``, ``data_prep``, ``benchmarks``). A package's ``__main__`` (its command
line) is a node of its own, above what it runs. A new import that closes a cycle, or any import of
``recipe.experiments`` from below, fails here; so does a module of more than ``MAX_MODULE_LINES`` lines.
"""

import ast
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# What each package may import (docs/ARCHITECTURE.md); anything else is a layering change to discuss.
ALLOWED = {
    "recipe.common": set(),
    "recipe.cpu": set(),
    "recipe.rollout": set(),
    "recipe.models": {"recipe.common"},
    "recipe.async_rl": {"recipe.common", "recipe.cpu"},  # names the CPU checkpoint engine by string
    "recipe.opsd": {"recipe.common", "recipe.async_rl"},
    "recipe.evaluation": {"recipe.common", "recipe.cpu"},
    "data_prep": {"recipe.common"},
    "recipe.analysis": {"recipe.common", "recipe.cpu", "recipe.opsd"},
    # the OPSD core's monitor decisions; the recipes' entry points, start-up checks and rollout extension by string
    "recipe.launch": {"recipe.common", "recipe.cpu", "recipe.analysis", "recipe.async_rl", "recipe.opsd", "recipe.rollout"},
    "recipe.toy": {"recipe.common", "recipe.cpu", "recipe.evaluation", "recipe.analysis", "recipe.launch", "recipe.models",
                   "recipe.opsd", "data_prep"},
    # `python -m recipe.launch`: on a CPU it runs the toy world's demos (recipe.toy.cpu_demos); nothing imports it
    "recipe.launch.__main__": {"recipe.common", "recipe.launch", "recipe.toy"},
    "recipe.tools": {"recipe.common", "recipe.analysis", "recipe.launch", "recipe.rollout", "recipe.toy"},
    # the compatibility probe: nothing imports it (scripts/probe.py); its cells' entry point subclasses the OPSD glue
    # and refuses an async_training block
    "recipe.probe": {"recipe.common", "recipe.analysis", "recipe.async_rl", "recipe.evaluation", "recipe.launch",
                     "recipe.opsd", "recipe.toy"},
    "recipe.experiments": {"recipe.common", "recipe.cpu", "recipe.evaluation", "recipe.launch", "recipe.models",
                           "recipe.analysis", "recipe.opsd", "recipe.toy", "recipe.rollout", "recipe.async_rl", "data_prep",
                           "recipe.tools"},
    "recipe.grpo_baseline": set(),
    "recipe.sft": set(),
    # bench-only code (scripts/bench.py; not installed): nothing imports it
    "benchmarks": {"recipe.common", "recipe.analysis", "recipe.cpu", "recipe.launch", "recipe.models", "recipe.opsd", "recipe.toy",
                     "recipe.evaluation"},
}
# A string that names a project module: ``recipe.x.y``, ``data_prep.y``, ``benchmarks.y``, optionally ``:attribute``.
MODULE_STRING = re.compile(r"(recipe|data_prep|benchmarks)(\.\w+)+(:\w+)?")
# Modules longer than this are split by concern (tests/test_layout.py::test_every_module_has_at_most_600_lines).
MAX_MODULE_LINES = 600
# A module docstring says what the module holds and how to call it; the why lives in docs/ (once).
MAX_DOCSTRING_LINES = 12
# Frameworks the pure OPSD core never imports (its modules are math, prompts and decisions).
FRAMEWORKS = ("verl", "ray", "vllm", "sglang", "hydra")


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ("data_prep", "benchmarks"):
        return parts[0]
    if parts[0] == "recipe" and len(parts) > 2 and parts[-1] == "__main__":
        return ".".join(parts)  # a package's command line: a node of its own
    if parts[0] == "recipe" and len(parts) > 1:
        return f"recipe.{parts[1]}"
    return None


def _imported_names(tree: ast.AST) -> list[str]:
    """The project modules a module imports: import statements, and string literals naming a module."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            names.append(node.value.partition(":")[0])
    return names


def package_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted([*REPO_ROOT.glob("recipe/**/*.py"), *REPO_ROOT.glob("data_prep/*.py"), *REPO_ROOT.glob("benchmarks/*.py")]):
        me = _package(".".join(path.relative_to(REPO_ROOT).with_suffix("").parts))
        if me == "recipe.__init__":
            continue
        targets = graph.setdefault(me, set())
        for name in _imported_names(ast.parse(path.read_text())):
            target = _package(name)
            if target and target != me:
                targets.add(target)
    return graph


@pytest.mark.parametrize(("code", "edges"), [
    ("import recipe.toy.demo", {"recipe.toy"}),
    ("from recipe.launch.run import plan", {"recipe.launch"}),
    ('BUILDER = "recipe.toy.demo:toy"', {"recipe.toy"}),
    ('importlib.import_module("recipe.rollout.sync_check")', {"recipe.rollout"}),
    ('cmd = [python, "-m", "data_prep.sft", "--out", "x"]', {"data_prep"}),
    ('"""See recipe.toy.demo for the builders."""\nkey = "data_prep"\nhint = "python -m data_prep.sft"', set()),
])
def test_imports_and_module_strings_are_edges(code, edges):
    assert {_package(name) for name in _imported_names(ast.parse(code))} == edges


def test_every_module_has_at_most_600_lines():
    """recipe/, data_prep/, benchmarks/ and scripts/: a longer module is split by concern."""
    paths = [path for folder in ("recipe", "data_prep", "benchmarks", "scripts") for path in (REPO_ROOT / folder).rglob("*.py")]
    assert len(paths) > 100
    long = {str(path.relative_to(REPO_ROOT)): n for path in paths
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split each by concern): {long}"


def test_every_module_docstring_has_at_most_12_lines():
    paths = list((REPO_ROOT / "recipe").rglob("*.py"))
    long = {}
    for path in paths:
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc and (n := len(doc.strip().splitlines())) > MAX_DOCSTRING_LINES:
            long[str(path.relative_to(REPO_ROOT))] = n
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines (move the why to docs/): {long}"


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
    assert not any(target.endswith(".__main__") for targets in ALLOWED.values() for target in targets)  # entry points


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
