"""Sweep runner: experiment presets -> runs -> resolved configs -> training -> evaluation -> tables.

The library behind ``scripts/sweep.py`` (docs/presets.md: what a sweep does, its directory's layout). A sweep is one
model preset and a list of experiment presets (``a+b``: both in one run). ``plan_run`` composes a run's config with
hydra, plans it with the launcher (``recipe.launch.run.plan``, as ``run_opsd.sh`` would launch it), runs its data
step (``recipe.experiments.sweep_data``) and writes the resolved ``config.yaml`` the run trains from; ``run_one``
trains and evaluates the checkpoints with ``recipe.evaluation.harness``; ``collect`` writes the comparison table and
figures. Runs execute in this process (``run_local``) or as Ray jobs (``submit_ray``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from recipe.common.cli import TolerantLog
from recipe.launch import config as composer
from recipe.launch.config import REPO_ROOT, get_recipe
from recipe.opsd.core.teacher_kinds import teacher_kind

RECIPE = get_recipe("opsd")
CONFIG_DIR = RECIPE.config_dir
SWEEP_CLI = REPO_ROOT / "scripts" / "sweep.py"
DEVICES = ("gpu", "cpu")


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation of every base model and checkpoint of a sweep (the paper: n 8, seed 42, four benchmarks)."""

    n: int = 8
    seed: int = 42
    benchmarks: tuple[str, ...] = ("aime2024", "aime2025", "aime2026", "hmmt_feb_2025")
    limit: int | None = None
    backend: str | None = None

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"evaluation n must be >= 1, got {self.n}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"evaluation limit must be None or >= 1, got {self.limit}")
        if self.backend not in (None, "vllm", "sglang", "hf"):
            raise ValueError(f"evaluation backend must be vllm, sglang, hf or None, got {self.backend!r}")


@dataclass(frozen=True)
class RunSpec:
    """One training run: a model preset, the experiment presets it combines, extra overrides."""

    name: str
    model: str
    experiments: tuple[str, ...]
    overrides: tuple[str, ...] = ()


# --------------------------------------------------------------------------- presets
def available(group: str) -> list[str]:
    """Preset names of ``experiment`` or ``model``."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def expand_runs(presets: Sequence[str], *, model: str, overrides: Sequence[str] = ()) -> list[RunSpec]:
    """One RunSpec per entry of ``presets``; ``a+b`` composes presets a and b in one run."""
    if model not in available("model"):
        raise ValueError(f"unknown model preset {model!r}; known: {available('model')}")
    known = set(available("experiment"))
    runs, names = [], set()
    for entry in presets:
        parts = tuple(p for p in entry.split("+") if p)
        unknown = [p for p in parts if p not in known]
        if not parts or unknown:
            raise ValueError(f"unknown experiment preset(s) {unknown or [entry]} in {entry!r}; known: {sorted(known)}")
        name = "+".join(parts)
        if name in names:
            raise ValueError(f"preset {name!r} is listed twice")
        names.add(name)
        runs.append(RunSpec(name=name, model=model, experiments=parts, overrides=tuple(overrides)))
    if not runs:
        raise ValueError("no presets given")
    return runs


def compose(overrides: Sequence[str]):
    """The OPSD config (``opsd_trainer`` + overrides) composed with hydra, unresolved."""
    return composer.compose(RECIPE, overrides)


# --------------------------------------------------------------------------- evaluation settings
def eval_choice(cfg) -> tuple[str, str, str | None]:
    """(mode key, decoding preset name, mode) of a composed config's evaluation.

    The mode is ``sweep.eval_mode`` if a preset sets it, else the student's mode (``native`` for
    single-mode models). The decoding preset is the model preset's for that mode.
    """
    from omegaconf import OmegaConf

    if cfg.get("model_preset") is None:
        raise ValueError("the config has no model_preset block: add +model=<name> (recipe/opsd/config/model)")
    sweep = cfg.get("sweep") or {}
    mode = sweep.get("eval_mode") or cfg.opsd.get("student_mode") or "native"
    key = mode
    presets = OmegaConf.to_container(cfg.model_preset.eval_presets, resolve=True)
    if key not in presets:
        raise ValueError(
            f"model preset {cfg.model_preset.name!r} has no evaluation preset for mode {key!r} "
            f"(model_preset.eval_presets: {presets})"
        )
    return key, presets[key], mode


def decoding_for(preset_name: str, mode: str):
    """The named decoding preset evaluated in ``mode`` (the preset's own mode is replaced when they differ)."""
    from recipe.evaluation.decoding_presets import get_preset

    preset = get_preset(preset_name)
    mode = mode or "native"
    return preset if preset.mode == mode else preset.with_overrides(mode=mode)


def eval_steps(cfg) -> list[int]:
    """Checkpoint steps to evaluate: the last one, plus every ``sweep.eval_every`` steps (after the
    continued step of a ``sweep.continue_from`` run: the earlier checkpoints are the continued run's)."""
    total = int(cfg.trainer.total_training_steps)
    every = (cfg.get("sweep") or {}).get("eval_every")
    start = int(((cfg.get("sweep") or {}).get("continue_from") or {}).get("step", 0))
    steps = {total}
    if every:
        steps |= set(range(int(every), total + 1, int(every)))
    steps = {s for s in steps if s > start}
    save = int(cfg.trainer.save_freq)
    missing = sorted(s for s in steps if s != total and (save <= 0 or s % save))
    if missing:
        raise ValueError(f"evaluation steps {missing} are not checkpoint steps (trainer.save_freq={save})")
    return sorted(steps)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def base_key(model_preset: str, model_path: str, preset_name: str, mode_key: str) -> str:
    digest = hashlib.sha256(model_path.encode()).hexdigest()[:8]
    return _slug(f"{model_preset}-{preset_name}-{mode_key}-{digest}")


# --------------------------------------------------------------------------- planning
def _write_new(path: Path, text: str) -> None:
    """Write ``text``; an existing different file is an error (a planned run is never replaced silently)."""
    if path.exists() and path.read_text() != text:
        raise ValueError(f"{path} exists with different content: use a new sweep directory or delete the run")
    path.write_text(text)


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def plan_run(
    spec: RunSpec, *, sweep_dir: Path, device: str, evaluation: EvalSettings, train_timeout_s: float | None = None,
    dry_run: bool = False,
) -> dict:
    """Compose, prepare data, write ``config.yaml`` + ``plan.json`` of one run; return the plan.

    ``dry_run``: compose the final config (printed by ``scripts/sweep.py plan --dry-run``) without
    running the data step or writing anything; the plan then carries ``config_yaml``.
    """
    from omegaconf import OmegaConf

    from recipe.experiments import sweep_data
    from recipe.launch.config import Settings
    from recipe.launch.run import plan as plan_launch

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    run_dir = (sweep_dir / "runs" / _slug(spec.name)).resolve()
    if not dry_run:
        run_dir.mkdir(parents=True, exist_ok=True)
    # the launcher's plan, as run_opsd.sh would launch the run: presets, platform, grader, the verl
    # environment and its forwarding to every Ray worker, derived token budgets, start-up checks
    settings = Settings(device=device, ckpt_dir=str(run_dir / "checkpoints"))
    argv = [f"+model={spec.model}", f"+experiment=[{','.join(spec.experiments)}]", *spec.overrides,
            f"trainer.experiment_name={_slug(spec.name)}"]

    def launch(extra: list[str], *, checks: bool):
        try:
            return plan_launch(RECIPE, settings, argv + extra, environ=dict(os.environ), detect_gpus=lambda: 0,
                               startup_checks=checks, dry_run=dry_run)
        except ValueError as err:  # the launch's own line (a start-up check's), named by the run
            raise ValueError(f"run {spec.name!r}: {getattr(err, 'line', err)}") from err

    cfg = launch([], checks=False).config
    sweep = OmegaConf.to_container(cfg.get("sweep") or {}, resolve=True)
    base_model = str(cfg.actor_rollout_ref.model.path)
    stages, forced = [], []
    # inputs an earlier step of the sweep makes: the run's entry point checks them when it starts
    deferred = bool(sweep.get("continue_from") or sweep.get("init_stage") or (sweep.get("data_prep") and dry_run))
    if sweep.get("data_prep"):
        source, prepared = str(cfg.data.train_files), run_dir / "data" / "train.parquet"
        if not dry_run:
            tokenizer = _load_tokenizer(base_model) if sweep["data_prep"].get("kind") == "gold_trace_deciles" else None
            sweep_data.prepare(sweep["data_prep"], source=source, output=prepared, tokenizer=tokenizer)
        forced.append(f"data.train_files={prepared}")
    if sweep.get("continue_from"):
        # a continuation (steps_300_continued): resume the named run of this sweep at its checkpoint (run it first)
        origin = sweep["continue_from"]
        folder = sweep_dir / "runs" / _slug(str(origin["run"])) / "checkpoints" / f"global_step_{int(origin['step'])}"
        forced += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder.resolve()}"]
    if sweep.get("init_stage"):
        stage_cmds, init_model = init_stage_commands(sweep["init_stage"], cfg=cfg, run_dir=run_dir, device=device)
        stages += stage_cmds
        if teacher_kind(str(cfg.opsd.teacher.kind)).loads_path:
            # the teacher is the checkpoint the presets named before the stage (sft10_then_no_privilege:
            # ${actor_rollout_ref.model.path}, the pre-SFT model), not the stage's output
            forced.append(f"opsd.teacher.path={cfg.opsd.teacher.path}")
        forced.append(f"actor_rollout_ref.model.path={init_model}")
    final = launch(forced, checks=not deferred)
    cfg = final.config
    env = {k: v for k, v in final.verl_env.items() if os.environ.get(k) != v}
    env["VERL_FILE_LOGGER_PATH"] = str(run_dir / "metrics.jsonl")
    mode_key, preset_name, mode = eval_choice(cfg)
    steps = eval_steps(cfg)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    train_cmd = [sys.executable, "-m", "recipe.opsd.main_opsd", "--config-path", str(run_dir), "--config-name", "config",
                 f"hydra.run.dir={run_dir / 'hydra'}"]
    ckpt = Path(str(cfg.trainer.default_local_dir))
    plan = {
        "name": spec.name,
        "label": (cfg.get("sweep") or {}).get("label") or spec.name,
        "model_preset": spec.model,
        "experiments": list(spec.experiments),
        "run_dir": str(run_dir),
        "device": device,
        "env": env,
        "stages": stages,
        "train_cmd": train_cmd,
        "train_timeout_s": train_timeout_s,
        "eval": {
            "mode_key": mode_key,
            "preset": preset_name,
            "mode": mode,
            "settings": dataclasses.asdict(evaluation),
            "checkpoints": {str(s): str(ckpt / f"global_step_{s}" / "actor") for s in steps},
            "init_model": str(cfg.actor_rollout_ref.model.path) if stages else None,
        },
        "base": base_key(spec.model, base_model, preset_name, mode_key),
        "base_model": base_model,
    }
    if dry_run:
        return plan | {"config_yaml": config_yaml}
    _record_data_order(cfg, ckpt)
    _write_new(run_dir / "config.yaml", config_yaml)
    _write_new(run_dir / "overrides.txt", "\n".join(final.overrides.as_list()) + "\n")
    _write_new(run_dir / "plan.json", json.dumps(plan, indent=2) + "\n")
    return plan


def _record_data_order(cfg, ckpt: Path) -> None:
    """``data_order.json`` in the run's checkpoint directory, as a launch through recipe.launch writes it
    (recipe.launch.data_order: the rows the run trains on, in order; an over-long prompt is refused here)."""
    from omegaconf import OmegaConf

    from recipe.launch.data_order import plan_data_order, write_record
    from recipe.opsd.startup import prepare_config

    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    prepare_config(resolved)  # the student's chat-template mode, as the entry point sets it
    ckpt.mkdir(parents=True, exist_ok=True)
    write_record(*plan_data_order(resolved), ckpt)


def init_stage_commands(stage: Mapping, *, cfg, run_dir: Path, device: str) -> tuple[list[dict], Path]:
    """Commands of a ``sweep.init_stage`` (``kind: sft``): SFT data, verl SFT trainer, FSDP merge.

    Returns (commands, merged model dir); OPSD then starts from the merged model (student = teacher).
    """
    if stage.get("kind") != "sft":
        raise ValueError(f"sweep.init_stage.kind must be 'sft', got {stage.get('kind')!r}")
    steps = int(stage["total_steps"])
    model = str(cfg.actor_rollout_ref.model.path)
    sft_ckpt, merged = run_dir / "sft" / "checkpoints", run_dir / "sft" / "merged"
    commands = []
    sft_files = stage.get("train_files")
    if not sft_files:  # the OPSD training parquet (problem + cot + solution) as SFT messages
        sft_files = run_dir / "sft" / "train.parquet"
        commands.append({"name": "sft_data", "cmd": [
            sys.executable, "-m", "data_prep.sft", "--input", str(cfg.data.train_files), "--tokenizer", model,
            "--out", str(sft_files)]})
    env = {"MODEL_PATH": model, "TRAIN_FILES": str(sft_files), "CKPT_DIR": str(sft_ckpt), "DEVICE": device}
    if device == "gpu":
        env["NGPUS"] = str(cfg.trainer.n_gpus_per_node)
    commands.append({"name": "sft_train", "cmd": [
        "bash", str(REPO_ROOT / "recipe" / "sft" / "run_sft.sh"),
        f"trainer.total_training_steps={steps}", f"trainer.save_freq={steps}"], "env": env})
    commands.append({"name": "sft_merge", "cmd": [
        sys.executable, "-m", "recipe.common.merge", str(sft_ckpt / f"global_step_{steps}"), str(merged)]})
    return commands, merged


def plan_sweep(
    presets: Sequence[str], *, model: str, sweep_dir: str | Path, device: str = "gpu",
    overrides: Sequence[str] = (), evaluation: EvalSettings = EvalSettings(), train_timeout_s: float | None = None,
    dry_run: bool = False,
) -> list[dict]:
    """Plan every run and every base evaluation of a sweep (writes the sweep directory).

    ``dry_run``: compose every run's final config (``plan["config_yaml"]``), write and prepare nothing.
    """
    sweep_dir = Path(sweep_dir).resolve()
    runs = expand_runs(presets, model=model, overrides=overrides)
    if dry_run:
        return [plan_run(spec, sweep_dir=sweep_dir, device=device, evaluation=evaluation, dry_run=True) for spec in runs]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    record = {"model": model, "presets": list(presets), "overrides": list(overrides), "device": device,
              "evaluation": dataclasses.asdict(evaluation)}
    _write_new(sweep_dir / "sweep.json", json.dumps(record, indent=2) + "\n")
    plans = [plan_run(spec, sweep_dir=sweep_dir, device=device, evaluation=evaluation, train_timeout_s=train_timeout_s)
             for spec in runs]
    for plan in plans:
        task_dir = sweep_dir / "base" / plan["base"]
        task_dir.mkdir(parents=True, exist_ok=True)
        task = {"model": plan["base_model"], "preset": plan["eval"]["preset"], "mode": plan["eval"]["mode"],
                "mode_key": plan["eval"]["mode_key"], "settings": plan["eval"]["settings"],
                "env": {k: v for k, v in plan["env"].items() if k != "VERL_FILE_LOGGER_PATH"}}
        _write_new(task_dir / "task.json", json.dumps(task, indent=2) + "\n")
    return plans


# --------------------------------------------------------------------------- execution
def _status(run_dir: Path) -> dict:
    path = run_dir / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _set_status(run_dir: Path, **changes) -> None:
    status = _status(run_dir) | changes
    (run_dir / "status.json").write_text(json.dumps(status, indent=2) + "\n")


def _run_logged(cmd: Sequence[str], *, env: Mapping[str, str], log: Path, timeout_s: float | None) -> int:
    """Run ``cmd`` with output appended to ``log`` by the launcher's runner (``recipe.launch.processes.run_marked``:
    every process it starts is killed on timeout, rc -9, and when it exits)."""
    from recipe.launch.processes import run_marked

    sink = TolerantLog(log)
    try:
        sink.write(f"$ {shlex.join(cmd)}\n")
        return run_marked(list(cmd), cwd=REPO_ROOT, env=dict(os.environ) | dict(env), sink=sink, timeout_s=timeout_s)
    finally:
        sink.close()


def evaluate_model(model: str, *, out_dir: Path, preset: str, mode: str | None, settings: Mapping, progress=False) -> dict:
    """Evaluate ``model`` (HF dir or FSDP ``.../actor`` checkpoint) with ``recipe.evaluation.harness``
    (``mode`` None: a plan written before the native mode had a name)."""
    from recipe.evaluation.harness import EvalConfig, evaluate

    config = EvalConfig(model=model, out_dir=str(out_dir), preset=decoding_for(preset, mode),
                        benchmarks=tuple(settings["benchmarks"]), n=settings["n"], seed=settings["seed"],
                        backend=settings["backend"], limit=settings["limit"])
    return evaluate(config, progress=progress)


def run_base_task(task_dir: str | Path) -> dict:
    """Evaluate the base model of ``<sweep>/base/<key>`` (resumable)."""
    task_dir = Path(task_dir)
    task = json.loads((task_dir / "task.json").read_text())
    os.environ.update(task["env"])
    return evaluate_model(task["model"], out_dir=task_dir, preset=task["preset"], mode=task["mode"],
                          settings=task["settings"])


def run_one(run_dir: str | Path) -> dict:
    """Execute a planned run: init stage (if any), training from ``config.yaml``, evaluation of its checkpoints."""
    run_dir = Path(run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    log = run_dir / "train.log"
    status = _status(run_dir)
    checkpoints = {int(s): Path(p) for s, p in plan["eval"]["checkpoints"].items()}
    if status.get("train") != "ok" or not all(p.is_dir() for p in checkpoints.values()):
        for stage in plan["stages"]:
            if status.get(stage["name"]) == "ok":
                continue
            rc = _run_logged(stage["cmd"], env=plan["env"] | stage.get("env", {}), log=log, timeout_s=None)
            _set_status(run_dir, **{stage["name"]: "ok" if rc == 0 else f"failed (rc={rc})"})
            if rc != 0:
                return _status(run_dir)
        rc = _run_logged(plan["train_cmd"], env=plan["env"], log=log, timeout_s=plan["train_timeout_s"])
        missing = [str(p) for p in checkpoints.values() if not p.is_dir()]
        if rc != 0 or missing:
            reason = f"rc={rc}" if rc != 0 else f"no checkpoint {missing}"
            _set_status(run_dir, train=f"failed ({reason}; see {log})")
            return _status(run_dir)
        _set_status(run_dir, train="ok")
    os.environ.update(plan["env"])
    evals = dict(_status(run_dir).get("eval", {}))
    targets = dict(sorted(checkpoints.items()))
    if plan["eval"]["init_model"]:
        targets[0] = Path(plan["eval"]["init_model"])  # the init-stage model (e.g. SFT-10) as step 0
    for step, model in targets.items():
        try:
            evaluate_model(str(model), out_dir=run_dir / "eval" / f"step_{step}", preset=plan["eval"]["preset"],
                           mode=plan["eval"]["mode"], settings=plan["eval"]["settings"])
            evals[str(step)] = "ok"
        except Exception as err:  # recorded; the sweep goes on with the next run
            evals[str(step)] = f"failed: {type(err).__name__}: {err}"
        _set_status(run_dir, eval=evals)
    return _status(run_dir)


def run_local(plans: Sequence[Mapping], *, sweep_dir: str | Path) -> list[dict]:
    """Base evaluations, then every run, sequentially in this process; then the tables."""
    sweep_dir = Path(sweep_dir)
    done = set()
    for plan in plans:
        if plan["base"] not in done:
            run_base_task(sweep_dir / "base" / plan["base"])
            done.add(plan["base"])
    statuses = [run_one(plan["run_dir"]) for plan in plans]
    collect(sweep_dir)
    return statuses


def ray_submit_command(task: Sequence[str], *, address: str, submission_id: str, env: Mapping[str, str]) -> list[str]:
    """``ray job submit`` of one task (non-blocking); the job runs from the repository checkout."""
    runtime_env = {"env_vars": dict(env)} if env else None
    cmd = ["ray", "job", "submit", "--address", address, "--submission-id", submission_id, "--no-wait"]
    if runtime_env:
        cmd += ["--runtime-env-json", json.dumps(runtime_env)]
    return cmd + ["--", *task]


def submit_ray(plans: Sequence[Mapping], *, sweep_dir: str | Path, address: str, dry_run: bool = False) -> list[list[str]]:
    """Submit each base evaluation and each run as its own Ray job; ``collect`` once they finish."""
    sweep_dir = Path(sweep_dir).resolve()
    commands, seen = [], set()
    stamp = hashlib.sha256(str(sweep_dir).encode()).hexdigest()[:6]
    for plan in plans:
        if plan["base"] not in seen:
            seen.add(plan["base"])
            task = [sys.executable, str(SWEEP_CLI), "eval-base", str(sweep_dir / "base" / plan["base"])]
            commands.append(ray_submit_command(task, address=address, submission_id=_slug(f"sweep-{stamp}-base-{plan['base']}"),
                                               env=plan["env"]))
        task = [sys.executable, str(SWEEP_CLI), "run-one", plan["run_dir"]]
        commands.append(ray_submit_command(task, address=address, submission_id=_slug(f"sweep-{stamp}-{plan['name']}"),
                                           env=plan["env"]))
    if not dry_run:
        for cmd in commands:
            subprocess.run(cmd, check=True, cwd=REPO_ROOT)
    return commands


# --------------------------------------------------------------------------- tables and figures
def _metrics(results: Mapping) -> dict:
    n, macro = results["n"], results["macro"]
    return {"n": n, "avg": 100 * macro[f"avg@{n}"], "pass": 100 * macro[f"pass@{n}"], "length": macro["mean_length"]}


def _read_results(path: Path) -> dict | None:
    return _metrics(json.loads(path.read_text())) if path.is_file() else None


def _fmt(value: float | None, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.0f}" if kind == "length" else f"{value:.1f}"


def _delta(base: float | None, value: float | None, kind: str) -> str:
    if base is None or value is None:
        return "-"
    if kind == "length":
        return "-" if base == 0 else f"{100 * (value - base) / base:+.1f}%"
    return f"{value - base:+.1f}"


def comparison_rows(sweep_dir: str | Path) -> list[dict]:
    """One row per evaluated checkpoint: run, label, step, evaluation setting, Base and OPSD metrics."""
    sweep_dir = Path(sweep_dir)
    record = sweep_dir / "sweep.json"
    order = [_slug(p) for p in json.loads(record.read_text())["presets"]] if record.is_file() else []
    rank = {name: i for i, name in enumerate(order)}
    rows = []
    plan_paths = sorted((sweep_dir / "runs").glob("*/plan.json"), key=lambda p: (rank.get(p.parent.name, len(rank)), p.parent.name))
    for plan_path in plan_paths:
        plan = json.loads(plan_path.read_text())
        run_dir = Path(plan["run_dir"])
        base = _read_results(sweep_dir / "base" / plan["base"] / "results.json")
        steps = sorted(int(s) for s in plan["eval"]["checkpoints"]) + ([0] if plan["eval"]["init_model"] else [])
        status = _status(run_dir)
        for step in sorted(steps):
            rows.append({
                "run": plan["name"], "label": plan["label"], "step": step, "final": step == max(steps),
                "model_preset": plan["model_preset"], "eval": f"{plan['eval']['preset']}/{plan['eval']['mode_key']}",
                "base": base, "opsd": _read_results(run_dir / "eval" / f"step_{step}" / "results.json"),
                "status": status.get("train", "planned"),
            })
    return rows


def comparison_table(rows: Sequence[Mapping]) -> str:
    """Markdown table in the paper's style: Base / OPSD / delta for Avg@n, Pass@n and Length."""
    ns = {r[k]["n"] for r in rows for k in ("base", "opsd") if r[k]}
    n = ns.pop() if len(ns) == 1 else "n"
    head = (f"| Run | Step | Eval | Avg@{n} Base | Avg@{n} OPSD | Δ | Pass@{n} Base | Pass@{n} OPSD | Δ | "
            "Length Base | Length OPSD | Δ |")
    lines = [head, "|" + "|".join(["---"] * 12) + "|"]
    for r in rows:
        cells = [r["label"] + ("" if r["opsd"] or r["status"] in ("ok", "planned") else f" ({r['status']})"),
                 str(r["step"]), r["eval"]]
        for key in ("avg", "pass", "length"):
            b = r["base"][key] if r["base"] else None
            o = r["opsd"][key] if r["opsd"] else None
            cells += [_fmt(b, key), _fmt(o, key), _delta(b, o, key)]
        lines.append("| " + " | ".join(cells) + " |")
    note = ("\nΔ: OPSD - Base in percentage points for Avg/Pass, relative change for Length "
            "(mean output tokens); Base is the initial model under the same evaluation setting.\n")
    return "\n".join(lines) + "\n" + note


def _figures(rows: Sequence[Mapping], out_dir: Path) -> list[Path]:
    from recipe.analysis import plots

    made = []
    caps = {}
    for r in rows:
        names = r["run"].split("+")
        if r["final"] and r["opsd"] and r["base"] and len(names) == 1 and re.fullmatch(r"rollout_\d+", names[0]):
            caps[int(names[0].split("_")[1])] = r
    if len(caps) >= 2:
        ordered = [caps[c] for c in sorted(caps)]
        model = ordered[0]["model_preset"]
        series = {"caps": sorted(caps), "opsd": {k: [r["opsd"][k] for r in ordered] for k in ("avg", "pass", "length")},
                  "base": dict(ordered[0]["base"])}
        made.append(plots.plot_metric_vs_cap({model: series}, out_dir / "metric_vs_cap.png",
                                             n=ordered[0]["opsd"]["n"], overwrite=True))
    by_run = {}
    for r in rows:
        by_run.setdefault(r["label"], []).append(r)
    curves = {}
    for label, rs in by_run.items():
        points = [{"step": r["step"], "avg": r["opsd"]["avg"], "pass": r["opsd"]["pass"]} for r in rs if r["opsd"]]
        if len(points) >= 2 and rs[0]["base"]:
            curves[label] = [{"step": 0, "avg": rs[0]["base"]["avg"], "pass": rs[0]["base"]["pass"]}] + points
    if curves:
        n = next(r["opsd"]["n"] for rs in by_run.values() for r in rs if r["opsd"])
        made.append(plots.plot_accuracy_vs_step(curves, out_dir / "accuracy_vs_step.png", n=n, overwrite=True))
    return made


def collect(sweep_dir: str | Path) -> str:
    """Write ``comparison.md`` / ``comparison.json`` (and figures) of a sweep; return the Markdown."""
    sweep_dir = Path(sweep_dir)
    rows = comparison_rows(sweep_dir)
    if not rows:
        raise ValueError(f"{sweep_dir}: no planned runs (runs/*/plan.json)")
    text = comparison_table(rows)
    figures = _figures(rows, sweep_dir / "figures")
    if figures:
        text += "\nFigures: " + ", ".join(str(p.relative_to(sweep_dir)) for p in figures) + "\n"
    (sweep_dir / "comparison.md").write_text(text)
    (sweep_dir / "comparison.json").write_text(json.dumps(rows, indent=2) + "\n")
    return text
