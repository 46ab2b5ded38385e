"""Every patch of verl / torch / vLLM internals in recipe/ is a row of docs/verl_private_apis.md.

The scan (``ast``, every git-tracked ``recipe/**/*.py``) finds:

- ``patch``: an attribute assigned on an imported module or class of a watched package
  (``vllm_rollout.BucketedWeightSender = ...``, ``torch.distributed.init_process_group = ...``), or on a
  module looked up at run time (``sys.modules.get(...)`` / ``importlib.import_module(...)``);
- ``registry``: an item written into an object imported from a watched package (``_ROLLOUT_REGISTRY[k] = ...``);
- ``class-swap``: ``x.__class__ = ...``; ``forward``: ``x.forward = ...`` (an instance's forward replaced);
- ``import``: a name or module with a leading underscore imported from a watched package;
- ``override``: a method with a leading underscore defined in a subclass of a watched package's class
  that no project base class defines (``RayPPOTrainer._save_checkpoint``);
- ``private``: ``self._name`` (or ``super()._name``, ``getattr(self, "_name")``) read in a class that
  neither defines ``_name`` nor inherits it from a project class, and ``obj._name`` read on any other
  object where the project defines ``_name`` nowhere (``torch._log_softmax``, ``state._lazy_init``).

A finding is keyed by (kind, API, file); the table's rows carry the same three cells. A finding without
a row fails with its file:line and the row to add; a row that matches nothing fails as stale.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "verl_private_apis.md"
WATCHED = ("verl", "torch", "vllm", "transformers", "peft", "ray", "tensordict")
KINDS = ("patch", "registry", "class-swap", "forward", "import", "override", "private")
RUNTIME_MODULE = "<module>"  # a module object looked up at run time


def tracked_sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "recipe"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines() if line.endswith(".py") and (REPO / line).is_file()]


def _watched(dotted: str) -> bool:
    return dotted.split(".")[0] in WATCHED


def _imports(tree: ast.AST) -> dict[str, str]:
    """Every name an import binds anywhere in the file -> its dotted origin."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _runtime_modules(tree: ast.AST) -> set[str]:
    """Names assigned from ``sys.modules.get(...)``, ``sys.modules[...]`` or ``importlib.import_module(...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = ast.unparse(node.value)
            if re.match(r"(sys\.modules(\.get\(|\[)|importlib\.import_module\()", text):
                names.add(node.targets[0].id)
    return names


def _dotted(node: ast.AST) -> tuple[str, list[str]] | None:
    """``a.b.c`` -> ("a", ["b", "c"]); None when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id, parts[::-1]


class Classes:
    """The project's classes: what each defines itself (methods, class attributes, ``self.x = ...``) and its
    bases; and every name the project binds anywhere."""

    def __init__(self, files: list[Path]):
        self.defines: dict[str, set[str]] = defaultdict(set)
        self.bases: dict[str, list[tuple[str, str | None]]] = {}
        self.names: set[str] = set()
        for path in files:
            tree = ast.parse(path.read_text(), filename=str(path))
            bound = _imports(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.bases[node.name] = [(ast.unparse(b), bound.get(ast.unparse(b).split(".")[0]))
                                             for b in node.bases]
                    for item in ast.walk(node):
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            self.defines[node.name].add(item.name)
                        elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                            self.defines[node.name].add(item.attr)
                        elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                            self.defines[node.name].add(item.id)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    self.names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    self.names.add(node.id)
                elif isinstance(node, ast.keyword) and node.arg:
                    self.names.add(node.arg)

    def foreign_base(self, name: str, seen: tuple = ()) -> bool:
        """Whether the class has a base from a watched package (directly or through its project bases)."""
        for base, origin in self.bases.get(name, []):
            if origin is not None and _watched(origin):
                return True
            if base in self.bases and base not in seen and self.foreign_base(base, (*seen, name)):
                return True
        return False

    def defined(self, name: str, attr: str, seen: tuple = ()) -> bool:
        """Whether ``attr`` is defined by the class or one of its project bases."""
        if attr in self.defines.get(name, ()):
            return True
        return any(self.defined(base, attr, (*seen, name)) for base, _ in self.bases.get(name, [])
                   if base in self.bases and base not in seen)

    def overrides(self, cls: str, method: ast.FunctionDef, bound: dict[str, str]) -> bool:
        """Whether ``method`` of ``cls`` replaces a method of a watched package's base class: it calls
        ``super().<name>``, or a base that can be imported here has the name (a project base does not)."""
        if any(self.defined(base, method.name) for base, _ in self.bases.get(cls, []) if base in self.bases):
            return False
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and node.attr == method.name and isinstance(node.value, ast.Call) \
                    and ast.unparse(node.value.func) == "super":
                return True
        for base, origin in self.bases.get(cls, []):
            if origin is None or not _watched(origin):
                continue
            dotted = ".".join([origin, *base.split(".")[1:]])
            module, _, name = dotted.rpartition(".")
            try:
                found = getattr(importlib.import_module(module), name)
            except Exception:  # a package this environment lacks (vLLM on the CPU path)
                continue
            if hasattr(found, method.name):
                return True
        return any(self.overrides(base, method, bound) for base, _ in self.bases.get(cls, []) if base in self.bases
                   and self.foreign_base(base))

    def private_read(self, cls: str | None, attr: str) -> bool:
        """A read of ``attr`` on ``self`` in class ``cls`` (None: on another object) that the project does not define."""
        return attr not in self.names if cls is None else not self.defined(cls, attr)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def scan(path: Path, classes: Classes) -> list[tuple[str, str, int]]:
    """``(kind, api, line)`` of every finding in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bound = _imports(tree)
    runtime = _runtime_modules(tree)
    found = []

    def origin(root: str, parts: list[str]) -> str | None:
        if root in runtime:
            return ".".join([RUNTIME_MODULE, *parts])
        if root in bound and _watched(bound[root]):
            return ".".join([bound[root], *parts])
        return None

    def on_self(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "self") or (
            isinstance(node, ast.Call) and ast.unparse(node.func) == "super")

    def visit(node: ast.AST, cls: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            cls = node.name
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name) \
                        and classes.overrides(cls, item, bound):
                    found.append(("override", item.name, item.lineno))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and target.attr in ("__class__", "forward"):
                    found.append(("class-swap" if target.attr == "__class__" else "forward", target.attr, node.lineno))
                elif isinstance(target, (ast.Attribute, ast.Subscript)):
                    chain = _dotted(target if isinstance(target, ast.Attribute) else target.value)
                    if chain and (name := origin(*chain)):
                        found.append(("patch" if isinstance(target, ast.Attribute) else "registry", name, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _watched(node.module):
            private_module = any(part.startswith("_") for part in node.module.split("."))
            for alias in node.names:
                if private_module or _private(alias.name):
                    found.append(("import", f"{node.module}.{alias.name}", node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _watched(alias.name) and any(part.startswith("_") for part in alias.name.split(".")):
                    found.append(("import", alias.name, node.lineno))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr):
            if classes.private_read(cls if on_self(node.value) else None, node.attr):
                chain = _dotted(node)
                where = origin(chain[0], chain[1][:-1]) if chain else None
                found.append(("private", f"{where}.{node.attr}" if where else node.attr, node.lineno))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value):
            if classes.private_read(cls if on_self(node.args[0]) else None, node.args[1].value):
                found.append(("private", node.args[1].value, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, cls)

    visit(tree, None)
    return found


def findings() -> dict[tuple[str, str, str], list[int]]:
    files = tracked_sources()
    classes = Classes(files)
    out: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for path in files:
        rel = str(path.relative_to(REPO))
        for kind, api, line in scan(path, classes):
            out[(kind, api, rel)].append(line)
    return out


def table_rows(text: str) -> dict[tuple[str, str, str], int]:
    """``(kind, api, file)`` of every row of the table (``| kind | `api` | `file` | ...``), with its line."""
    rows = {}
    for number, line in enumerate(text.splitlines(), start=1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in KINDS:
            rows[(cells[0], cells[1].strip("`"), cells[2].strip("`"))] = number
    return rows


def test_the_scan_finds_what_it_is_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import sys\nimport torch\n"
        "from verl.workers.rollout.vllm_rollout import vllm_rollout\n"
        "from verl.workers.rollout.base import _ROLLOUT_REGISTRY as registry\n"
        "vllm_rollout.BucketedWeightSender = object\n"
        "registry[('vllm', 'async')] = 'x'\n"
        "torch.distributed.init_process_group = print\n"
        "def f(engine, head, mod_name):\n"
        "    engine.__class__ = object\n"
        "    head.forward = print\n"
        "    module = sys.modules.get(mod_name)\n"
        "    module.CPUOffloadPolicy = object\n"
        "    return torch._log_softmax, engine._autocast_dtype, engine._ours\n"
        "class A(vllm_rollout.ServerAdapter):\n"
        "    _ours = 1\n"
        "    def _execute_method(self):\n"
        "        return self._ours, self._theirs, getattr(self, '_dtype', None), super()._execute_method()\n"
    )
    assert sorted(scan(sample, Classes([sample]))) == sorted([
        ("import", "verl.workers.rollout.base._ROLLOUT_REGISTRY", 4),
        ("patch", "verl.workers.rollout.vllm_rollout.vllm_rollout.BucketedWeightSender", 5),
        ("registry", "verl.workers.rollout.base._ROLLOUT_REGISTRY", 6),
        ("patch", "torch.distributed.init_process_group", 7),
        ("class-swap", "__class__", 9),
        ("forward", "forward", 10),
        ("patch", "<module>.CPUOffloadPolicy", 12),
        ("private", "torch._log_softmax", 13),
        ("private", "_autocast_dtype", 13),
        ("override", "_execute_method", 16),
        ("private", "_theirs", 17),
        ("private", "_dtype", 17),
    ])


@pytest.mark.slow
def test_every_private_api_and_patch_is_listed():
    rows = table_rows(TABLE.read_text())
    found = findings()
    missing = [
        f"{file}:{lines[0]}: {kind} {api} is not listed in docs/verl_private_apis.md; add the row "
        f"| {kind} | `{api}` | `{file}` | <package version> | <why> |"
        for (kind, api, file), lines in sorted(found.items()) if (kind, api, file) not in rows
    ]
    stale = [f"docs/verl_private_apis.md:{line}: row ({kind}, {api}, {file}) matches nothing in the code; delete "
             "or update it" for (kind, api, file), line in sorted(rows.items(), key=lambda r: r[1])
             if (kind, api, file) not in found]
    assert not missing and not stale, "\n".join(missing + stale)
