"""CPU demo ``real`` (``recipe.toy.cpu_demos``): OPSD / GRPO on SmolLM2-135M-Instruct, a real pretrained model.

The student is the project's SmolLM2 build (``recipe.models.smollm2``) after a short format SFT
(``RealStudent``, built once and cached): SmolLM2 itself never writes a number inside ``\\boxed{}``, so
without it neither OPSD nor GRPO has anything to learn from. The task is the toy generator's
(``recipe.toy.task``) at ``REAL_TASK``; before and after training the demo evaluates on the held-out
problems (``evaluate_real``). Presets: ``recipe/{opsd,grpo_baseline}/config/demo/real.yaml``;
docs/real_model.md. What MODEL_PATH / TRAIN_FILES give is used instead and not built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from recipe.launch.config import Settings
from recipe.launch.run import DemoInputs
from recipe.toy.cpu_demos import DemoBuild
from recipe.toy.data import heldout_jsonl_rows, sft_rows
from recipe.toy.demo import write_tiny_data
from recipe.toy.task import TaskConfig, make_records

# The OPSD / GRPO task: chosen on selection problems (recipe.experiments.real_task) so that the format-SFT student
# answers 20-60% of them greedily; its operands keep out of the format SFT's (docs/results/real_model.md).
REAL_TASK = TaskConfig(num_operands=2, digits=1, min_operand=20, max_operand=99, n_train=1024, n_heldout=256, seed=0,
                       wording="sentence")
# Bump when the real student's build changes in a way RealStudent does not capture.
REAL_STUDENT_VERSION = 1


@dataclass(frozen=True)
class RealStudent:
    """The format SFT that makes SmolLM2 the demo's student (its hash names the cache directory): verl's SFT
    trainer through the launcher, the paper's SFT-then-OPSD pipeline at demo scale.

    task: the SFT problems (student prompt -> reference solution + end of turn, verl's SFT loss on
        the answer tokens). Sums of two numbers: the answer format, not the OPSD task itself.
    steps / batch_size / lr: verl SFT run (cosine schedule, 10% warmup: the SFT yaml); one epoch of
        ``task``'s training problems by default.
    seed: the SFT run's seed.
    """

    task: TaskConfig = field(default_factory=lambda: TaskConfig(num_operands=2, digits=1, max_operand=19, n_train=112,
                                                                n_heldout=16, seed=1, wording="sentence"))
    steps: int = 14
    batch_size: int = 8
    lr: float = 1e-5
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RealStudent.{name} must be a positive integer, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"RealStudent.lr must be > 0, got {self.lr!r}")

    def digest(self) -> str:
        fields = {**dataclasses.asdict(self), "task": self.task.key(), "version": REAL_STUDENT_VERSION}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    def overrides(self) -> list[str]:
        """verl SFT overrides: rows of student prompt (~60 tokens) + solution (<= 40 tokens) in 256 tokens, and
        SmolLM2's template rendered natively (it has no reasoning-mode switch)."""
        from recipe.toy.student import cpu_sft_overrides

        return cpu_sft_overrides(batch_size=self.batch_size, max_length=256, lr=self.lr, steps=self.steps,
                                 seed=self.seed, experiment_name="real_student_sft") + [
            "data.enable_thinking_default=null"]


def real_student_dir(smollm2: str | Path, config: RealStudent, *, cache: str | Path) -> Path:
    """``<cache>/real_student/<SmolLM2 build>-<config hash>``: the SFT data, run, merged student and BUILD.json."""
    return Path(cache).expanduser() / "real_student" / f"{Path(smollm2).name}-{config.digest()}"


def build_real_student(smollm2: str | Path, config: RealStudent = RealStudent(), *, cache: str | Path,
                       log=print) -> Path:
    """SmolLM2 after ``config``'s format SFT (built once, then reused); returns the merged HF directory."""
    from recipe.toy.student import sft_and_merge

    root = real_student_dir(smollm2, config, cache=cache)
    if (root / "BUILD.json").is_file():
        return root / "student"
    root.mkdir(parents=True, exist_ok=True)
    sft_file = root / "data" / "sft.parquet"
    sft_file.parent.mkdir(exist_ok=True)
    pd.DataFrame(sft_rows(make_records(config.task)["train"], mix={"problem": 1.0})).to_parquet(sft_file)
    times = {}
    if not (root / "student" / "config.json").is_file():
        log(f"[real] the format SFT of SmolLM2, once (cached in {root}): {config.steps} steps x {config.batch_size} "
            f"solved sums of {config.task.num_operands} numbers with verl's SFT trainer on the CPU; log {root / 'sft.log'}")
        times = sft_and_merge(init=Path(smollm2), sft_file=sft_file, root=root, overrides=config.overrides(),
                              label="SmolLM2 format SFT", steps=config.steps, cache=cache)
    (root / "BUILD.json").write_text(json.dumps({"config": dataclasses.asdict(config), "hash": config.digest(),
                                                 "smollm2": str(smollm2), "times": times}, indent=2) + "\n")
    log(f"[real] student built in {root / 'student'} ({times})")
    return root / "student"


# Evaluation cap = the presets' data.max_response_length.
EVAL_MAX_NEW_TOKENS = 128


def task_dir(cache: str | Path, task: TaskConfig = REAL_TASK) -> Path:
    """Where the demo's data of ``task`` is cached (one directory per task config)."""
    name = f"task-{task.num_operands}x{task.digits}-{task.n_train}-{task.n_heldout}-s{task.seed}{task.variant}"
    return Path(cache).expanduser() / "real_data" / name


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


def sampled_preset(max_new_tokens: int = EVAL_MAX_NEW_TOKENS):
    """``smollm2_cpu`` (the paper's sampling for a model without its own: T 0.6, top-p 0.95), capped as training."""
    from recipe.evaluation.decoding_presets import get_preset

    return get_preset("smollm2_cpu").with_overrides(max_new_tokens=max_new_tokens)


def evaluate_real(model: Path, out_dir: Path, *, benchmark: Path) -> dict:
    """Greedy decoding on the held-out problems (``greedy/``) and one sample per problem (``sampled_n1/``), with
    the evaluation prompt and the evaluation grader (final balanced ``\\boxed{}``):
    ``{greedy, boxed_rate, mean_length, eot_rate, repetitive_rate, sampled_length, n_problems, eval_s}`` (the
    greedy evaluation's, and the sampled one's mean length: what ``recipe.opsd.core.regimes`` reads).

    ``eval_s``: this call's wall time (an evaluation already in ``out_dir`` is reused by the harness)."""
    from recipe.evaluation.harness import EvalConfig, evaluate
    from recipe.toy.student import batched_backend

    start = time.time()
    macros = {}
    for name, preset in (("greedy", greedy_preset()), ("sampled_n1", sampled_preset())):
        config = EvalConfig(model=str(model), out_dir=str(out_dir / name), preset=preset, benchmarks=[str(benchmark)],
                            n=1, seed=42, backend="hf", problems_per_call=64)
        macros[name] = evaluate(config, backend=batched_backend(model, preset=preset, seed=42), progress=False)["macro"]
    greedy = macros["greedy"]
    return {"greedy": greedy["avg@1"], "boxed_rate": greedy["boxed_rate"], "mean_length": greedy["mean_length"],
            "eot_rate": 1.0 - greedy["truncated_rate"], "repetitive_rate": greedy["repetitive_rate"],
            "sampled_length": macros["sampled_n1"]["mean_length"], "n_problems": greedy["n_problems"],
            "eval_s": round(time.time() - start, 1)}


def display_real(metrics: dict) -> dict[str, str]:
    """Table rows of ``evaluate_real``'s metrics."""
    return {f"greedy accuracy (%), {metrics['n_problems']} problems": f"{100 * metrics['greedy']:.1f}",
            "boxed rate (%)": f"{100 * metrics['boxed_rate']:.1f}",
            "end-of-turn rate (%)": f"{100 * metrics['eot_rate']:.1f}",
            "mean length (tokens), greedy": f"{metrics['mean_length']:.1f}",
            "mean length (tokens), sampled T 0.6": f"{metrics['sampled_length']:.1f}"}


def smollm2_path(settings: Settings, *, build: bool) -> Path:
    """The SmolLM2 directory in OPSD_CACHE: built if missing (``build``), else only located (``--dry-run``)."""
    from recipe.models import smollm2

    if build:
        return smollm2.fetch_smollm2(cache_dir=settings.cache_dir)
    return smollm2.expected_dir(cache_dir=settings.cache_dir)


def real(recipe: str, settings: Settings, *, build: bool = True, task: TaskConfig = REAL_TASK) -> DemoBuild:
    """The real demo: the format-SFT SmolLM2 student and the task's data (cached), a fresh run directory, the held-out
    evaluation."""
    if recipe == "sft":
        raise ValueError("CPU_DEMO=real is an OPSD / GRPO demo (run_opsd.sh, run_grpo.sh); SFT has none")
    if settings.model_path:
        model = settings.model_path
    elif build:
        model = str(build_real_student(smollm2_path(settings, build=True), cache=settings.cache_dir))
    else:
        model = str(real_student_dir(smollm2_path(settings, build=False), RealStudent(), cache=settings.cache_dir)
                    / "student")
    data = task_dir(settings.cache_dir, task)
    if build:
        write_real_data(data, task)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = Path(settings.cache_dir).expanduser() / "real_runs" / f"{stamp}-{recipe}"
    inputs = DemoInputs("real", model_path=model, train_files=str(data / "train.parquet"),
                        val_files=str(data / "val.parquet"), ckpt_dir=str(run_dir))
    before = None if settings.model_path else data / "eval_before" / Path(model).parent.name
    return DemoBuild(inputs, evaluate=partial(evaluate_real, benchmark=data / "heldout.jsonl"), display=display_real,
                     before_dir=before)
