"""Benchmark: bytes through the driver and time per step, teacher hidden states via the driver
(``--before`` revision) vs the teacher forward next to the actor's update (``--after`` revision,
default this checkout).

    HEAVY_EXCLUSIVE=1 /work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf \\
        --response-length 1024 --steps 3                                  # tiny random Qwen3
    HEAVY_EXCLUSIVE=1 /work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf \\
        --model /path/to/smollm2-135m-instruct --native-mode --response-length 256 --steps 3

Both checkouts run ``recipe/opsd/run_opsd.sh`` on the CPU (1 rank) with the same model, data,
seed and overrides, one after the other. Every response is forced to the full length (the model
copy's ``generation_config.json`` gets an end-of-sequence id outside the vocabulary, so the
sampler never stops early): both runs move the same [B, R, H]. ``driver_bytes_probe`` (loaded into
every verl process) records the tensor bytes of every worker-group call of the trainer; the table
sums the teacher and update calls per step, in each direction. Times are means over steps 2.. (step 1 warms up the
rollout server). Prints one markdown table with the after / before ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEACHER_METHODS = ("compute_teacher_hidden", "update_actor")
TIMES = ("timing_s/step", "timing_s/gen", "timing_s/teacher", "timing_s/update_actor")


def _prepare_model(model: str | None, out: Path) -> Path:
    """A copy of the model (symlinks) whose generation config never ends a sequence early."""
    if model is None:
        sys.path.insert(0, str(REPO))
        from recipe.models.tiny import build_tiny_model

        source = build_tiny_model(out / "tiny_source", seed=0, overwrite=True)
    else:
        source = Path(model)
    target = out / "model_no_eos"
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name != "generation_config.json":
            (target / item.name).symlink_to(item.resolve())
    config = json.loads((source / "config.json").read_text())
    generation = json.loads((source / "generation_config.json").read_text())
    generation["eos_token_id"] = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    (target / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return target


def _prepare_data(out: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO))
    from recipe.toy.demo import write_tiny_data

    files = write_tiny_data(out / "data")  # 64 train / 16 held-out toy problems
    return files["train"], files["val"]


def _checkout(rev: str, out: Path) -> Path:
    target = out / f"src_{rev}"
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def _run(label: str, src: Path, model: Path, data: tuple[Path, Path], out: Path, args) -> dict:
    run_dir = out / label
    bytes_log = run_dir / "driver_bytes.jsonl"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # a revision before the launcher (recipe/launch) read OPSD_DEVICE / EXTRA_VERL_MODULES, which it refuses
    launcher = (src / "recipe" / "launch").is_dir()
    env.update({
        "DEVICE" if launcher else "OPSD_DEVICE": "cpu",
        "VERL_USE_EXTERNAL_MODULES" if launcher else "EXTRA_VERL_MODULES": "driver_bytes_probe",
        "MODEL_PATH": str(model), "TRAIN_FILES": str(data[0]), "VAL_FILES": str(data[1]),
        "CKPT_DIR": str(run_dir / "ckpt"), "STEPS": str(args.steps), "PYTHON": sys.executable,
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "OPSD_DRIVER_BYTES_LOG": str(bytes_log),
        "PYTHONPATH": os.pathsep.join([str(REPO / "scripts"), str(src), env.get("PYTHONPATH", "")]),
    })
    overrides = [
        f"data.max_response_length={args.response_length}", f"data.train_batch_size={args.batch_size}",
        "trainer.save_freq=-1", "trainer.val_before_train=false",
    ]
    if args.native_mode:
        overrides += ["opsd.student_mode=null", "opsd.teacher_mode=null"]
    with open(run_dir / "run.log", "w") as log:
        proc = subprocess.run(["bash", str(src / "recipe/opsd/run_opsd.sh"), *overrides], cwd=src, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{label}: run_opsd.sh exited {proc.returncode}; see {run_dir / 'run.log'}")
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    calls = [json.loads(line) for line in bytes_log.read_text().splitlines()]
    teacher_calls = [c for c in calls if c["method"].endswith(TEACHER_METHODS)]
    updates = sum(c["method"].endswith("update_actor") for c in calls)
    later = [steps[s] for s in sorted(steps) if s > 1] or [steps[min(steps)]]
    result = {t: statistics.mean(m.get(t, 0.0) for m in later) for t in TIMES}
    result["to"] = sum(c["to_workers"] for c in teacher_calls) / max(updates, 1)
    result["from"] = sum(c["from_workers"] or 0 for c in teacher_calls) / max(updates, 1)
    result["response_length"] = statistics.mean(m["response_length/mean"] for m in steps.values())
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision with the teacher hidden states via the driver")
    parser.add_argument("--after", default=None, help="git revision to compare with (default: this checkout)")
    parser.add_argument("--model", default=None, help="HF model directory (default: the tiny random Qwen3)")
    parser.add_argument("--native-mode", action="store_true", help="opsd.student_mode/teacher_mode=null (SmolLM2)")
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out-dir", default=None, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args(argv)

    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="bench_transport_"))
    out.mkdir(parents=True, exist_ok=True)
    model = _prepare_model(args.model, out)
    data = _prepare_data(out)
    results = {
        "before": _run("before", _checkout(args.before, out), model, data, out, args),
        "after": _run("after", _checkout(args.after, out) if args.after else REPO, model, data, out, args),
    }
    hidden = json.loads((model / "config.json").read_text()).get("hidden_size")
    print(f"model {args.model or 'tiny random Qwen3'} (H = {hidden}), batch {args.batch_size}, "
          f"responses {args.response_length} tokens (mean measured: "
          f"{results['after']['response_length']:.0f}), {args.steps} steps, 1 CPU rank; times: mean of steps 2..")
    print()
    print("| | driver -> workers bytes / step | workers -> driver | timing_s/step | gen | teacher | update_actor "
          "| teacher + update |")
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for label, r in results.items():
        # before: the teacher ran in its own call; after: inside update_actor (timing_s/teacher is a part of it)
        both = r["timing_s/update_actor"] + (r["timing_s/teacher"] if label == "before" else 0.0)
        rows[label] = [r["to"], r["from"], r["timing_s/step"], r["timing_s/gen"], r["timing_s/teacher"],
                       r["timing_s/update_actor"], both]
        print(f"| {label} | {r['to']:,.0f} | {r['from']:,.0f} | " + " | ".join(f"{v:.3f}" for v in rows[label][2:]) + " |")
    ratio = [a / b if b else float("nan") for a, b in zip(rows["after"], rows["before"])]
    print("| after / before | " + " | ".join(f"{v:.3f}" for v in ratio) + " |")
    print(f"\nruns kept in {out}" if args.out_dir else "")
    if not args.out_dir:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
