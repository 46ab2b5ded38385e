"""Test hooks: fault injection and probes that a test loads into a launch; no production module reads them.

A hook is a module of this package that verl imports in the driver and in every Ray worker through its
external-modules variable ``VERL_USE_EXTERNAL_MODULES`` (``verl/__init__.py``). A test adds hooks to a
launch with ``launch_env``::

    from opsd_test_hooks import launch_env

    env = launch_env("opsd_test_hooks.rollout", OPSD_TEST_SKIP_WEIGHT_SYNC="1")
    run_cpu_verl("recipe/grpo_baseline/run_grpo.sh", args, workdir=tmp_path, env={**tiny_env, **env}, script=True)

``launch_env(*modules, environ=None, **settings)`` returns the variables to add to the launch's
environment:

- ``PYTHONPATH``: this package's directory (``tests/hooks``) in front of ``environ``'s. Ray workers
  on the driver's node inherit the driver's environment (and the run scripts keep a given PYTHONPATH
  after the repository root), so every process of the launch can import the hooks; a cluster of
  several nodes needs the directory on every node;
- ``VERL_USE_EXTERNAL_MODULES``: ``environ``'s modules, then ``modules``. The launcher
  (``recipe.launch.verl_env``) puts its own modules first (the CPU plugin, ``recipe.rollout.extension``),
  keeps these after them in order, and forwards the list to every Ray worker through the job's
  ``runtime_env`` (``ray_kwargs.ray_init.runtime_env.env_vars``); a verl entry point started by hand
  (``python -m verl.trainer.main_ppo``) reads the variable directly (``recipe.cpu.env.cpu_environment``
  keeps the CPU plugin first);
- the hook's ``settings`` (its ``OPSD_TEST_*`` variables), read by the hook at call time; like
  ``PYTHONPATH`` they reach the workers by inheritance (the launcher forwards only the module list).

Tests that import a hook's helpers in-process find the package because ``tests/conftest.py`` puts
``tests/hooks`` on ``sys.path``. Adding a hook: a module here that installs itself at import (and
does nothing unless its settings ask for it, so that loading it is harmless), with its settings in its
docstring. verl imports it from ``verl/__init__.py``, i.e. possibly while the project module it wants
to change is itself being imported (a Ray worker's first import of a worker class imports verl): a
hook therefore imports no project module at import time. It either names its classes in a registry
that is resolved later (verl's rollout registries: ``rollout``) or patches a module once it is fully
imported: ``when_imported("recipe.opsd.opsd_ray_trainer", patch)`` calls ``patch(module)`` now if the
module is already imported, else right after its import finishes. Hooks:

- ``rollout``: the rollout servers' probes and negative controls (``OPSD_TEST_ROLLOUT_WEIGHTS_LOG``,
  ``OPSD_TEST_SYNC_PROBE_LOG``, ``OPSD_TEST_SKIP_WEIGHT_SYNC``);
- ``vllm_cpu_faults``: the failures of verl's vLLM server the guarded weight push must survive;
- ``opsd_faults``: the OPSD trainer's faults (NaN teacher hidden states at given steps, a pause inside a
  checkpoint save) for ``tests/e2e/test_opsd_faults_e2e.py``.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

HOOKS_DIR = str(Path(__file__).resolve().parent.parent)
MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"


def launch_env(*modules: str, environ: Mapping[str, str] | None = None, **settings: str) -> dict[str, str]:
    """The variables that load ``modules`` (``opsd_test_hooks.<name>``) into every process of a launch."""
    environ = os.environ if environ is None else environ
    paths = [HOOKS_DIR] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != HOOKS_DIR]
    listed = [m for m in environ.get(MODULES_ENV, "").split(",") if m.strip()]
    return {
        "PYTHONPATH": os.pathsep.join(paths),
        MODULES_ENV: ",".join(listed + [m for m in modules if m not in listed]),
        **{name: str(value) for name, value in settings.items()},
    }


def when_imported(name: str, patch: Callable[[object], None]) -> None:
    """Call ``patch(module)`` once the module ``name`` is fully imported (now, if it already is)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is not None and not getattr(spec, "_initializing", False):
        patch(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, patch))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and runs ``patch`` right after the module's code (once)."""

    def __init__(self, name: str, patch: Callable[[object], None]):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module, patch = spec.loader.exec_module, self.patch

            def run(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = run
        return spec
