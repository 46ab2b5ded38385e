"""OPSD-vs-GRPO compute table from two runs' step metrics (pure: stdlib, and PyYAML to read a launch config).

Called by ``recipe.experiments.opsd_grpo_cost`` (``scripts/compare_opsd_grpo.py``): ``run_cost`` splits each
step into phases from verl's ``timing_s/*`` and ``perf/*`` metrics, ``check_same_data`` compares the runs'
``data_order.json`` records (``recipe.launch.data_order``), ``cost_table`` prints both runs beside the paper's
numbers. What each row measures: docs/cost.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

PHASES = ("generation", "teacher", "update", "other")

# Paper, tab:opsd_grpo_compute (GPU hours of 50 training steps: training-loop time through the
# evaluated checkpoint, app:released_grpo).
PAPER_GPU_HOURS = {"Qwen3-1.7B": (0.66, 114.27), "Qwen3-4B": (1.13, 171.81)}

# What differs between the paper's two recipes (app:released_grpo, app:grpo_configuration).
PAPER_SETTINGS = (
    ("GPUs", "2 A800", "4 A800 (1.7B) / 8 A800 (4B)"),
    ("samples per prompt", "1", "8"),
    ("response cap", "1,024", "24,576"),
    ("prompts per step", "64", "64"),
    ("extra forwards", "frozen teacher", "frozen reference (KL) + old log-probs"),
    ("offload", "none stated", "actor parameters + optimizer"),
    ("GRPO loss aggregation", "-", "1/|y| per response, then the mean (eq. grpo_related)"),
)

DATA_ORDER_FILE = "data_order.json"  # recipe.launch.data_order.DATA_ORDER_FILE

# verl's loss_agg_mode -> what it weighs (the GRPO row of the table)
AGGREGATIONS = {
    "seq-mean-token-mean": "seq-mean-token-mean: each response's token mean, then the mean over responses "
                           "(the paper's GRPO equation)",
    "token-mean": "token-mean: every token of the mini-batch weighs the same (DAPO; verl's default)",
    "seq-mean-token-sum": "seq-mean-token-sum: each response's token sum, then the mean over responses",
    "seq-mean-token-sum-norm": "seq-mean-token-sum-norm: token sums over a constant length, then the mean",
    "token-sum": "token-sum: the sum over every token",
}


class DataMismatch(ValueError):
    """The two runs did not train on the same rows in the same order (or one of them has no record)."""


def read_data_order(run_dir: str | Path) -> dict:
    """The data-order record of a run directory (``data_order.json``, written at launch)."""
    path = Path(run_dir) / DATA_ORDER_FILE
    if not path.is_file():
        raise DataMismatch(f"{path}: no data-order record (runs launched through run_opsd.sh / run_grpo.sh write "
                           "one; relaunch the run with this version)")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataMismatch(f"{path}: not valid JSON ({err})") from None
    return {**record, "path": str(path)}


def check_same_data(*, opsd: Mapping, grpo: Mapping) -> str:
    """One line saying both runs trained on the same rows in the same order; ``DataMismatch`` otherwise,
    naming what differs. ``opsd`` / ``grpo``: ``read_data_order`` records."""
    for name, rec in (("OPSD", opsd), ("GRPO", grpo)):
        if not rec.get("order_sha256"):
            raise DataMismatch(f"{name} run: its row order was not recorded ({rec.get('path', DATA_ORDER_FILE)}: "
                               f"{rec.get('why') or 'no order_sha256'})")
    if opsd["rows"] == grpo["rows"] and opsd["order_sha256"] == grpo["order_sha256"]:
        return f"same data: both runs trained on the same {opsd['rows']} rows in the same order (sha256 {opsd['order_sha256'][:16]})"
    why = [f"{opsd['rows']} vs {grpo['rows']} rows"] if opsd["rows"] != grpo["rows"] else ["another row order"]
    if opsd.get("filter_overlong_prompts") != grpo.get("filter_overlong_prompts"):
        why.append(f"data.filter_overlong_prompts {opsd.get('filter_overlong_prompts')} vs {grpo.get('filter_overlong_prompts')}")
    if opsd.get("rows_in_dataset") != opsd.get("rows_in_files") or grpo.get("rows_in_dataset") != grpo.get("rows_in_files"):
        why.append(f"rows kept of the files: {opsd.get('rows_in_dataset')}/{opsd.get('rows_in_files')} vs "
                   f"{grpo.get('rows_in_dataset')}/{grpo.get('rows_in_files')}")
    raise DataMismatch(
        f"the runs did not train on the same data: OPSD {opsd['rows']} rows, order sha256 {opsd['order_sha256'][:16]} "
        f"({opsd.get('path')}); GRPO {grpo['rows']} rows, order sha256 {grpo['order_sha256'][:16]} ({grpo.get('path')}): "
        f"{'; '.join(why)} (the matched pair: GRPO +experiment=released_grpo on the source parquet, OPSD "
        "+experiment=opsd_vs_grpo_matched on its sampler's rows)")


def loss_aggregation(config: Mapping) -> str:
    """The GRPO run's loss aggregation, named and explained, from its resolved launch config (a mapping)."""
    mode = ((config.get("actor_rollout_ref") or {}).get("actor") or {}).get("loss_agg_mode")
    if mode is None:
        return "not recorded"
    return AGGREGATIONS.get(mode, mode)


def read_launch_config(record: Mapping) -> dict:
    """The resolved config a launch ran with (``run_times.jsonl`` record's ``config``: launch_config*.yaml)."""
    import yaml

    path = record.get("config")
    if not path or not Path(path).is_file():
        return {}
    return yaml.safe_load(Path(path).read_text()) or {}


@dataclass(frozen=True)
class RunCost:
    """One run's compute, from its step rows (``steps`` = the steps averaged, after warm-up)."""

    steps: int
    loop_s: float
    step_s: float
    phases_s: dict
    tokens_per_s: float
    device_hours: float
    peak_memory_gb: float | None


def step_phases(row: Mapping[str, float]) -> dict:
    """``{phase: seconds}`` of one step's metrics (keys missing in ``row`` count 0; the phases: docs/cost.md)."""
    step = float(row["timing_s/step"])
    teacher_inside = float(row.get("timing_s/teacher", 0.0))
    gen = float(row.get("timing_s/gen", 0.0))
    teacher = teacher_inside + float(row.get("timing_s/ref", 0.0))
    update = float(row.get("timing_s/update_actor", 0.0)) - teacher_inside
    return {"generation": gen, "teacher": teacher, "update": update, "other": step - gen - teacher - update}


def run_cost(*, rows: Sequence[Mapping[str, float]], n_devices: int, warmup_steps: int = 1,
             measured_peak_gb: float | None = None) -> RunCost:
    """Per-step means over the steps after ``warmup_steps`` (all steps if no more are left);
    ``loop_s`` / ``device_hours``: every step (the paper's training-loop time)."""
    rows = sorted((r for r in rows if "timing_s/step" in r), key=lambda r: r["step"])
    if not rows:
        raise ValueError("no step with timing_s/step in the metrics (is trainer.logger 'file' on?)")
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    kept = rows[warmup_steps:] or rows
    phases = [step_phases(row) for row in kept]
    step_s = sum(r["timing_s/step"] for r in kept) / len(kept)
    tokens = sum(r.get("perf/total_num_tokens", 0.0) for r in kept)
    loop_s = sum(r["timing_s/step"] for r in rows)
    logged = [r["perf/max_memory_allocated_gb"] for r in rows if r.get("perf/max_memory_allocated_gb")]
    return RunCost(
        steps=len(kept),
        loop_s=loop_s,
        step_s=step_s,
        phases_s={phase: sum(split[phase] for split in phases) / len(kept) for phase in PHASES},
        tokens_per_s=tokens / sum(r["timing_s/step"] for r in kept),
        device_hours=loop_s * n_devices / 3600.0,
        peak_memory_gb=max(logged) if logged else measured_peak_gb,
    )


def _ratio(opsd_value: float | None, grpo_value: float | None) -> str:
    if opsd_value is None or grpo_value is None or grpo_value == 0:
        return "n/a"
    return f"{opsd_value / grpo_value:.3f}"


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def cost_table(*, opsd: RunCost, grpo: RunCost, memory_label: str, same_data: str | None = None,
               grpo_aggregation: str | None = None) -> str:
    """Markdown table: OPSD, GRPO, OPSD/GRPO per row, then the paper's GPU hours and settings.
    ``same_data``: the ``check_same_data`` line; ``grpo_aggregation``: ``loss_aggregation`` of the GRPO run."""
    rows = [
        ("training loop, all steps (s)", opsd.loop_s, grpo.loop_s, ".1f"),
        ("device hours (loop x devices)", opsd.device_hours, grpo.device_hours, ".5f"),
        (f"step, mean of {opsd.steps} / {grpo.steps} steps (s)", opsd.step_s, grpo.step_s, ".3f"),
        *((f"  {p} (s)", opsd.phases_s[p], grpo.phases_s[p], ".3f") for p in PHASES),
        ("tokens per second", opsd.tokens_per_s, grpo.tokens_per_s, ".1f"),
        (f"peak memory (GB): {memory_label}", opsd.peak_memory_gb, grpo.peak_memory_gb, ".2f"),
    ]
    lines = ["| | OPSD | GRPO | OPSD / GRPO |", "|---|---|---|---|"]
    lines += [f"| {name} | {_num(opsd_value, fmt)} | {_num(grpo_value, fmt)} | {_ratio(opsd_value, grpo_value)} |"
              for name, opsd_value, grpo_value, fmt in rows]
    lines += ["", f"Data: {same_data or 'not checked'}", f"GRPO loss aggregation: {grpo_aggregation or 'not recorded'}"]
    lines += ["", "Paper (tab:opsd_grpo_compute, GPU hours of 50 steps):", "",
              "| model | OPSD | GRPO | OPSD / GRPO |", "|---|---|---|---|"]
    lines += [f"| {model} | {opsd_hours} | {grpo_hours} | {opsd_hours / grpo_hours:.4f} |"
              for model, (opsd_hours, grpo_hours) in PAPER_GPU_HOURS.items()]
    lines += ["", "| paper setting | OPSD | GRPO |", "|---|---|---|"]
    lines += [f"| {name} | {opsd_setting} | {grpo_setting} |" for name, opsd_setting, grpo_setting in PAPER_SETTINGS]
    return "\n".join(lines)
