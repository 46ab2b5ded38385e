"""The first-hour GPU check: a few OPSD steps of a Hub model through verl's vLLM server, judged.

    python scripts/gpu_check.py [--model Qwen/Qwen3-0.6B] [--steps 3] [--dry-run] [hydra overrides...]

It launches ``recipe/opsd`` as ``run_opsd.sh`` would (``recipe.launch.run``: DEVICE=gpu, every GPU nvidia-smi
lists, the CPU demos' toy problems as data) with the rollout in float32 and the weight-sync probe on, then prints
per-phase times, tokens per second, peak GPU memory next to the memory model's prediction
(``recipe.analysis.memory_model``) and the probe after every weight push, and one verdict line:
``[gpu_check] verdict: OK ...`` or ``[gpu_check] verdict: FAILED: <first reason>`` (exit 0 / 1). ``--dry-run``
composes the same launch and prints it and the prediction (no GPU needed). What each figure means:
docs/cluster.md#5-the-first-hour-on-new-gpus.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from recipe.analysis.memory_model import GiB, ModelShape, UpdateSetting, memory_terms
from recipe.common import cli
from recipe.launch import config as composer
from recipe.launch.config import Settings, get_recipe, gpus_on_this_node
from recipe.launch.run import Launch, execute, plan
from recipe.toy.demo import write_tiny_data

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_STEPS = 3
# The weight-sync probe's log (recipe/rollout/sync_probe.py): one record per weight push.
PROBE_LOG_ENV = "OPSD_SYNC_CHECK_LOG"
PROBE_MODULE = "recipe.rollout.sync_check"


def probe_environment(log_path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that turn the weight-sync probe on in every process of the launch: the external module
    ``recipe.rollout.sync_check`` after ``environ``'s modules (the launcher forwards the list to every Ray worker)
    and its log path (every node too: the launcher forwards OPSD_* variables to a joined cluster's workers)."""
    listed = [m for m in (environ or {}).get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m.strip()]
    return {"VERL_USE_EXTERNAL_MODULES": ",".join(listed + [m for m in (PROBE_MODULE,) if m not in listed]),
            PROBE_LOG_ENV: str(log_path)}
# In sync, the rollout differs from the pushed weights' float32 forward by far less than one update moves it.
SYNC_FRACTION = 0.1
# Small, fixed run sizes: the check measures the machinery, the paper's sizes are the presets'.
CHECK_OVERRIDES = (
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
    "data.train_batch_size=16", "data.max_prompt_length=512", "data.max_response_length=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.save_freq=-1", "trainer.test_freq=-1",
    "trainer.val_before_train=false", "trainer.logger=[console,file]", "trainer.experiment_name=gpu_check",
)
# Known shapes for a prediction without the model's config.json at hand (a dry run offline).
KNOWN_SHAPES = {"Qwen/Qwen3-0.6B": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                        num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                                        vocab_size=151936, tie_word_embeddings=True, model_type="qwen3")}


def model_config(model: str, *, offline: bool = False) -> dict | None:
    """The model's config.json: a local directory's, else the Hub's (``offline``: the local cache only),
    else a known shape."""
    if (Path(model) / "config.json").is_file():
        return json.loads((Path(model) / "config.json").read_text())
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(model, "config.json", local_files_only=offline)).read_text())
    except Exception:  # offline, unknown id: the prediction falls back to a known shape, or none
        return KNOWN_SHAPES.get(model)


def predicted_peak_gib(cfg, config: dict | None, *, name: str) -> float | None:
    """The memory model's per-GPU peak of one OPSD actor update of this launch (None without a shape)."""
    if config is None:
        return None
    shape = ModelShape.from_hf_config(config, name=name)
    n_gpus = int(composer.select(cfg, "trainer.n_gpus_per_node")) * int(composer.select(cfg, "trainer.nnodes"))
    seq = int(composer.select(cfg, "data.max_prompt_length")) + int(composer.select(cfg, "data.max_response_length"))
    setting = UpdateSetting(n_gpus=n_gpus, seq_tokens=seq,
                            micro_batch=int(composer.select(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")))
    return memory_terms(shape=shape, setting=setting)["peak"] / GiB


def plan_check(*, model: str, steps: int, cache_dir: Path, overrides: Sequence[str] = (), build_data: bool = True,
               detect_gpus: Callable[[], int] = gpus_on_this_node, environ: dict | None = None) -> Launch:
    """The OPSD launch of the check (nothing started)."""
    import os

    environ = dict(os.environ if environ is None else environ)
    ckpt = cache_dir / "gpu_check" / model.replace("/", "--")
    environ.update(probe_environment(ckpt / "sync_probe.jsonl", environ))
    data_dir = cache_dir / "gpu_check" / "data"
    if build_data:  # the toy problems of the CPU demos: they need no download
        write_tiny_data(data_dir)
    settings = Settings(device="gpu", model_path=model, train_files=str(data_dir / "train.parquet"),
                        val_files=str(data_dir / "val.parquet"), steps=steps, ckpt_dir=str(ckpt),
                        cache_dir=str(cache_dir), ngpus=max(detect_gpus(), 1),
                        nnodes=int(environ["NNODES"]) if environ.get("NNODES") else None,
                        ray_address=environ.get("RAY_ADDRESS") or None)
    # without build_data (a dry run) the data files are not there yet, and a Hub id is not asked for
    pending = frozenset() if build_data else frozenset({settings.train_files, settings.val_files})
    return plan(get_recipe("opsd"), settings, [*CHECK_OVERRIDES, *overrides], environ=environ, detect_gpus=detect_gpus,
                pending=pending, dry_run=not build_data)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def report(metrics: dict[int, dict], probe: Sequence[dict], *, predicted_gib: float | None,
           samples_per_step: int) -> tuple[list[str], list[str]]:
    """(table lines, failures) of a finished check: per-phase times, throughput, memory, the probe."""
    steps = sorted(metrics)
    lines = ["| phase | step 1 (s) | mean after step 1 (s) |", "|---|---|---|"]
    phases = sorted({key for step in steps for key in metrics[step] if key.startswith("timing_s/")})
    for key in phases:
        later = [metrics[s][key] for s in steps[1:] if key in metrics[s]]
        lines.append(f"| {key.removeprefix('timing_s/')} | {metrics[steps[0]].get(key, math.nan):.2f} | {_mean(later):.2f} |")
    after = steps[1:] or steps
    throughput = _mean([metrics[s]["perf/throughput"] for s in after if "perf/throughput" in metrics[s]])
    generated = _mean([metrics[s]["response_length/mean"] * samples_per_step / metrics[s]["timing_s/gen"]
                       for s in after if "timing_s/gen" in metrics[s] and "response_length/mean" in metrics[s]])
    allocated = max((metrics[s].get("perf/max_memory_allocated_gb", math.nan) for s in steps), default=math.nan)
    reserved = max((metrics[s].get("perf/max_memory_reserved_gb", math.nan) for s in steps), default=math.nan)
    lines += ["", f"tokens per second per GPU (perf/throughput, after step 1): {throughput:.0f}",
              f"rollout: generated tokens per second (timing_s/gen, after step 1): {generated:.0f}",
              f"peak GPU memory per rank: allocated {allocated:.1f} GiB, reserved {reserved:.1f} GiB; memory model "
              f"(actor update, no CUDA context): {'n/a' if predicted_gib is None else f'{predicted_gib:.1f} GiB'}"]
    failures = []
    if steps != list(range(1, len(steps) + 1)) or not steps:
        failures.append(f"the run logged steps {steps}")
    pushes = [record["global_steps"] for record in probe]
    lines.append(f"weight sync probe (pushes at steps {pushes}): " + ", ".join(
        f"step {r['global_steps']} diff {r['max_abs_logprob_diff']:.1e}"
        + (f" vs update {r['update_max_abs_logprob_diff']:.1e}" if "update_max_abs_logprob_diff" in r else "")
        for r in probe))
    if pushes[:1] != [0] or len(pushes) < len(steps) + 1:
        failures.append(f"the probe saw pushes at steps {pushes}, expected start-up and every step")
    for record in probe[1:]:
        update = record.get("update_max_abs_logprob_diff", 0.0)
        if not record["max_abs_logprob_diff"] < SYNC_FRACTION * update:
            failures.append(f"after the push of step {record['global_steps']} the rollout differs from the trainer's "
                            f"weights by {record['max_abs_logprob_diff']:.1e}, one update moves it {update:.1e}: "
                            "the rollout does not serve the trainer's weights")
    if predicted_gib is not None and reserved > predicted_gib + 4.0:
        failures.append(f"peak reserved memory {reserved:.1f} GiB exceeds the memory model's {predicted_gib:.1f} GiB "
                        "by more than the CUDA context and allocator slack (4 GiB)")
    return lines, failures


def missing_gpu_packages() -> list[str]:
    """What a GPU OPSD run needs beyond the project: vLLM (the rollout) and flash-attn (verl's default attention)."""
    need = {"vllm": "pip install torch==2.11.0 && pip install -e '.[vllm]'",
            "flash_attn": "pip install flash-attn==2.8.3 --no-build-isolation"}
    return [f"{name} ({command})" for name, command in need.items() if importlib.util.find_spec(name) is None]


def run_check(*, model: str = DEFAULT_MODEL, steps: int = DEFAULT_STEPS, cache_dir: Path, overrides: Sequence[str] = (),
              dry_run: bool = False, detect_gpus: Callable[[], int] = gpus_on_this_node) -> int:
    """Plan (and unless ``dry_run`` run and judge) the check; returns the exit code (0 OK, 1 FAILED, 2 refused)."""
    if not dry_run and detect_gpus() < 1:
        raise cli.InputError("lists no GPU on this machine", file="nvidia-smi", hint="--dry-run shows the launch without one")
    missing = [] if dry_run else missing_gpu_packages()
    if missing:
        raise cli.InputError(f"not installed: {'; '.join(missing)}", file="gpu_check")
    launch = plan_check(model=model, steps=steps, cache_dir=cache_dir, overrides=overrides, build_data=not dry_run,
                        detect_gpus=detect_gpus)
    predicted = predicted_peak_gib(launch.config, model_config(model, offline=dry_run), name=model)
    print(launch.describe(), flush=True)
    print(f"[gpu_check] {steps} OPSD steps of {model}; weight-sync probe log {launch.env[PROBE_LOG_ENV]}; memory model "
          f"(actor update per GPU): {'n/a' if predicted is None else f'{predicted:.1f} GiB'}", flush=True)
    if dry_run:
        return 0
    record = execute(launch)
    if record["exit_code"] != 0:
        print(f"[gpu_check] verdict: FAILED: the OPSD launch exited with {record['exit_code']} (its output is above)")
        return 1
    from recipe.analysis.run_logs import read_jsonl_metrics

    metrics = {int(row["step"]): row for row in read_jsonl_metrics(record["metrics"])}
    probe_path = Path(launch.env[PROBE_LOG_ENV])
    probe = [json.loads(line) for line in probe_path.read_text().splitlines() if line.strip()] if probe_path.exists() else []
    samples = int(composer.select(launch.config, "data.train_batch_size")) * int(
        composer.select(launch.config, "actor_rollout_ref.rollout.n"))
    lines, failures = report(metrics, probe, predicted_gib=predicted, samples_per_step=samples)
    print("\n".join(lines))
    if failures:
        print(f"[gpu_check] verdict: FAILED: {failures[0]}")
        return 1
    n_gpus = int(composer.select(launch.config, "trainer.n_gpus_per_node")) * int(composer.select(launch.config, "trainer.nnodes"))
    print(f"[gpu_check] verdict: OK: {steps} OPSD steps of {model} on {n_gpus} GPU(s) in {record['wall_time_s']} s; "
          "the rollout serves the trainer's weights after every push; memory within the model's prediction")
    return 0
