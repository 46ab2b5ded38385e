"""Offline collapse monitor over finished (or running) OPSD / GRPO runs: ``python scripts/monitor_run.py``.

Reads each run's step metrics (``recipe.analysis.run_logs``: verl's JSONL file log or console output),
prints the paper's early / late window table (``tab:sft_grpo_opsd_train``: steps 1-10 vs 91-100) and
replays ``recipe.opsd.core.monitor.TrainingDynamicsMonitor`` over the steps, printing every warning with
its step (signatures: docs/analysis.md#collapse-monitor). Example::

    python scripts/monitor_run.py runs/qwen3_4b.jsonl runs/sft_grpo.log --name Qwen3-4B --name "SFT+GRPO"

Exit code 0, or 3 with ``--strict`` when any run raised a warning.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict
from pathlib import Path

from recipe.analysis.run_logs import read_run_metrics
from recipe.common import cli
from recipe.opsd.core.monitor import DEFAULT_METRIC_KEYS, MonitorConfig, replay, window_table


def _pair(text: str, sep: str, what: str) -> tuple[str, str]:
    left, found, right = text.partition(sep)
    if not found or not left or not right:
        raise cli.InputError(f"{what} must look like A{sep}B, got {text!r}")
    return left, right


def main(argv: list[str] | None = None) -> int:
    defaults = MonitorConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", help="run logs: verl file-logger .jsonl or console output")
    p.add_argument("--name", action="append", default=[], help="display name per log, in order (default: file stem)")
    p.add_argument("--window", action="append", default=[], metavar="START:END",
                   help="table windows, inclusive steps (default: 1:10 and 91:100)")
    p.add_argument("--roles", nargs="+", default=["entropy", "fwd_kl", "grad_norm", "loss"],
                   choices=list(DEFAULT_METRIC_KEYS), help="table columns")
    p.add_argument("--metric-key", action="append", default=[], metavar="ROLE=KEY",
                   help="metric name of a role, e.g. entropy=actor/entropy")
    p.add_argument("--early", default=f"{defaults.early_start}:{defaults.early_end}", metavar="START:END",
                   help="monitor reference window")
    p.add_argument("--recent-window", type=int, default=defaults.recent_window)
    p.add_argument("--entropy-ratio", type=float, default=defaults.entropy_ratio_threshold)
    p.add_argument("--grad-norm-ratio", type=float, default=defaults.grad_norm_ratio_threshold)
    p.add_argument("--length-ratio", type=float, default=defaults.length_ratio_threshold)
    p.add_argument("--clip-ratio-increase", type=float, default=defaults.clip_ratio_increase)
    p.add_argument("--boxed-ratio", type=float, default=defaults.boxed_rate_ratio_threshold)
    p.add_argument("--json", default=None, help="also write warnings and window means to this JSON file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    p.add_argument("--strict", action="store_true", help="exit 3 if any warning fired")
    cli.add_debug_argument(p)
    args = p.parse_args(argv)

    if args.name and len(args.name) != len(args.logs):
        raise cli.InputError(f"--name given {len(args.name)} times for {len(args.logs)} logs")
    if args.json:
        cli.refuse_overwrite([args.json], overwrite=args.overwrite, other="another --json path")
    names = args.name or [Path(log).stem for log in args.logs]
    metric_keys = dict(_pair(k, "=", "--metric-key") for k in args.metric_key)
    early_start, early_end = _steps(args.early, "--early")
    windows = [_steps(w, "--window") for w in args.window] or [(1, 10), (91, 100)]
    with cli.reraise_as_input(ValueError):  # the options' validation (MonitorConfig.__post_init__)
        config = MonitorConfig(
            early_start=early_start, early_end=early_end, recent_window=args.recent_window,
            entropy_ratio_threshold=args.entropy_ratio, grad_norm_ratio_threshold=args.grad_norm_ratio,
            length_ratio_threshold=args.length_ratio, clip_ratio_increase=args.clip_ratio_increase,
            boxed_rate_ratio_threshold=args.boxed_ratio, metric_keys=metric_keys,
        )
    # Events are printed below; keep the monitor's own logging.warning lines out of the output.
    logging.getLogger("recipe.opsd.core.monitor").setLevel(logging.ERROR)
    runs = {name: read_run_metrics(log) for name, log in zip(names, args.logs)}
    print(window_table(runs, windows=windows, roles=args.roles, metric_keys=metric_keys))
    print()
    report, any_warning = {}, False
    for name, rows in runs.items():
        monitor = replay(rows, config=config)
        last = int(rows[-1]["step"]) if rows else 0
        tracked = [role for role in DEFAULT_METRIC_KEYS if any(role in r for r in monitor.history)]
        print(f"## {name}: {len(rows)} steps (last {last}); tracked: {', '.join(tracked) or 'nothing'}")
        if not monitor.events:
            print("   no warning")
        for event in monitor.events:
            print(f"   step {event.step} [{event.signature}] {event.message}")
        any_warning |= bool(monitor.events)
        report[name] = {
            "steps": len(rows),
            "events": [asdict(event) for event in monitor.events],
            "windows": {f"{start}-{end}": monitor.window_means(start, end) for start, end in windows},
        }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 3 if args.strict and any_warning else 0


def _steps(text: str, what: str) -> tuple[int, int]:
    start, end = _pair(text, ":", what)
    if not (start.isdigit() and end.isdigit()):
        raise cli.InputError(f"{what} takes START:END integer steps, got {text!r}")
    return int(start), int(end)
