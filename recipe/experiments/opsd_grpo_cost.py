"""OPSD vs GRPO compute: one run of each on the same model and data, side by side (docs/cost.md).

Behind ``scripts/compare_opsd_grpo.py``: launches ``recipe/opsd/run_opsd.sh``, then ``recipe/grpo_baseline/run_grpo.sh``
(each with its own recipe defaults; on a CPU the tiny demo's run size), or takes two run directories; reads each
run's ``run_times.jsonl``, ``metrics.jsonl`` and launch config and prints the table (``recipe.analysis.compute_cost``).
Peak memory on the CPU, where verl logs none: the largest process RSS of a run this script launches (``TreePeak``).

    python scripts/compare_opsd_grpo.py --steps 4                                  # tiny model, CPU
    python scripts/compare_opsd_grpo.py --model DIR --train-files a.parquet --val-files b.parquet
    python scripts/compare_opsd_grpo.py --opsd-run CKPT_DIR --grpo-run CKPT_DIR    # existing runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from recipe.analysis.compute_cost import (DataMismatch, check_same_data, cost_table, loss_aggregation, read_data_order,
                                          read_launch_config, run_cost)
from recipe.analysis.run_logs import read_jsonl_metrics
from recipe.common import cli
from recipe.launch.config import REPO_ROOT
from recipe.launch.verl_env import weight_push_path

SCRIPTS = {"opsd": "recipe/opsd/run_opsd.sh", "grpo": "recipe/grpo_baseline/run_grpo.sh"}
# the sampled peak of a run this script launched, kept in its CKPT_DIR (read again by --opsd-run / --grpo-run)
PEAK_FILE = "compare_peak_rss.json"


class TreePeak(threading.Thread):
    """Largest RSS of any one process in ``pid``'s process tree, sampled every ``interval`` s."""

    def __init__(self, pid: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak_bytes, self.peak_name = pid, interval, 0, ""
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                    if rss > self.peak_bytes:
                        self.peak_bytes, self.peak_name = rss, " ".join(proc.cmdline()[:1]) or proc.name()
                except psutil.Error:
                    continue
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


def launch(recipe: str, out: Path, args) -> tuple[Path, float | None]:
    """Run one recipe on the CPU or GPU through its run script; returns (CKPT_DIR, peak RSS GB)."""
    ckpt = out / recipe
    ckpt.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CKPT_DIR=str(ckpt), STEPS=str(args.steps), PYTHON=sys.executable)
    # on a CPU without --model / --train-files: the tiny demo (its random tiny Qwen3 and 64 toy problems), not
    # the toy demo (student build, 150 steps, evaluation) that the launcher picks without MODEL_PATH
    env.setdefault("CPU_DEMO", "tiny")
    for key, value in (("MODEL_PATH", args.model), ("TRAIN_FILES", args.train_files), ("VAL_FILES", args.val_files)):
        if value:
            env[key] = str(value)
    overrides = ["trainer.save_freq=-1", "trainer.val_before_train=false", *args.override]
    log = ckpt / "compare.log"
    print(f"[compare] {recipe}: bash {SCRIPTS[recipe]} {' '.join(overrides)}  (log: {log})", flush=True)
    with open(log, "w") as handle:
        proc = subprocess.Popen(["bash", SCRIPTS[recipe], *overrides], cwd=REPO_ROOT, env=env, stdout=handle,
                                stderr=subprocess.STDOUT)
        rss_sampler = TreePeak(proc.pid)
        rss_sampler.start()
        exit_code = proc.wait()
        rss_sampler.stop()
    if exit_code != 0:  # a failed run, not an input error
        raise SystemExit(f"{recipe}: {SCRIPTS[recipe]} exited {exit_code}; see {log}")
    (ckpt / PEAK_FILE).write_text(json.dumps({"largest_process_rss_gb": rss_sampler.peak_bytes / 2**30,
                                              "process": rss_sampler.peak_name}) + "\n")
    return ckpt, rss_sampler.peak_bytes / 2**30 or None


def launch_config(ckpt: Path, record: dict):
    """The final config of the run's launch (``record["config"]``, else the newest ``launch_config*.yaml``), or None."""
    from omegaconf import OmegaConf

    path = Path(record["config"]) if record.get("config") else None
    if path is None or not path.is_file():
        found = sorted(ckpt.glob("launch_config*.yaml"), key=lambda p: p.stat().st_mtime)
        path = found[-1] if found else None
    return OmegaConf.load(path) if path is not None else None


def weight_push(ckpt: Path, record: dict) -> str:
    """How the run pushed the trainer's weights to its rollout (``recipe.launch.verl_env.weight_push_path``)."""
    from omegaconf import OmegaConf

    config = launch_config(ckpt, record)
    if config is None:
        return f"unknown (no launch_config.yaml in {ckpt})"
    return weight_push_path(OmegaConf.select(config, "actor_rollout_ref.rollout.name"),
                            OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"))


def read_run(ckpt: Path, measured_peak_gb: float | None, warmup: int):
    """(RunCost, launch record, (mean response length, tokens of the last step, weight-push path)) of a run
    directory (its newest launch in run_times.jsonl)."""
    times = cli.require_file(ckpt / "run_times.jsonl", what="launch record",
                             hint="a run directory (CKPT_DIR) written by a run_*.sh launch has it")
    records = [record for _, record in cli.iter_jsonl(times, what="launch record")]
    if not records:
        raise cli.InputError("empty (no launch recorded)", file=times)
    record = records[-1]
    metrics = Path(record.get("metrics") or ckpt / "metrics.jsonl")
    rows = read_jsonl_metrics(metrics)
    try:
        cost = run_cost(rows=rows, n_devices=int(record["n_devices"]), warmup_steps=warmup,
                        measured_peak_gb=measured_peak_gb)
    except ValueError as err:
        raise cli.InputError(str(err), file=metrics) from None
    mean_lengths = [row["response_length/mean"] for row in rows if "response_length/mean" in row]
    tokens = [row["perf/total_num_tokens"] for row in rows if "perf/total_num_tokens" in row]
    mean_length = sum(mean_lengths) / len(mean_lengths) if mean_lengths else None
    return cost, record, (mean_length, tokens[-1] if tokens else None, weight_push(ckpt, record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model directory (default: the CPU demo's tiny random Qwen3)")
    parser.add_argument("--train-files", help="training parquet (default: the CPU demo's toy problems)")
    parser.add_argument("--val-files", help="held-out parquet")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the per-step means")
    parser.add_argument("--override", action="append", default=[], help="hydra override for both runs (repeat)")
    parser.add_argument("--out-dir", help="where the two runs go (default: a new temporary directory)")
    parser.add_argument("--opsd-run", type=Path, help="existing OPSD CKPT_DIR (with --grpo-run: launch nothing)")
    parser.add_argument("--grpo-run", type=Path, help="existing GRPO CKPT_DIR")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    if (args.opsd_run is None) != (args.grpo_run is None):
        parser.error("--opsd-run and --grpo-run go together")

    if args.opsd_run:
        runs = {}
        for recipe, ckpt in (("opsd", args.opsd_run), ("grpo", args.grpo_run)):
            peak_file = ckpt / PEAK_FILE
            peak = json.loads(peak_file.read_text())["largest_process_rss_gb"] if peak_file.is_file() else None
            runs[recipe] = (ckpt, peak)
    else:
        out = Path(args.out_dir or tempfile.mkdtemp(prefix="compare_opsd_grpo_cost_"))
        if args.out_dir and out.exists() and any(out.iterdir()):
            raise cli.InputError("not empty (the runs would mix with what is there)", file=out, hint="give a new --out-dir")
        runs = {recipe: launch(recipe, out, args) for recipe in ("opsd", "grpo")}
    costs, run_facts, records = {}, {}, {}
    for recipe, (ckpt, peak) in runs.items():
        costs[recipe], record, run_facts[recipe] = read_run(Path(ckpt), peak, args.warmup)
        mean_response, last_step_tokens, _ = run_facts[recipe]
        records[recipe] = record
        print(f"{recipe}: {ckpt}, launch wall {record['wall_time_s']} s on {record['device']} x "
              f"{record['n_devices']}, mean response {mean_response} tokens, "
              f"{last_step_tokens} tokens in the last step")
    try:  # the pair trained on the same rows in the same order (each launch's data_order.json), else one line
        same_data = check_same_data(opsd=read_data_order(runs["opsd"][0]), grpo=read_data_order(runs["grpo"][0]))
    except DataMismatch as err:
        raise cli.InputError(str(err)) from None
    if any(cost.peak_memory_gb is not None and runs[recipe][1] is None for recipe, cost in costs.items()):
        memory_label = "perf/max_memory_allocated_gb"
    elif any(peak is not None for _, peak in runs.values()):
        memory_label = "largest process RSS (CPU, sampled 1/s)"
    else:
        memory_label = "not logged (verl logs 0 on the CPU; runs launched by this script sample the RSS)"
    pushes = {recipe: run_facts[recipe][2] for recipe in runs}
    one_path = len(set(pushes.values())) == 1
    push_note = "the same path" if one_path else "DIFFERENT paths: the step times are not comparable"
    print(f"weight push: opsd {pushes['opsd']}; grpo {pushes['grpo']} ({push_note})")
    print()
    print(cost_table(opsd=costs["opsd"], grpo=costs["grpo"], memory_label=memory_label, same_data=same_data,
                     grpo_aggregation=loss_aggregation(read_launch_config(records["grpo"]))))
    return 0
