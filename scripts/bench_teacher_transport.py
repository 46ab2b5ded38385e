"""Benchmark: bytes through the driver and time per step, teacher hidden states via the driver
(``--before`` revision) vs the teacher forward next to the actor's update (``--after`` revisions,
default this checkout), and whether step 1 computes the same loss in both.

    /work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf --after 0523b7a \\
        --response-length 1024 --steps 3                                  # tiny random Qwen3
    /work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf --after 0523b7a \\
        --model "$(python -m recipe.models.smollm2 --quiet)" --native-mode --response-length 256 --steps 3

Every checkout runs its own ``recipe/opsd/run_opsd.sh`` on the CPU (1 rank) with the same model,
data, seed and overrides, one after the other. Every response is forced to the full length (the model
copy's ``generation_config.json`` gets an end-of-sequence id outside the vocabulary, so the
sampler never stops early): all runs move the same [B, R, H]. ``driver_bytes_probe`` (loaded into
every verl process) records the tensor bytes of every worker-group call of the trainer; the table
sums the teacher and update calls per step, in each direction. Times are means over steps 2..
(step 1 warms up the rollout server).

Exactness: step 1 of every run starts from the same weights, data and seed, so its loss and
gradient norm must agree whichever process ran the teacher. The script compares the step-1 token
mean of the loss (``opsd/loss_token_mean``; revisions before it was added: ``opsd/loss``, the same
quantity), ``actor/grad_norm`` and every other ``opsd/*`` metric both revisions log, and prints the
largest relative difference against ``--rtol``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipe.common import cli  # noqa: E402

TEACHER_METHODS = ("compute_teacher_hidden", "update_actor")
TIMES = ("timing_s/step", "timing_s/gen", "timing_s/teacher", "timing_s/update_actor")
# the step-1 metrics compared besides the loss and every shared opsd/* metric
EXACT_KEYS = ("actor/grad_norm", "response_length/mean")
# compared as the loss row (``loss_key``): ``opsd/loss`` changed meaning in 53ad249
LOSS_KEYS = ("opsd/loss", "opsd/loss_token_mean")


# ----------------------------------------------------------------------------- pure helpers
def steps_from_jsonl(lines) -> dict[int, dict]:
    """verl's file-logger lines (``{"step": s, "data": {...}}``) as ``{step: metrics}``."""
    steps: dict[int, dict] = {}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def bytes_per_step(calls: list[dict], *, methods=TEACHER_METHODS) -> dict[str, float]:
    """Bytes of the teacher and update calls per update step, each direction and per method.

    ``calls``: the probe's records (``method``, ``to_workers``, ``from_workers``: null for a
    non-blocking call, counted as 0). Steps are counted by the ``update_actor`` calls.
    """
    updates = sum(c["method"].endswith("update_actor") for c in calls)
    if updates == 0:
        raise ValueError("no update_actor call in the probe's log: did the run reach its first update?")
    per_method: dict[str, list[float]] = {}
    for call in calls:
        name = next((m for m in methods if call["method"].endswith(m)), None)
        if name is not None:
            sent = per_method.setdefault(name, [0.0, 0.0])
            sent[0] += call["to_workers"]
            sent[1] += call["from_workers"] or 0
    result = {"to": sum(v[0] for v in per_method.values()) / updates,
              "from": sum(v[1] for v in per_method.values()) / updates}
    for name, (to, back) in per_method.items():
        result[f"{name}/to"] = to / updates
        result[f"{name}/from"] = back / updates
    return result


def mean_times(steps: dict[int, dict], *, keys=TIMES) -> dict[str, float]:
    """Mean of each timing over steps 2.. (step 1 alone if the run had one step); absent: 0."""
    later = [steps[s] for s in sorted(steps) if s > min(steps)] or [steps[min(steps)]]
    return {key: statistics.mean(m.get(key, 0.0) for m in later) for key in keys}


def loss_key(metrics: dict) -> str:
    """The token mean of the per-position loss: ``opsd/loss_token_mean``, or, in revisions before
    ``opsd.loss.loss_agg_mode`` (53ad249), ``opsd/loss`` (then defined as that token mean)."""
    return "opsd/loss_token_mean" if "opsd/loss_token_mean" in metrics else "opsd/loss"


def relative_difference(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|) (0 when both are 0; inf when only one is not finite)."""
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def step_one_agreement(before: dict, after: dict) -> list[tuple[str, float, float, float]]:
    """``(name, before, after, relative difference)`` for the step-1 metrics of two runs: the loss's
    token mean first, then ``EXACT_KEYS`` and every other ``opsd/*`` metric both logged."""
    rows = [("loss (token mean)", float(before[loss_key(before)]), float(after[loss_key(after)]))]
    shared = [k for k in EXACT_KEYS if k in before and k in after]
    shared += sorted(k for k in before.keys() & after.keys()
                     if k.startswith("opsd/") and k not in LOSS_KEYS)
    rows += [(k, float(before[k]), float(after[k])) for k in shared]
    return [(name, b, a, relative_difference(b, a)) for name, b, a in rows]


def ratio(after: float, before: float) -> float:
    return after / before if before else math.nan


# ----------------------------------------------------------------------------- the runs
def _prepare_model(model: str | None, out: Path) -> Path:
    """A copy of the model (symlinks) whose generation config never ends a sequence early."""
    if model is None:
        from recipe.models.tiny import build_tiny_model

        source = build_tiny_model(out / "tiny_source", seed=0, overwrite=True)
    else:
        source = Path(model)
    target = out / "model_no_eos"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "generation_config.json":
            (target / item.name).symlink_to(item.resolve())
    config = json.loads((source / "config.json").read_text())
    generation_file = source / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    generation["eos_token_id"] = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    (target / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return target


def _prepare_data(out: Path) -> tuple[Path, Path]:
    from recipe.toy.demo import write_tiny_data

    files = write_tiny_data(out / "data")  # 64 train / 16 held-out toy problems
    return files["train"], files["val"]


def _check_revision(flag: str, rev: str) -> None:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True)
    if proc.returncode != 0:
        raise cli.InputError(f"not a commit of {REPO}", file=f"{flag} {rev}", hint="see git log --oneline")


def _checkout(rev: str, out: Path) -> Path:
    target = out / f"src_{rev}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def _run(label: str, src: Path, model: Path, data: tuple[Path, Path], out: Path, args) -> dict:
    run_dir = out / label
    shutil.rmtree(run_dir, ignore_errors=True)  # verl's file logger appends; a rerun starts clean
    run_dir.mkdir(parents=True)
    bytes_log = run_dir / "driver_bytes.jsonl"
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
        "trainer.save_freq=-1", "trainer.val_before_train=false", "trainer.test_freq=-1",
    ]
    if args.native_mode:
        overrides += ["opsd.student_mode=native", "opsd.teacher_mode=native"]
    overrides += args.override
    print(f"[bench] {label}: {src} ...", file=sys.stderr, flush=True)
    with open(run_dir / "run.log", "w") as log:
        proc = subprocess.run(["bash", str(src / "recipe/opsd/run_opsd.sh"), *overrides], cwd=src, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{label}: run_opsd.sh exited {proc.returncode}; see {run_dir / 'run.log'}")
    steps = steps_from_jsonl((run_dir / "metrics.jsonl").read_text().splitlines())
    calls = [json.loads(line) for line in bytes_log.read_text().splitlines()]
    return {**mean_times(steps), **bytes_per_step(calls), "steps": steps,
            "response_length": statistics.mean(m["response_length/mean"] for m in steps.values())}


def _table(results: dict[str, dict]) -> list[str]:
    labels = list(results)
    columns = ["to", "from", *TIMES]
    lines = ["| | driver -> workers bytes / step | workers -> driver | timing_s/step | gen | teacher | "
             "update_actor | teacher + update |", "|---|---|---|---|---|---|---|---|"]

    def values(label):
        r = results[label]
        # before: the teacher ran in its own call; after: inside update_actor (timing_s/teacher is a part of it)
        both = r["timing_s/update_actor"] + (r["timing_s/teacher"] if label == labels[0] else 0.0)
        return [r[c] for c in columns] + [both]

    for label in labels:
        v = values(label)
        lines.append(f"| {label} | {v[0]:,.0f} | {v[1]:,.0f} | " + " | ".join(f"{x:.3f}" for x in v[2:]) + " |")
    for label in labels[1:]:
        ratios = [ratio(a, b) for a, b in zip(values(label), values(labels[0]))]
        lines.append(f"| {label} / {labels[0]} | " + " | ".join(f"{x:.4g}" for x in ratios) + " |")
    lines += ["", "bytes per step by call (to / from workers):", ""]
    methods = sorted({k.rsplit("/", 1)[0] for r in results.values() for k in r if k.endswith("/to")})
    lines += ["| | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for label in labels:
        r = results[label]
        cells = [f"{r[m + '/to']:,.0f} / {r[m + '/from']:,.0f}" if m + "/to" in r else "-" for m in methods]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _exactness(results: dict[str, dict], rtol: float) -> list[str]:
    labels = list(results)
    first = results[labels[0]]["steps"]
    lines = []
    for label in labels[1:]:
        rows = step_one_agreement(first[min(first)], results[label]["steps"][min(results[label]["steps"])])
        worst = max(rows, key=lambda row: row[3])
        verdict = "match" if worst[3] <= rtol else "DIFFER"
        lines += ["", f"step 1, {labels[0]} vs {label}: {verdict} (largest relative difference {worst[3]:.2e} "
                  f"in {worst[0]}; rtol {rtol:g}, {len(rows)} metrics)", "",
                  f"| step-1 metric | {labels[0]} | {label} | relative difference |", "|---|---|---|---|"]
        lines += [f"| {name} | {b:.9g} | {a:.9g} | {d:.2e} |" for name, b, a, d in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision with the teacher hidden states via the driver")
    parser.add_argument("--after", action="append", default=None,
                        help="git revision to compare with (repeatable; default: this checkout)")
    parser.add_argument("--model", default=None, help="HF model directory (default: the tiny random Qwen3)")
    parser.add_argument("--native-mode", action="store_true", help="opsd.student_mode/teacher_mode=null (SmolLM2)")
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a hydra override for every run (repeatable), e.g. actor_rollout_ref.rollout.temperature=0 "
                             "(greedy: the rollout server's batching then cannot change the responses)")
    parser.add_argument("--rtol", type=float, default=1e-5, help="step-1 agreement tolerance (relative)")
    parser.add_argument("--out-dir", default=None, help="keep the runs here (default: a temporary directory)")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    for name in ("response_length", "batch_size", "steps"):
        if getattr(args, name) < 1:
            raise cli.InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    _check_revision("--before", args.before)
    for rev in args.after or []:
        _check_revision("--after", rev)
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        raise cli.InputError("not an HF model directory (no config.json)", file=f"--model {args.model}")

    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="bench_transport_"))
    out.mkdir(parents=True, exist_ok=True)
    model = _prepare_model(args.model, out)
    data = _prepare_data(out)
    results = {f"before {args.before}": _run("before", _checkout(args.before, out), model, data, out, args)}
    for i, rev in enumerate(args.after or [None]):
        src = _checkout(rev, out) if rev else REPO
        results[f"after {rev or 'this checkout'}"] = _run(f"after{i}", src, model, data, out, args)
    hidden = json.loads((model / "config.json").read_text()).get("hidden_size")
    lengths = ", ".join(f"{r['response_length']:.0f}" for r in results.values())
    lines = [f"model {args.model or 'tiny random Qwen3'} (H = {hidden}), batch {args.batch_size}, responses "
             f"{args.response_length} tokens (mean measured per run: {lengths}), {args.steps} steps, 1 CPU rank; "
             "times: mean of steps 2..", "", *_table(results), *_exactness(results, args.rtol)]
    print("\n".join(lines))
    if args.out_dir:
        (out / "table.md").write_text("\n".join(lines) + "\n")
        print(f"\nruns kept in {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
