"""Plan and start one training launch: every override once, the final config printed once.

``plan(recipe, settings, argv, ...)`` assembles the overrides (the precedence: docs/launch.md), composes the
final config with hydra exactly as verl will, runs the pre-Ray checks and returns a ``Launch``: the argv, the
environment and the config. ``execute(launch)`` starts it in the repository root and appends one record to
``$CKPT_DIR/run_times.jsonl``; ``StepProgress`` condenses its output to one console line per step. On a GPU
the launcher adds nothing a preset sets: the GPU count is taken from nvidia-smi only when no preset or
override sets ``trainer.n_gpus_per_node``, and the rollout engine is always the config's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import signal
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from recipe.common.cli import TolerantLog, is_full_disk
from recipe.cpu import vllm_cpu
from recipe.launch import checks, disk, lock  # pre-Ray input, resume and disk checks; the directory lock
from recipe.launch import cluster
from recipe.launch import config as composer
from recipe.launch.async_modes import launch_recipe
from recipe.launch.config import REPO_ROOT, Override, OverrideList, Recipe, Settings, gpus_on_this_node
from recipe.launch.data_order import DATA_ORDER_FILE, DataOrder, load_tokenizer, plan_data_order, write_record
from recipe.launch.processes import run_marked
from recipe.launch.ranks import check_rank_division
from recipe.launch.verl_env import runtime_env_overrides, verl_environment


@dataclass(frozen=True)
class DemoInputs:
    """What a CPU demo contributes to a launch (recipe.toy.cpu_demos): its preset and built paths."""

    name: str
    model_path: str | None = None
    train_files: str | None = None
    val_files: str | None = None
    ckpt_dir: str | None = None


# Threads of every Ray worker of a CPU launch (Ray's default: one): CPU_THREADS; for these demos, whose phases take
# turns on an otherwise idle machine, else the launcher's OMP_NUM_THREADS, else all cores
# (docs/results/real_model.md#step-speed).
THREADS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS"
ALL_CORES_DEMOS = ("real",)


@dataclass
class Launch:
    recipe: Recipe
    settings: Settings
    overrides: OverrideList
    config: object
    ckpt_dir: Path
    command: list[str]
    config_path: Path
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verl_env: dict[str, str] = field(default_factory=dict)  # what the launcher added to env (recipe.launch.verl_env)
    checked: checks.Checked | None = None  # the checkpoint directory's state: resume, finished run, disk (recipe.launch.checks)
    # RL recipes: the rows the run trains on, in order (recipe.launch.data_order), and why not when None
    data_order: DataOrder | None = None
    data_order_note: str | None = None

    @property
    def finished(self) -> str | None:
        """The line of a relaunch whose run is finished (nothing to train: the launch exits 0)."""
        return self.checked.finished if self.checked else None

    def describe(self) -> str:
        """The header printed once at start: command, environment set, replaced values, the effective settings."""
        lines = [f"[launch] {self.recipe.name} on {self.settings.device}: {shlex.join(self.command)}"]
        if self.verl_env:
            lines.append("[launch] environment: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.verl_env.items()))
        if self.checked is not None and self.checked.disk is not None:  # recipe.launch.disk
            lines.append(f"[launch] {self.checked.disk.note}")
        lines += [f"[launch] note: {note}" for note in self.notes]
        if self.data_order is not None:
            o = self.data_order
            lines.append(f"[launch] data: {o.rows} rows ({o.steps} steps x {o.batch_size}) of {o.rows_in_dataset}, "
                         f"order sha256 {o.order_sha256[:16]} (written to {DATA_ORDER_FILE})")
        if self.data_order_note:
            lines.append(f"[launch] data: {self.data_order_note}")
        for key, old, old_source, new, new_source in self.overrides.replaced:
            lines.append(f"[launch] note: {key}={new} ({new_source}) replaces {key}={old} ({old_source})")
        lines.append(f"[launch] effective config (full: {self.config_path}):")
        lines.append(composer.summary(self.config, self.recipe))
        return "\n".join(lines)

    def resolved_yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(self.config, resolve=True)


def config_errors() -> tuple[type[Exception], ...]:
    """Errors that mean "the configuration is wrong" (printed as one line by the CLIs, no traceback)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return (ValueError, FileNotFoundError, FileExistsError, HydraException, OmegaConfBaseException)  # InputError: ValueError


def next_free_path(base: Path, suffix: str) -> Path:
    """``base.suffix`` if free, else ``base.1.suffix``, ``base.2.suffix``, ... (verl's file logger
    truncates its file: a resumed launch must not erase the earlier steps)."""
    path, n = base.with_name(f"{base.name}.{suffix}"), 1
    while path.exists():
        path, n = base.with_name(f"{base.name}.{n}.{suffix}"), n + 1
    return path


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    parsed = [Override.parse(a) for a in argv]
    return [a for a, p in zip(argv, parsed) if p.is_group], [a for a, p in zip(argv, parsed) if not p.is_group]


def plan(recipe: Recipe, settings: Settings, argv: list[str], *, demo: DemoInputs | None = None,
         environ: dict[str, str] | None = None, detect_gpus=gpus_on_this_node, python: str = sys.executable,
         pending: frozenset[str] = frozenset(), dry_run: bool = False, startup_checks: bool = True) -> Launch:
    """Assemble, compose and validate one launch (nothing is started or written).

    ``pending``: input paths that something runs before this launch will create (a CPU demo's build
    in a dry run, an earlier pipeline stage's merge): not checked (``recipe.launch.checks``).
    ``dry_run``: a Hub model id not in the local cache is not asked for (a dry run needs no network).
    ``startup_checks=False`` leaves out the input, checkpoint-directory and recipe start-up checks, for a
    launch planned before the inputs it names exist (a sweep run that starts from an earlier stage's model
    or checkpoint: its entry point runs the recipe's checks when it starts)."""
    environ = dict(os.environ if environ is None else environ)
    groups, values = _split(list(argv))
    _check_presets(recipe, groups)
    overrides = OverrideList().add(groups, source="command line")
    if demo is not None:
        if demo.name not in recipe.presets("demo"):
            raise ValueError(f"the {recipe.name} recipe has no CPU demo {demo.name!r} "
                             f"({recipe.config_dir / 'demo'}: {recipe.presets('demo')})")
        overrides.add([f"+demo={demo.name}"], source=f"CPU demo {demo.name}")
    vllm = settings.device == "cpu" and settings.cpu_rollout == "vllm" and recipe.vllm_platform is not None
    if settings.device == "cpu":
        overrides.add([f"+platform={recipe.vllm_platform if vllm else recipe.platform}"],
                      source="DEVICE=cpu CPU_ROLLOUT=vllm" if vllm else "DEVICE=cpu")
    verl_env = verl_environment(recipe, device=settings.device, cpu_rollout=settings.cpu_rollout, environ=environ)
    if vllm:
        python = vllm_cpu.venv_python(settings.vllm_venv_dir)

    model = settings.model_path or (demo.model_path if demo else None)
    train = settings.train_files or (demo.train_files if demo else None)
    val = settings.val_files or (demo.val_files if demo and not settings.train_files else None) or train
    env_values = [(recipe.model_key, model, "MODEL_PATH"), (recipe.train_key, train, "TRAIN_FILES"),
                  (recipe.val_key, val, "VAL_FILES"), ("trainer.total_training_steps", settings.steps, "STEPS"),
                  ("trainer.n_gpus_per_node", settings.ngpus or settings.cpu_num_ranks, "NGPUS / CPU_NUM_RANKS"),
                  ("trainer.nnodes", settings.nnodes, "NNODES")]
    overrides.add(recipe.reward_overrides(), source="launcher (the project's grader)")
    for key, value, source in env_values:
        if key and value is not None:
            overrides.add([f"{key}={value}"], source=source)
    overrides.add(runtime_env_overrides(recipe, verl_env), source="launcher (VERL_USE_EXTERNAL_MODULES on every node)")
    threads = settings.cpu_threads
    if threads is None and demo is not None and demo.name in ALL_CORES_DEMOS:
        threads = environ.get("OMP_NUM_THREADS", "").strip() or os.cpu_count()
    if settings.device == "cpu" and threads:
        overrides.add([f'++{THREADS_KEY}="{threads}"'], source="CPU_THREADS" if settings.cpu_threads else
                      f"CPU demo {demo.name} (OMP_NUM_THREADS, else all cores)")
    overrides.add(values, source="command line")
    if vllm and model:
        vllm_cpu.check_head_dim(str(model))

    # Derived values come from a first composition (none of them changes what the others read) and are
    # applied to it as hydra applies value overrides (the launch's override list holds every one once).
    notes, derived = [], []
    base = _base_config(recipe)
    presets = _presets_config(recipe, overrides)
    cfg = _with_values(recipe, presets, overrides)
    if settings.device == "gpu" and "trainer.n_gpus_per_node" not in overrides and \
            composer.select(cfg, "trainer.n_gpus_per_node") == composer.select(base, "trainer.n_gpus_per_node"):
        count = detect_gpus()
        if count > 0:
            derived.append(f"trainer.n_gpus_per_node={count}")
            overrides.add(derived[-1:], source="nvidia-smi")
            notes.append(f"trainer.n_gpus_per_node={count}: all GPUs nvidia-smi lists (no preset or NGPUS sets it)")
    if settings.device == "cpu" and settings.cpu_rollout == "vllm" and recipe.vllm_platform is None:
        notes.append(f"CPU_ROLLOUT=vllm is not used: the {recipe.name} recipe has no rollout")
    if vllm:  # the vLLM venv reaches the main venv it was built from (recipe/cpu/vllm_cpu_venv.sh)
        tie = vllm_cpu.main_venv_note(settings.vllm_venv_dir, sysconfig.get_paths()["purelib"])
        notes += [tie] if tie else []
    for key, value, why in composer.token_budget_fixes(cfg, recipe):
        derived.append(f"{key}={value}")
        overrides.add(derived[-1:], source="derived")
        notes.append(f"{key}={value} {why}")
    ckpt = _ckpt_dir(recipe, settings, demo, overrides, cfg)
    derived.append(f"trainer.default_local_dir={ckpt}")
    overrides.add(derived[-1:], source="CKPT_DIR")
    env = {**environ, **verl_env}
    env.setdefault("VERL_FILE_LOGGER_PATH", str(next_free_path(ckpt / "metrics", "jsonl")))
    env.setdefault("TENSORBOARD_DIR", str(ckpt / "tensorboard"))
    env.setdefault("WANDB_DIR", str(ckpt))
    # The trainer's per-step lines reach train.log (a file, block-buffered otherwise) as they are printed.
    env.setdefault("PYTHONUNBUFFERED", "1")
    if settings.ray_address and not recipe.torchrun:  # join the user's cluster (recipe.launch.cluster)
        joined = cluster.join_overrides(settings.ray_address, cluster.forwarded_environment(env, verl_env))
        kept = [o for o in joined if overrides.source(Override.parse(o).key) != "command line"]
        derived += kept
        overrides.add(kept, source="RAY_ADDRESS")
    cfg = composer.with_values(cfg, derived)
    _validate(recipe, settings, cfg, base)
    check_rank_division(recipe.name, cfg)  # batch sizes over the ranks: before Ray, not mid-run
    # model, data, the checkpoint directory (a finished run, another config) and the disk, before the recipe's own
    checked, order, order_note = None, None, None
    if startup_checks:
        checked = checks.check_launch(recipe, cfg, overrides=overrides, environ={**environ, **verl_env},
                                      ckpt_dir=ckpt, pending=pending, resume_anyway=settings.resume_with_changes,
                                      dry_run=dry_run)
        notes += checked.notes
        if resume := checks.resume_overrides(cfg, checked):  # verl would pick another save (or none): name it
            overrides.add(resume, source="launcher (the last whole save)")
            cfg = composer.with_values(cfg, resume)
        resolved = recipe.run_startup_checks(cfg)  # what the recipe's entry point checks before Ray, in a dry run too
        if recipe.reward:
            order, order_note = plan_data_order(
                resolved, load_tokenizer=functools.partial(load_tokenizer, local_files_only=dry_run))
    recipe = launch_recipe(recipe, cfg)  # an async_training block: checked; GRPO's async entry point
    notes += _preset_values_replaced(overrides, cfg, base, presets)
    notes += _micro_batch_note(cfg, overrides)

    nproc = int(composer.select(cfg, "trainer.n_gpus_per_node"))
    if recipe.torchrun and int(composer.select(cfg, "trainer.nnodes")) != 1:
        raise ValueError(f"the {recipe.name} launcher starts one node (torchrun --standalone); "
                         "for more nodes run torchrun on each node")
    return Launch(recipe=recipe, settings=settings, overrides=overrides, config=cfg, ckpt_dir=ckpt,
                  command=recipe.command(python, overrides.as_list(), nproc=nproc),
                  config_path=next_free_path(ckpt / "launch_config", "yaml"), env=env, notes=notes, verl_env=verl_env,
                  checked=checked, data_order=order, data_order_note=order_note)


@functools.lru_cache(maxsize=None)
def _base_config(recipe: Recipe):
    """The recipe yaml alone: what "nobody set it" looks like."""
    return composer.compose(recipe, [])


def _presets_config(recipe: Recipe, overrides: OverrideList):
    """The recipe yaml with the launch's group selections (presets, demo, platform) and no value override."""
    groups = [text for text in overrides.as_list() if Override.parse(text).is_group]
    return _composed_groups(recipe, tuple(groups)) if groups else _base_config(recipe)


@functools.lru_cache(maxsize=8)
def _composed_groups(recipe: Recipe, groups: tuple[str, ...]):
    return composer.compose(recipe, list(groups))


def _with_values(recipe: Recipe, presets, overrides: OverrideList):
    """The launch's config: its value overrides applied to ``presets`` the way hydra applies them at the end of
    a composition (``composer.with_values``, one composition fewer). An override ``with_values`` does not take
    (a delete, a ``hydra.`` key, a key the config does not have) is composed by hydra, whose error names it."""
    from omegaconf.errors import OmegaConfBaseException

    values = [text for text in overrides.as_list() if not Override.parse(text).is_group]
    try:
        return composer.with_values(presets, values)
    except (ValueError, OmegaConfBaseException):
        return composer.compose(recipe, overrides.as_list())


def _ckpt_dir(recipe: Recipe, settings: Settings, demo: DemoInputs | None, overrides: OverrideList, cfg) -> Path:
    """CKPT_DIR, else a command-line trainer.default_local_dir, else the demo's, else the cache default."""
    if settings.ckpt_dir:
        return Path(settings.ckpt_dir)
    if overrides.source("trainer.default_local_dir") == "command line":
        return Path(overrides.get("trainer.default_local_dir")).expanduser().absolute()
    if demo is not None and demo.ckpt_dir:
        return Path(demo.ckpt_dir)
    return Path(settings.cache_dir) / "checkpoints" / recipe.name / str(composer.select(cfg, "trainer.experiment_name"))


def _check_presets(recipe: Recipe, groups: list[str]) -> None:
    """Every ``+model=`` / ``+experiment=`` / ``+demo=`` names a preset file of the recipe."""
    for text in groups:
        item = Override.parse(text)
        group = item.key.split("@")[0]
        if group == "platform":
            continue
        known = recipe.presets(group)
        for name in (item.value or "").strip("[]").split(","):
            if name.strip() not in known:
                raise ValueError(f"unknown {group} preset {name.strip()!r} for the {recipe.name} recipe; "
                                 f"one of {known} ({recipe.config_dir / group})")


def _preset_values_replaced(overrides: OverrideList, cfg, base, presets) -> list[str]:
    """A note for every value a preset (or the demo / platform) set that an override replaced."""
    groups = [str(Override.parse(a)) for a in overrides.as_list() if Override.parse(a).is_group]
    if not groups:
        return []
    notes = []
    for text in overrides.as_list():
        item = Override.parse(text)
        if item.is_group or item.value is None:
            continue
        chosen = composer.select(presets, item.key)
        if chosen != composer.select(base, item.key) and chosen != composer.select(cfg, item.key):
            notes.append(f"{item.key}={composer.select(cfg, item.key)} ({overrides.source(item.key)}) replaces "
                         f"{item.key}={chosen} of {' '.join(groups)}")
    return notes


MICRO_BATCH_KEY = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def _micro_batch_note(cfg, overrides: OverrideList) -> list[str]:
    """A model preset's micro-batch table without the rollout cap: the micro-batch falls back to the
    preset's 1,024-token value (too large for a longer cap); say so unless the user set it."""
    table = composer.select(cfg, "model_preset.micro_batch_by_cap")
    cap = composer.select(cfg, "data.max_response_length")
    if table is None or cap is None or f"cap_{cap}" in table or MICRO_BATCH_KEY in overrides:
        return []
    caps = ", ".join(key.removeprefix("cap_") for key in table)
    return [f"{MICRO_BATCH_KEY}={composer.select(cfg, MICRO_BATCH_KEY)}: the model preset's micro-batch table has no "
            f"entry for data.max_response_length={cap} (caps {caps}), so the 1,024-token value is kept; set "
            f"{MICRO_BATCH_KEY} for this cap"]


# rollout engines registered by the CPU plugin only (recipe.cpu): a GPU launch cannot start them
CPU_ONLY_ENGINES = {"hf": "recipe.cpu.rollout, batched HF generate"}


def _validate(recipe: Recipe, settings: Settings, cfg, base) -> None:
    missing = composer.missing(cfg)
    if missing:
        raise ValueError(f"mandatory config values are not set: {missing} (pass them as hydra overrides)")
    model_preset = composer.select(cfg, "model_preset.name")
    for key, variable in ((recipe.model_key, "MODEL_PATH"), (recipe.train_key, "TRAIN_FILES")):
        value = composer.select(cfg, key)
        if value is None or value == composer.select(base, key):  # unset (a model preset without a Hub id) or verl's
            hint = " or a +model=<preset>" if variable == "MODEL_PATH" and recipe.presets("model") else ""
            if variable == "MODEL_PATH" and model_preset is not None:  # a preset of a locally built model
                hint = f" (+model={model_preset} names no Hub id: the model is built locally, see its preset file)"
            what = "unset" if value is None else f"verl's placeholder {value!r}"
            raise ValueError(f"{key} is {what}: set {variable}{hint}")
    engine = composer.select(cfg, "actor_rollout_ref.rollout.name")
    if settings.device == "gpu" and engine in CPU_ONLY_ENGINES:
        source = f"+model={model_preset}" if model_preset is not None else "the config"
        raise ValueError(f"actor_rollout_ref.rollout.name={engine} ({source}) is the CPU path's rollout "
                         f"({CPU_ONLY_ENGINES[engine]}); on a GPU set actor_rollout_ref.rollout.name=vllm or sglang")


def _preflight(launch: Launch, joined: bool) -> None:
    """A launch on a GPU or on a cluster: recipe.launch.cluster's checks, and the cluster joined printed."""
    if launch.settings.device != "gpu" and not joined:
        return
    joined_line = cluster.preflight(
        python=launch.command[0], device=launch.settings.device,
        engine=composer.select(launch.config, "actor_rollout_ref.rollout.name"),
        address=launch.settings.ray_address if joined else None,
        nnodes=int(composer.select(launch.config, "trainer.nnodes")),
        gpus_per_node=int(composer.select(launch.config, "trainer.n_gpus_per_node")), env=launch.env)
    if joined_line:
        print(f"[launch] {joined_line}", flush=True)


def _raise_on_sigterm():
    """In the main thread: SIGTERM raises SystemExit(143), so a killed launcher still kills its launch.
    Returns the previous handler (None when not in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _record(launch: Launch, *, start: float, returncode: int) -> dict:
    record = {"recipe": launch.recipe.name, "device": launch.settings.device,
              "n_devices": int(composer.select(launch.config, "trainer.n_gpus_per_node"))
              * int(composer.select(launch.config, "trainer.nnodes")),
              "start_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
              "wall_time_s": round(time.time() - start), "exit_code": returncode,
              "metrics": launch.env["VERL_FILE_LOGGER_PATH"], "config": str(launch.config_path)}
    if launch.recipe.reward:
        record["data_order"] = str(launch.ckpt_dir / DATA_ORDER_FILE)
    try:
        with open(launch.ckpt_dir / "run_times.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")
    except OSError as err:  # a full disk: the record is still returned (and its line printed)
        if not is_full_disk(err):
            raise
    return record


def execute(launch: Launch, *, log: Path | None = None, on_line=None, timeout_s: float | None = None) -> dict:
    """Start the launch in the repository root; return its ``run_times.jsonl`` record.

    Without ``log`` verl's output goes to this console. With ``log`` it is appended to that file (a
    relaunch that resumes keeps the earlier launches' output) and ``on_line(line)`` sees every line (the CPU demos print condensed progress from it). After
    ``timeout_s``, or when this process is interrupted, every process of the launch (driver, Ray's
    daemons and workers: ``recipe.launch.processes``) is killed (exit code -9); so is it when this
    process gets SIGTERM. A launch whose driver failed because Ray's node missed Ray's fixed 30 s start-up wait
    (``RAY_START_TIMEOUT`` in its log, an overloaded machine) is started once more, with a line saying so.
    A launch on a GPU or on a cluster (RAY_ADDRESS) is first checked by
    ``recipe.launch.cluster.preflight`` (its PreflightError: one line, nothing started).

    The launch holds the checkpoint directory's lock while it runs (``recipe.launch.lock``: a second
    launch there fails with a ``LockedError``), applies checkpoint retention before and after the
    trainer (``recipe.launch.disk.prune``) and, when the trainer failed on a full disk, returns the one
    line saying so as ``record["disk_full"]`` (``disk.failure_line``; not written to run_times.jsonl).
    """
    joined = bool(launch.settings.ray_address) and not launch.recipe.torchrun
    previous_sigterm = _raise_on_sigterm()
    try:
        _preflight(launch, joined)
    except BaseException:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        raise
    try:
        launch.ckpt_dir.mkdir(parents=True, exist_ok=True)
        with lock.hold(launch.ckpt_dir, command=f"{launch.recipe.name}: {shlex.join(sys.argv)}") as lock_fd:
            return _execute(launch, log=log, on_line=on_line, timeout_s=timeout_s, lock_fd=lock_fd, joined=joined)
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)


def _execute(launch: Launch, *, log: Path | None, on_line, timeout_s: float | None, lock_fd: int,
             joined: bool) -> dict:
    plan_disk = launch.checked.disk if launch.checked else None
    if plan_disk is not None:
        disk.prune(launch.ckpt_dir, plan_disk, log=lambda line: print(line, flush=True))
    launch.config_path.write_text(launch.resolved_yaml())
    if launch.recipe.reward:
        write_record(launch.data_order, launch.data_order_note, launch.ckpt_dir)
    start = time.time()
    sink = TolerantLog(log) if log is not None else None
    try:
        returncode, ray_start_timed_out = _drive(launch, sink=sink, on_line=on_line, timeout_s=timeout_s,
                                                 lock_fd=lock_fd, joined=joined)
        if returncode != 0 and ray_start_timed_out:
            print("[launch] Ray's node did not register within Ray's fixed 30 s (an overloaded machine; no worker "
                  "had started): starting the launch once more", flush=True)
            returncode, _ = _drive(launch, sink=sink, on_line=on_line, timeout_s=timeout_s, lock_fd=lock_fd,
                                   joined=joined)
    finally:
        if sink is not None:
            sink.close()
    record = _record(launch, start=start, returncode=returncode)
    print(f"[launch] {launch.recipe.name} exit code {returncode} after {record['wall_time_s']} s; metrics "
          f"{record['metrics']}, launches in {launch.ckpt_dir / 'run_times.jsonl'}", flush=True)
    if plan_disk is not None:
        if returncode == 0:  # the saves of earlier launches beyond the retention count
            disk.prune(launch.ckpt_dir, dataclasses.replace(plan_disk, resume_step=None), log=lambda line: print(line, flush=True))
        elif (full := disk.failure_line(launch.ckpt_dir, plan_disk, log_text=_tail(log))) is not None:
            record["disk_full"] = full  # the one line the caller prints
    return record


# Ray waits a fixed 30 s for a new node's raylet to register with its GCS (ray/_private/node.py) and raises
# this when an overloaded machine misses it, before any worker starts: such a launch is started once more.
RAY_START_TIMEOUT = "The current node timed out during startup"


def _drive(launch: Launch, *, sink, on_line, timeout_s: float | None, lock_fd: int, joined: bool) -> tuple[int, bool]:
    """Start the driver, follow it to its end, kill what it left running (``run_marked``); ``(exit code, whether its
    output has RAY_START_TIMEOUT)`` (seen only when the output goes to ``sink``, a launch's log)."""
    ray_start_timed_out = False

    def follow(line: str) -> None:
        nonlocal ray_start_timed_out
        ray_start_timed_out = ray_start_timed_out or RAY_START_TIMEOUT in line
        if on_line is not None:
            on_line(line)

    returncode = run_marked(launch.command, cwd=REPO_ROOT, env=launch.env, sink=sink, on_line=follow,
                            timeout_s=timeout_s, pass_fds=(lock_fd,), joined_cluster=joined)
    return returncode, ray_start_timed_out


def _tail(log: Path | None, size: int = 200_000) -> str:
    if log is None or not log.is_file():
        return ""
    with open(log, "rb") as handle:
        handle.seek(max(0, log.stat().st_size - size))
        return handle.read().decode(errors="replace")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*")


class StepProgress:
    """Condensed console progress from verl's console lines: one line per step, at most every ``every_s``.

    A console line of a step that holds none of ``keys`` (the validation before training, the OPSD
    pre-flight report logged with step 1 before its values) prints nothing."""

    def __init__(self, label: str, keys: dict[str, str], *, total: int | None = None, every_s: float = 5.0,
                 startup_every_s: float = 20.0):
        self.label, self.keys, self.total, self.every_s = label, keys, total, every_s
        self.startup_every_s = startup_every_s
        self._start = self._last = time.time()
        self._stepped = False

    def __call__(self, line: str) -> None:
        from recipe.analysis.run_logs import parse_console_line

        values = parse_console_line(line)
        if values is None:
            text = _RAY_PREFIX.sub("", _ANSI.sub("", line)).rstrip()
            if text.startswith(f"[{self.label}] "):  # the recipe's own messages (a fallback, a stop): shown as is
                print(text, flush=True)
                return
            now = time.time()
            if not self._stepped and now - self._last >= self.startup_every_s:  # Ray, workers, model loading
                self._last = now
                print(f"[{self.label}] starting up ({now - self._start:.0f} s): Ray, workers, models", flush=True)
            return
        shown = " ".join(f"{name}={values[key]:.3g}" for key, name in self.keys.items() if key in values)
        if not shown:  # a step's other records (validation, the pre-flight report logged with step 1)
            return
        self._stepped = True
        step = int(values["step"])
        now = time.time()
        if now - self._last < self.every_s and step not in (1, self.total):
            return
        self._last = now
        of = f"/{self.total}" if self.total else ""
        print(f"[{self.label}] step {step}{of}: {shown}", flush=True)


# Per-step metrics shown as progress (those a recipe logs) and their short names.
PROGRESS_KEYS = {"opsd/loss": "loss", "opsd/fwd_kl": "fwd_kl", "opsd/rollout_score": "score",
                 "critic/score/mean": "score", "response_length/mean": "length", "train/loss": "loss",
                 "timing_s/step": "s/step"}
