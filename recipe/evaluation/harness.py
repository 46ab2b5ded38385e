"""Evaluation of a model or checkpoint on the paper's benchmarks (library behind ``scripts/evaluate.py``).

``evaluate(EvalConfig)``: checks the model input (``check_model_input``), merges an FSDP checkpoint
(``recipe.common.merge``), samples with a backend of ``recipe.evaluation.backends`` in a
``recipe.evaluation.decoding_presets`` preset, grades with ``grade(..., mode="evaluation")`` and writes
a resumable output directory. Protocol, outputs, resume and full-disk rules: docs/evaluation.md and
docs/errors_and_outputs.md. Example (CPU, tiny model)::

    python scripts/evaluate.py run --model /tmp/tiny --preset tiny_cpu --n 2 --limit 2 --out-dir /tmp/eval_tiny
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from recipe.common import cli
from recipe.common.cache import cache_root
from recipe.common.merge import is_hf_model_dir, merge_checkpoint
from recipe.evaluation import metrics as eval_metrics
from recipe.evaluation.decoding_presets import DecodingPreset
from recipe.evaluation.report import results_table
from recipe.common.grader import DEFAULT_TIMEOUT_S, EVALUATION, MAX_WORKERS, grade

EVAL_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "eval"
DEFAULT_BENCHMARKS = ("aime2024", "aime2025", "aime2026", "hmmt_feb_2025")
# merged FSDP checkpoints, under the project's cache root (OPSD_MERGE_CACHE: elsewhere)
DEFAULT_MERGE_CACHE = Path(os.environ.get("OPSD_MERGE_CACHE") or cache_root() / "merged")
CONFIG_FILE, GENERATIONS_FILE, RESULTS_FILE, TABLE_FILE = (
    "run_config.json",
    "generations.jsonl",
    "results.json",
    "results.md",
)
# Run-config fields that must match on resume (benchmarks are checked one by one).
_RESUME_FIELDS = ("model", "decoding", "n", "seed", "backend", "prompt")
PROMPT_VERSION = "eval_messages"
# Grading rule recorded in run_config.json. A directory graded by another rule (before the
# grader's modes: boxed, \fbox, `\boxed 5`, then the Answer: line; no such field) is regraded
# on resume from its stored texts (``regrade_generations``), so one table never mixes rules.
GRADING = "final_balanced_boxed"


@dataclass
class EvalConfig:
    """One evaluation run.

    Attributes:
        model: HF model directory, or an FSDP checkpoint ``.../global_step_N/actor``
            (merged first: ``recipe.common.merge``).
        out_dir: output directory (created; reused to resume).
        preset: decoding preset (mode included), already overridden as wanted.
        benchmarks: names of ``data/eval/<name>.jsonl`` or paths to JSONL files with
            ``id``, ``problem`` and ``answer``.
        n: samples per problem (Avg@n, Pass@n); Pass@1 is reported too.
        seed: sampling seed (the paper: 42).
        backend: ``vllm`` | ``sglang`` | ``hf``; None = the preset's engine.
        limit: evaluate only the first ``limit`` problems of each benchmark (smoke tests).
        grade_timeout_s: wall-clock bound of one Math-Verify comparison.
        merge_cache: where merged FSDP checkpoints are kept.
        problems_per_call: problems sent to the backend per call (the unit of resumption).
        pass_ks: extra k values for Pass@k in results.json (1 and n are always reported).
    """

    model: str
    out_dir: str
    preset: DecodingPreset
    benchmarks: Sequence[str] = DEFAULT_BENCHMARKS
    n: int = 8
    seed: int = 42
    backend: str | None = None
    limit: int | None = None
    grade_timeout_s: float = DEFAULT_TIMEOUT_S
    merge_cache: str = str(DEFAULT_MERGE_CACHE)
    problems_per_call: int = 16
    pass_ks: Sequence[int] = ()
    benchmark_paths: dict[str, Path] = field(init=False, repr=False)

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.backend is None:
            self.backend = self.preset.engine
        if self.backend not in ("vllm", "sglang", "hf"):
            raise ValueError(f"backend must be one of ('vllm', 'sglang', 'hf'), got {self.backend!r}")
        bad_ks = [k for k in self.pass_ks if not 1 <= k <= self.n]
        if bad_ks:
            raise ValueError(f"pass_ks must lie in [1, n={self.n}], got {bad_ks}")
        if self.problems_per_call < 1:
            raise ValueError(f"problems_per_call must be >= 1, got {self.problems_per_call}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be None or >= 1, got {self.limit}")
        if not self.benchmarks:
            raise ValueError("benchmarks is empty")
        self.benchmark_paths = {}
        for spec in self.benchmarks:
            path = Path(spec) if spec.endswith(".jsonl") else EVAL_DATA_DIR / f"{spec}.jsonl"
            if not path.is_file():
                known = sorted(p.stem for p in EVAL_DATA_DIR.glob("*.jsonl"))
                raise cli.MissingInputError(f"benchmark {spec!r}: no such file", file=path,
                                            hint=f"shipped benchmarks: {known}, or a path to a .jsonl file")
            if path.stem in self.benchmark_paths:
                raise ValueError(f"benchmark name {path.stem!r} given twice")
            self.benchmark_paths[path.stem] = path


def load_benchmark(path: Path, *, limit: int | None = None) -> list[dict]:
    """Rows ``{id, problem, answer}`` of a JSONL benchmark; an InputError naming file and line."""
    rows, seen = [], set()
    for lineno, row in cli.iter_jsonl(path, what="benchmark file"):
        for key in ("id", "problem", "answer"):
            if not isinstance(row.get(key), (str, int)) or str(row[key]).strip() == "":
                raise cli.InputError(f"field {key!r} is missing or empty", file=path, line=lineno,
                                     hint="every line needs id, problem and answer")
        if str(row["id"]) in seen:
            raise cli.InputError(f"duplicate id {row['id']!r}", file=path, line=lineno)
        seen.add(str(row["id"]))
        rows.append({"id": str(row["id"]), "problem": str(row["problem"]), "answer": str(row["answer"])})
    if not rows:
        raise cli.InputError("no rows", file=path)
    return rows[:limit] if limit is not None else rows


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_model_input(model: str, *, environ=os.environ) -> str:
    """Before anything is written: ``model`` is a whole FSDP checkpoint or model directory, or a Hub id
    in the local cache (offline) or on the Hub; an InputError naming it otherwise. Returns its kind."""
    from recipe.common.checkpoints import check_model_source, check_path, hub_cache_dir, hub_offline

    path = Path(model).expanduser()
    if path.is_dir():
        return check_path(path)
    return check_model_source(model, offline=hub_offline(environ), hub_cache=hub_cache_dir(environ))


def _looks_like_hub_id(model: str) -> bool:
    return model.count("/") == 1 and not model.startswith((".", "/", "~")) and all(model.split("/"))


def _model_key(model: str) -> str:
    path = Path(model).expanduser().resolve()
    return model if not path.exists() and _looks_like_hub_id(model) else str(path)


def resolve_model(model: str, *, merge_cache: str | os.PathLike) -> str:
    """What to load for ``model``: a hub id as given, an HF directory, or the merged FSDP checkpoint.

    A merged copy is written to ``<merge_cache>/<name>-<hash of the checkpoint path>`` by the one merge
    (``recipe.common.merge``: through a temporary directory, renamed when complete; its log beside it,
    ``<name>-<hash>.merge.log``); an existing complete copy is reused, never overwritten; an incomplete one
    is an error.
    """
    path = Path(model).expanduser().resolve()
    if not path.exists() and _looks_like_hub_id(model):
        return model
    if not path.is_dir():
        raise cli.MissingInputError("not a directory (nor a hub id like 'Qwen/Qwen3-1.7B')", file=model,
                                    hint="pass --model a model folder or a checkpoint .../global_step_N/actor")
    if is_hf_model_dir(path):
        return str(path)
    if not list(path.glob("model_world_size_*_rank_*.pt")):
        raise cli.InputError(
            "neither a Hugging Face model directory (config.json + weights) nor an FSDP checkpoint directory "
            "(model_world_size_*_rank_*.pt)", file=model, hint="pass a model folder or .../global_step_N/actor")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = "_".join(part for part in path.parts[-3:] if part not in ("/", ""))
    target = Path(merge_cache).expanduser() / f"{name}-{digest}"
    if target.exists():
        if is_hf_model_dir(target):
            return str(target)
        raise cli.InputError("exists but holds no complete merged model", file=target, hint="remove it to merge again")
    target.parent.mkdir(parents=True, exist_ok=True)
    merge_checkpoint(path, target, log=target.with_name(f"{target.name}.merge.log"),
                     what=f"the merged checkpoint {target.name}",
                     retry_hint="free space there or pass another --merge-cache, then run the same command again")
    return str(target)


def run_config(config: EvalConfig) -> dict:
    """The JSON-able record of what a run generates (checked on resume, kept in the results)."""
    return {
        "model": _model_key(config.model),
        "decoding": dataclasses.asdict(config.preset),
        "n": config.n,
        "seed": config.seed,
        "backend": config.backend,
        "prompt": PROMPT_VERSION,
        "grading": GRADING,
        "benchmarks": {
            name: {"path": str(path), "sha256": _sha256(path)} for name, path in config.benchmark_paths.items()
        },
    }


def check_resume_config(saved: dict, current: dict, *, where: Path) -> None:
    """Raise ValueError naming the first field where ``current`` differs from the saved run."""
    for key in _RESUME_FIELDS:
        old, new = saved.get(key), current.get(key)
        if key == "decoding" and isinstance(old, dict) and "mode" in old and old["mode"] is None:
            old = {**old, "mode": "native"}  # a run written before the native mode had a name
        if isinstance(old, dict) and isinstance(new, dict):
            for sub in sorted(set(old) | set(new)):
                if old.get(sub) != new.get(sub):
                    raise cli.InputError(
                        f"resume mismatch in field '{key}.{sub}': saved {old.get(sub)!r}, now {new.get(sub)!r}",
                        file=where, hint="use another --out-dir or the saved settings")
        elif old != new:
            raise cli.InputError(f"resume mismatch in field '{key}': saved {old!r}, now {new!r}", file=where,
                                 hint="use another --out-dir or the saved settings")
    for name, info in current["benchmarks"].items():
        old = saved.get("benchmarks", {}).get(name)
        if old is not None and old["sha256"] != info["sha256"]:
            raise cli.InputError(
                f"resume mismatch in field 'benchmarks.{name}.sha256': the benchmark file changed "
                f"({old['path']} -> {info['path']})", file=where, hint="use another --out-dir")


def load_generations(path: Path) -> list[dict]:
    """Records of a generations JSONL. A torn last line (killed mid-write) is cut off; any other bad line raises."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records, keys = [], set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):  # last line without newline: interrupted write
                with open(path, "r+b") as handle:
                    handle.truncate(len(raw) - len(line))
                print(f"{path}: dropped an incomplete last line (interrupted write)", file=sys.stderr)
                break
            raise cli.InputError("invalid JSON line", file=path, line=lineno,
                                 hint="delete the line (that sample is generated again) or use another --out-dir") from None
        key = (record["dataset"], record["problem_id"], record["sample"])
        if key not in keys:
            keys.add(key)
            records.append(record)
    return records


def regrade_generations(path: Path, *, old_rule: str, timeout_s: float) -> None:
    """Regrade every stored generation with the current evaluation rule (``GRADING``).

    The texts are kept; ``pred``, ``acc`` and ``has_boxed`` are recomputed. The previous file is
    kept as ``<path>.graded-<old_rule>`` (refusing to overwrite one) and the new one replaces
    ``path`` atomically.
    """
    records = load_generations(path)
    if not records:
        return
    backup = path.with_name(f"{path.name}.graded-{old_rule}")
    if backup.exists():
        raise cli.OutputExistsError(f"cannot regrade {path.name}: the backup exists", file=backup,
                                    hint="move it away first")
    with ThreadPoolExecutor(MAX_WORKERS) as pool:
        results = list(pool.map(lambda r: grade(r["text"], r["answer"], mode=EVALUATION, timeout_s=timeout_s),
                                records))
    partial = path.with_name(path.name + ".regrading")
    with open(partial, "w", encoding="utf-8") as sink:
        for record, result in zip(records, results, strict=True):
            record.update(pred=result.pred, acc=result.acc, has_boxed=result.has_boxed)
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    shutil.copy2(path, backup)
    os.replace(partial, path)
    print(f"{path}: regraded {len(records)} stored generations with the evaluation rule {GRADING!r} "
          f"(was {old_rule!r}); the previous file is {backup}", file=sys.stderr)


def _prompt_messages(problem: str, preset: DecodingPreset) -> list[dict]:
    from recipe.common.prompts import eval_messages

    system = [] if preset.system_message is None else [{"role": "system", "content": preset.system_message}]
    return system + eval_messages(problem)


def compute_results(
    records: Sequence[dict], config: dict, benchmarks: Sequence[str], *, pass_ks: Sequence[int] = ()
) -> dict:
    """Per-dataset and macro metrics of the generation records, with the run config.

    Pass@k is reported for k in {1, n} and ``pass_ks``.
    """
    n = config["n"]
    ks = sorted({1, n, *pass_ks})
    per_dataset, per_problem = {}, {}
    for name in benchmarks:
        rows = [r for r in records if r["dataset"] == name]
        if rows:
            per_dataset[name] = eval_metrics.dataset_metrics(rows, ks=ks)
            per_problem[name] = eval_metrics.problem_scores(rows)
    if not per_dataset:
        raise ValueError("no generations to summarise")
    return {
        "n": n,
        "rep_ngram_order": eval_metrics.REPEAT_NGRAM,
        "config": config,
        "per_dataset": per_dataset,
        "macro": eval_metrics.macro_average(per_dataset),
        # Avg@n of every problem, for the paired bootstrap of `compare` (recipe.evaluation.stats)
        "per_problem": per_problem,
    }


def write_results(out_dir: Path, results: dict) -> None:
    """Write ``results.json`` and ``results.md`` (derived files, rewritten on every run)."""
    (out_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / TABLE_FILE).write_text(results_table(results))


def evaluate(config: EvalConfig, *, backend=None, progress: bool = True) -> dict:
    """Run (or resume) an evaluation and return the results dict.

    Writes to ``config.out_dir``: ``run_config.json`` (model, decoding, mode, n, seed, backend, benchmark
    hashes), ``generations.jsonl`` (one line per (problem, sample): ids, text, token count, finish reason,
    pred, acc, has_boxed; appended as problems finish), ``results.json`` / ``results.md`` (per-dataset and
    macro metrics; ``per_problem`` holds each problem's Avg@n, the unit of the paired bootstrap).
    ``backend`` (an object with ``tokenizer`` and ``generate(list[PromptRequest])``) can be
    passed in; by default it is built from ``config.backend`` on the resolved model.
    """
    datasets = {name: load_benchmark(path, limit=config.limit) for name, path in config.benchmark_paths.items()}
    if backend is None:
        check_model_input(config.model)
    out_dir = Path(config.out_dir)
    left = {"generations": sum(len(rows) for rows in datasets.values()) * config.n, "bytes_each": 2048}
    with cli.on_full_disk(out_dir, what="the rest of the evaluation outputs",
                          needed=lambda: left["generations"] * left["bytes_each"],
                          hint="the generations written so far are kept: free space there and run the same "
                               "command again (it resumes)"):
        return _evaluate(config, datasets, out_dir, backend=backend, progress=progress, left=left)


def _evaluate(config: EvalConfig, datasets: dict, out_dir: Path, *, backend, progress: bool, left: dict) -> dict:
    from tqdm.auto import tqdm

    from recipe.common.chat import render_ids
    from recipe.evaluation.backends import PromptRequest, make_backend

    out_dir.mkdir(parents=True, exist_ok=True)
    current = run_config(config)
    config_path, generations_path = out_dir / CONFIG_FILE, out_dir / GENERATIONS_FILE
    if config_path.exists():
        saved = cli.read_json(config_path, what="run config")
        check_resume_config(saved, current, where=config_path)
        current["benchmarks"] = {**saved.get("benchmarks", {}), **current["benchmarks"]}
        if saved.get("grading") != GRADING:  # before the new config is written: a kill here regrades again
            regrade_generations(generations_path, old_rule=saved.get("grading", "before_grader_modes"),
                                timeout_s=config.grade_timeout_s)
    elif generations_path.exists():
        raise cli.InputError(f"exists without {config_path.name}; refusing to append to it", file=generations_path,
                             hint="use another --out-dir")
    config_path.write_text(json.dumps(current, indent=2) + "\n")

    records = load_generations(generations_path)
    done = {(r["dataset"], r["problem_id"], r["sample"]) for r in records}
    pending = [
        (name, row, [s for s in range(config.n) if (name, row["id"], s) not in done])
        for name, rows in datasets.items()
        for row in rows
    ]
    pending = [item for item in pending if item[2]]
    left["generations"] = sum(len(samples) for *_, samples in pending)  # what a full disk reports as still needed
    if records:
        left["bytes_each"] = max(1, round(generations_path.stat().st_size / len(records)))
    if pending:
        if backend is None:
            model_path = resolve_model(config.model, merge_cache=config.merge_cache)
            backend = make_backend(config.backend, model_path, preset=config.preset, seed=config.seed)
        bar = tqdm(total=sum(len(samples) for *_, samples in pending), desc="generations", disable=not progress)
        with open(generations_path, "a", encoding="utf-8") as sink, ThreadPoolExecutor(MAX_WORKERS) as pool:
            for start in range(0, len(pending), config.problems_per_call):
                chunk = pending[start : start + config.problems_per_call]
                requests = [
                    PromptRequest(
                        key=f"{name}/{row['id']}/{samples[0]}",
                        prompt_ids=render_ids(_prompt_messages(row["problem"], config.preset), backend.tokenizer,
                                              config.preset.mode),
                        count=len(samples),
                    )
                    for name, row, samples in chunk
                ]
                outputs = backend.generate(requests)
                for (name, row, samples), request, generations in zip(chunk, requests, outputs, strict=True):
                    grades = pool.map(lambda g: grade(g.text, row["answer"], mode=EVALUATION,
                                                        timeout_s=config.grade_timeout_s),
                                      generations)
                    for sample, generation, result in zip(samples, generations, list(grades), strict=True):
                        record = {
                            "dataset": name, "problem_id": row["id"], "sample": sample, "answer": row["answer"],
                            "prompt_tokens": len(request.prompt_ids), "text": generation.text,
                            "num_tokens": generation.num_tokens, "finish_reason": generation.finish_reason,
                            "pred": result.pred, "acc": result.acc, "has_boxed": result.has_boxed,
                        }
                        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                        records.append(record)
                    sink.flush()
                    left["generations"] -= len(samples)
                    bar.update(len(samples))
        bar.close()
    wanted = {(name, row["id"]) for name, rows in datasets.items() for row in rows}
    selected = [r for r in records if (r["dataset"], r["problem_id"]) in wanted and r["sample"] < config.n]
    results = compute_results(selected, current, list(datasets), pass_ks=config.pass_ks)
    write_results(out_dir, results)
    return results
