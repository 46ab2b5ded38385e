"""OPSD vs GRPO compute: one run of each on the same model and data, side by side.

CLI: ``python scripts/compare_opsd_grpo.py`` (the toy-world accuracy comparison is
``python scripts/toy_studies.py compare``)::

    python scripts/compare_opsd_grpo.py --steps 4                                  # tiny model, CPU
    python scripts/compare_opsd_grpo.py --model DIR --train-files a.parquet --val-files b.parquet
    python scripts/compare_opsd_grpo.py --opsd-run CKPT_DIR --grpo-run CKPT_DIR    # existing runs

Launches ``recipe/opsd/run_opsd.sh`` and then ``recipe/grpo_baseline/run_grpo.sh`` (each with its own
recipe defaults and the CPU demo's run size on a CPU: the paper's asymmetry of samples per prompt and
response caps is kept), then reads each run's ``metrics.jsonl`` / ``run_times.jsonl`` under its
CKPT_DIR. Both recipes run on verl's legacy RayPPOTrainer (``trainer.use_v1=false``). The table's
arithmetic: ``recipe.analysis.compute_cost``.

Weight push: the line above the table says how each run pushed the trainer's weights to its rollout
(from its launch config: the rollout engine and ``recipe.rollout.extension``, the guarded vLLM push
every OPSD and GRPO launch uses); a comparison of runs with different paths says so.

Peak memory: verl's ``perf/max_memory_allocated_gb`` when it is logged (accelerators). On the CPU that
is 0, so for runs it launches the script samples the run's process tree every second (psutil) and
reports the largest resident set of one process (the FSDP worker that holds actor, teacher/reference
and optimizer: the analogue of one GPU's memory); with ``--opsd-run/--grpo-run`` on CPU runs: n/a.
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
from recipe.launch.config import REPO_ROOT as REPO
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
        proc = subprocess.Popen(["bash", SCRIPTS[recipe], *overrides], cwd=REPO, env=env, stdout=handle,
                                stderr=subprocess.STDOUT)
        sampler = TreePeak(proc.pid)
        sampler.start()
        code = proc.wait()
        sampler.stop()
    if code != 0:
        raise SystemExit(f"{recipe}: {SCRIPTS[recipe]} exited {code}; see {log}")  # a failed run, not an input error
    (ckpt / PEAK_FILE).write_text(json.dumps({"largest_process_rss_gb": sampler.peak_bytes / 2**30,
                                              "process": sampler.peak_name}) + "\n")
    return ckpt, sampler.peak_bytes / 2**30 or None


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
    """RunCost of a run directory (its newest launch in run_times.jsonl) and its launch wall time."""
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
    mean_len = [r["response_length/mean"] for r in rows if "response_length/mean" in r]
    tokens = [r["perf/total_num_tokens"] for r in rows if "perf/total_num_tokens" in r]
    return cost, record, (sum(mean_len) / len(mean_len) if mean_len else None, tokens[-1] if tokens else None,
                          weight_push(ckpt, record))


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
    costs, settings, records = {}, {}, {}
    for recipe, (ckpt, peak) in runs.items():
        costs[recipe], record, settings[recipe] = read_run(Path(ckpt), peak, args.warmup)
        records[recipe] = record
        print(f"{recipe}: {ckpt}, launch wall {record['wall_time_s']} s on {record['device']} x "
              f"{record['n_devices']}, mean response {settings[recipe][0]} tokens, "
              f"{settings[recipe][1]} tokens in the last step")
    try:  # the pair trained on the same rows in the same order (each launch's data_order.json), else one line
        same_data = check_same_data(opsd=read_data_order(runs["opsd"][0]), grpo=read_data_order(runs["grpo"][0]))
    except DataMismatch as err:
        raise cli.InputError(str(err)) from None
    if any(c.peak_memory_gb is not None and runs[r][1] is None for r, c in costs.items()):
        label = "perf/max_memory_allocated_gb"
    elif any(peak is not None for _, peak in runs.values()):
        label = "largest process RSS (CPU, sampled 1/s)"
    else:
        label = "not logged (verl logs 0 on the CPU; runs launched by this script sample the RSS)"
    pushes = {recipe: settings[recipe][2] for recipe in runs}
    same = "the same path" if len(set(pushes.values())) == 1 else "DIFFERENT paths: the step times are not comparable"
    print(f"weight push: opsd {pushes['opsd']}; grpo {pushes['grpo']} ({same})")
    print()
    print(cost_table(opsd=costs["opsd"], grpo=costs["grpo"], memory_label=label, same_data=same_data,
                     grpo_aggregation=loss_aggregation(read_launch_config(records["grpo"]))))
    return 0
