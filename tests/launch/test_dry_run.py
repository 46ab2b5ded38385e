"""Every GPU launch branch composed without a GPU: presets reach the final config, nothing wins silently.

The launch branches are run_opsd.sh, run_grpo.sh, run_sft.sh (``recipe.launch``), the pipeline
(``recipe.tools.pipeline``) and the sweep (``scripts/sweep.py plan --dry-run``). Each model
preset goes through the OPSD launcher with one representative experiment preset (rotating) and
through the sweep; the expected values are read from the preset files themselves, so the test
checks that the launcher passes them on, whatever they are. The shell scripts are run once each
with ``--dry-run`` to check the wiring and the printed config.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.launch.config import Override, Settings, get_recipe
from recipe.launch.run import plan

REPO_ROOT = Path(__file__).resolve().parents[2]
OPSD, GRPO, SFT = get_recipe("opsd"), get_recipe("grpo"), get_recipe("sft")
# the presets of Hub models (the CPU presets tiny_cpu / smollm2_135m name a locally built model; a preset
# that extends another through its defaults list, the cross-model one, has its own test below)
PAPER_MODELS = [m for m in OPSD.presets("model")
                if OmegaConf.select(OmegaConf.load(OPSD.config_dir / "model" / f"{m}.yaml"), "model_preset.hf_id")]
# one factor each: caps (with micro-batch rebalancing), teacher cap, global batch + steps, schedule, temperatures
# (steps_300_continued continues another run's checkpoint, which the launch's start-up checks require: its own test)
EXPERIMENTS = ["default", "rollout_4096", "context_cot_solution", "opsd_vs_grpo_matched", "temp_s06_t06",
               "rollout_256", "lora_r64", "omr_cot_sol_4k"]


INPUTS = None  # the session's real model directory, parquets and Hub cache (tests/launch/conftest.py)


@pytest.fixture(autouse=True)
def _inputs(launch_inputs):
    global INPUTS
    INPUTS = launch_inputs


def a_model() -> str:
    """A real model directory (every launch checks its model before Ray starts)."""
    return str(INPUTS.model)


def gpu_plan(recipe, argv, *, gpus_listed=8, **settings):
    settings.setdefault("train_files", str(INPUTS.sft if recipe is SFT else INPUTS.train))
    return plan(recipe, Settings(device="gpu", **settings), argv, detect_gpus=lambda: gpus_listed,
                environ=INPUTS.env)


def preset(group: str, name: str, recipe=OPSD):
    return OmegaConf.load(recipe.config_dir / group / f"{name}.yaml")


def expected_opsd(model: str, experiment: str) -> dict:
    """The values the model and experiment presets ask for (the recipe yaml's where they are silent)."""
    m, e = preset("model", model).model_preset, preset("experiment", experiment)
    base = OmegaConf.load(OPSD.config_dir / "opsd_trainer.yaml")
    cap = OmegaConf.select(e, "data.max_response_length", default=base.data.max_response_length)
    return {
        "actor_rollout_ref.model.path": m.hf_id,
        "actor_rollout_ref.rollout.name": m.engine,
        "trainer.n_gpus_per_node": m.gpus,
        "data.max_prompt_length": base.data.max_prompt_length,
        "data.max_response_length": cap,
        "actor_rollout_ref.rollout.response_length": cap,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": m.micro_batch_by_cap[f"cap_{cap}"],
        "data.train_batch_size": OmegaConf.select(e, "sweep.global_batch", default=m.global_batch),
        "opsd.teacher_max_prompt_length": OmegaConf.select(
            e, "opsd.teacher_max_prompt_length", default=base.opsd.teacher_max_prompt_length),
        "trainer.total_training_steps": OmegaConf.select(
            e, "trainer.total_training_steps", default=base.trainer.total_training_steps),
        "actor_rollout_ref.rollout.temperature": OmegaConf.select(
            e, "actor_rollout_ref.rollout.temperature", default=base.actor_rollout_ref.rollout.temperature),
        "data.seed": base.data.seed,
    }


@pytest.mark.slow
@pytest.mark.parametrize("experiment, kind, task_weight, n, sft_weight", [
    ("objective_sampled_token", "sampled_token", 0.0, 1, 0.0),
    ("objective_sampled_token_task", "sampled_token", 0.1, 4, 0.0),
    ("objective_divergence_task", "divergence", 0.1, 4, 0.0),
    ("objective_sft", "divergence", 0.0, 1, 0.1),
])
def test_objective_presets_reach_the_final_config_and_validate(experiment, kind, task_weight, n, sft_weight):
    from recipe.opsd.startup import prepare_config

    launch = gpu_plan(OPSD, ["+model=qwen3_1p7b", f"+experiment={experiment}"])
    assert_reaches(launch.config, {"opsd.loss.objective": kind, "opsd.loss.task_weight": task_weight,
                                   "actor_rollout_ref.rollout.n": n, "opsd.loss.sft_weight": sft_weight})
    opsd = prepare_config(launch.config.copy())
    assert (opsd.loss.objective, opsd.loss.task_weight, opsd.loss.sft_weight) == (kind, task_weight, sft_weight)
    if task_weight:  # the task reward refuses a single rollout per prompt
        single = launch.config.copy()
        single.actor_rollout_ref.rollout.n = 1
        with pytest.raises(ValueError, match=r"opsd.loss.task_weight=0.1 needs actor_rollout_ref.rollout.n > 1"):
            prepare_config(single)


def assert_reaches(cfg, expected: dict):
    got = {key: OmegaConf.select(cfg, key) for key in expected}
    assert got == expected


def trainer_args(command: list[str]) -> list[str]:
    return [a for a in command if "=" in a and not a.startswith("--")]


@pytest.mark.slow
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_run_opsd_gpu_keeps_every_model_preset(model):
    experiment = EXPERIMENTS[PAPER_MODELS.index(model) % len(EXPERIMENTS)]
    launch = gpu_plan(OPSD, [f"+model={model}", f"+experiment={experiment}"])
    assert_reaches(launch.config, expected_opsd(model, experiment))
    keys = [Override.parse(a).key for a in trainer_args(launch.command)]
    assert len(keys) == len(set(keys)), keys  # each key once
    # the launcher added neither an engine nor a GPU count (nvidia-smi's 8 lose to the preset)
    assert not any(k in ("actor_rollout_ref.rollout.name", "trainer.n_gpus_per_node") for k in keys)
    assert launch.overrides.replaced == [] and launch.notes == []


@pytest.mark.slow
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_sweep_gpu_keeps_every_model_preset(model, tmp_path, monkeypatch):
    from recipe.experiments.sweep import EvalSettings, plan_sweep

    for name, value in INPUTS.env.items():  # the sweep plans with the process environment (the Hub cache)
        monkeypatch.setenv(name, value)
    experiment = EXPERIMENTS[(PAPER_MODELS.index(model) + 1) % len(EXPERIMENTS)]
    plans = plan_sweep([experiment], model=model, sweep_dir=tmp_path / "sweep", device="gpu", dry_run=True,
                       overrides=[f"data.train_files={INPUTS.train}", f"data.val_files={INPUTS.val}"],
                       evaluation=EvalSettings())
    cfg = OmegaConf.create(plans[0]["config_yaml"])
    expected = expected_opsd(model, experiment)
    if preset("experiment", experiment).get("sweep", {}).get("data_prep"):
        assert cfg.data.train_files.endswith("runs/" + experiment + "/data/train.parquet")  # the data step's output
    assert_reaches(cfg, expected)
    assert not (tmp_path / "sweep").exists()  # a dry run writes nothing


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_cpu", "smollm2_135m"])
def test_cpu_model_presets_on_a_gpu_fail_with_what_to_set(model):
    with pytest.raises(ValueError, match=f"set MODEL_PATH \\(\\+model={model} names no Hub id"):
        gpu_plan(OPSD, [f"+model={model}"])
    with pytest.raises(ValueError, match=r"rollout.name=hf \(\+model=.*\) is the CPU path's rollout .* set "
                                         r"actor_rollout_ref.rollout.name=vllm"):
        gpu_plan(OPSD, [f"+model={model}"], model_path=a_model())
    launch = gpu_plan(OPSD, [f"+model={model}", "actor_rollout_ref.rollout.name=vllm"], model_path=a_model())
    assert launch.config.actor_rollout_ref.model.path == a_model()


@pytest.mark.slow
def test_explicit_choices_win_and_are_printed():
    launch = gpu_plan(OPSD, ["+model=falcon_h1r_7b", "actor_rollout_ref.rollout.name=vllm"], ngpus=8)
    assert launch.config.actor_rollout_ref.rollout.name == "vllm" and launch.config.trainer.n_gpus_per_node == 8
    text = launch.describe()
    assert ("trainer.n_gpus_per_node=8 (NGPUS / CPU_NUM_RANKS) replaces trainer.n_gpus_per_node=4 of "
            "+model=falcon_h1r_7b") in text
    assert ("actor_rollout_ref.rollout.name=vllm (command line) replaces actor_rollout_ref.rollout.name=sglang of "
            "+model=falcon_h1r_7b") in text


@pytest.mark.slow
def test_gpu_count_from_nvidia_smi_only_when_no_preset_sets_it():
    plain = gpu_plan(OPSD, [], model_path=a_model(), gpus_listed=4)
    assert plain.config.trainer.n_gpus_per_node == 4 and "nvidia-smi" in plain.describe()
    preset_run = gpu_plan(OPSD, ["+model=qwen3_8b"], gpus_listed=2)
    assert preset_run.config.trainer.n_gpus_per_node == 4  # the preset's, not the machine's


@pytest.mark.slow
def test_gpu_run_without_a_model_names_the_setting():
    with pytest.raises(ValueError, match="set MODEL_PATH or a \\+model=<preset>"):
        gpu_plan(OPSD, [])
    with pytest.raises(ValueError, match="set TRAIN_FILES"):
        plan(OPSD, Settings(device="gpu"), ["+model=qwen3_1p7b"], detect_gpus=lambda: 8, environ={})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "response", "seed"),
    [(None, 20480, 42), ("released_grpo", 24576, 1)],
)
def test_run_grpo_gpu_budgets_cover_the_caps_and_the_seed_is_pinned(experiment, response, seed):
    launch = gpu_plan(GRPO, [f"+experiment={experiment}"] if experiment else [], model_path=a_model())
    cfg = launch.config
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.data.seed) == (1024, response, seed)
    budget = 1024 + response
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    for key in ("actor.ppo_max_token_len_per_gpu", "rollout.log_prob_max_token_len_per_gpu",
                "ref.log_prob_max_token_len_per_gpu"):
        assert OmegaConf.select(cfg, f"actor_rollout_ref.{key}") == budget, key
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1


@pytest.mark.slow
def test_run_grpo_keeps_a_larger_budget_and_raises_a_smaller_one_with_a_note():
    larger = gpu_plan(GRPO, ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536"], model_path=a_model())
    assert larger.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 65536
    smaller = gpu_plan(GRPO, ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"], model_path=a_model())
    assert smaller.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 21504
    assert "ppo_max_token_len_per_gpu=21504 (derived) replaces" in smaller.describe()


@pytest.mark.slow
def test_matched_grpo_seed_is_the_order_the_matched_opsd_preset_replays():
    """Paper: "the first 3,200 rows produced by the GRPO random sampler (seed 1)"."""
    grpo = gpu_plan(GRPO, ["+experiment=released_grpo"], model_path=a_model()).config
    matched = preset("experiment", "opsd_vs_grpo_matched")
    assert grpo.data.seed == matched.sweep.data_prep.seed == 1
    assert grpo.data.train_batch_size == matched.data.train_batch_size == 64
    assert grpo.trainer.total_training_steps == matched.trainer.total_training_steps == 50


@pytest.mark.slow
def test_run_sft_gpu_budget_covers_the_paper_rows():
    launch = gpu_plan(SFT, [], model_path=a_model(), ngpus=8)
    cfg = launch.config
    assert cfg.data.max_length == 12288 and cfg.data.use_dynamic_bsz is True
    assert cfg.data.max_token_len_per_gpu >= cfg.data.max_length  # verl's default 8,192 aborts on these rows
    assert "--nproc_per_node=8" in launch.command
    longer = gpu_plan(SFT, ["data.max_length=16384"], model_path=a_model(), ngpus=8).config
    assert longer.data.max_token_len_per_gpu == 16384
    with pytest.raises(ValueError, match="one node"):
        gpu_plan(SFT, [], model_path=a_model(), ngpus=8, nnodes=2)


@pytest.mark.slow
def test_cpu_platform_comes_after_the_presets():
    launch = plan(OPSD, Settings(device="cpu", model_path=a_model(), train_files=str(INPUTS.train)),
                  ["+model=qwen3_1p7b"], environ=INPUTS.env)
    groups = [a for a in launch.command if a.startswith("+") and Override.parse(a).is_group]
    assert groups == ["+model=qwen3_1p7b", "+platform=cpu"]
    assert launch.config.actor_rollout_ref.rollout.name == "hf" and launch.config.trainer.device == "cpu"
    assert launch.env["VERL_PLATFORM"] == "cpu"
    assert launch.env["VERL_USE_EXTERNAL_MODULES"] == "recipe.cpu.plugin,recipe.rollout.extension"


@pytest.mark.slow
def test_cpu_workers_take_one_thread_unless_set_and_the_real_demo_all_cores():
    from recipe.launch.run import THREADS_KEY, DemoInputs

    def threads(settings, demo=None, **environ):
        launch = plan(OPSD, Settings(device="cpu", model_path=a_model(), train_files=str(INPUTS.train), **settings), [],
                      demo=demo, environ={**INPUTS.env, **environ})
        return OmegaConf.select(launch.config, THREADS_KEY)

    real = DemoInputs("real", model_path=a_model(), train_files=str(INPUTS.train))
    assert threads({}) is None  # Ray's default, one
    assert threads({"cpu_threads": 3}) == "3"
    assert threads({}, demo=real, OMP_NUM_THREADS="") == str(os.cpu_count())
    assert threads({}, demo=real, OMP_NUM_THREADS="1") == "1"  # the test lanes' launches
    assert threads({"cpu_threads": 1}, demo=real, OMP_NUM_THREADS="") == "1"


def _script(script: str, *args: str, **environ) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable, **INPUTS.env,
           **environ}
    return subprocess.run(["bash", script, "--dry-run", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _resolved_yaml(stdout: str) -> str:
    """The resolved config a dry run prints after the header's effective-config table (its lines indented)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("[launch] effective config")) + 1
    while lines[start].startswith("  "):
        start += 1
    return "\n".join(lines[start:])


@pytest.mark.slow
def test_shell_scripts_dry_run_print_the_final_config(tmp_path):
    opsd = _script("recipe/opsd/run_opsd.sh", "+model=falcon_h1r_7b", DEVICE="gpu", TRAIN_FILES=str(INPUTS.train),
                   OPSD_CACHE=str(tmp_path))
    assert opsd.returncode == 0, opsd.stderr
    final = OmegaConf.create(_resolved_yaml(opsd.stdout))
    assert final.actor_rollout_ref.rollout.name == "sglang" and final.trainer.n_gpus_per_node == 4
    assert "python -m recipe.opsd.main_opsd" in opsd.stdout.replace(sys.executable, "python")
    grpo = _script("recipe/grpo_baseline/run_grpo.sh", "+experiment=released_grpo", DEVICE="gpu", MODEL_PATH=a_model(),
                   TRAIN_FILES=str(INPUTS.train), OPSD_CACHE=str(tmp_path))
    assert grpo.returncode == 0, grpo.stderr
    assert "ppo_max_token_len_per_gpu: 25600" in grpo.stdout and "seed: 1\n" in grpo.stdout
    sft = _script("recipe/sft/run_sft.sh", DEVICE="gpu", MODEL_PATH=a_model(), TRAIN_FILES=str(INPUTS.sft),
                  NGPUS="8", OPSD_CACHE=str(tmp_path))
    assert sft.returncode == 0, sft.stderr
    assert "max_token_len_per_gpu: 12288" in sft.stdout and "--nproc_per_node=8" in sft.stdout
    assert not any(tmp_path.iterdir())  # nothing built or written
    bad = _script("recipe/opsd/run_opsd.sh", "+model=no_such_model", DEVICE="gpu", TRAIN_FILES="/t.parquet")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and len(bad.stderr.splitlines()) <= 3


@pytest.mark.slow
def test_teacher_presets_compose_through_the_launcher_and_the_sweep(tmp_path):
    """The cross-model preset (paper row "Qwen3-4B-Instruct (Qwen3-4B)") and SFT-10 + no-privilege OPSD
    (teacher = the pre-SFT model) reach the final config and pass the start-up checks; the SFT-10
    preset launched directly from an SFT checkpoint without a teacher path is refused (zero loss)."""
    from recipe.experiments.sweep import EvalSettings, plan_sweep
    from recipe.opsd.startup import prepare_config

    cross = gpu_plan(OPSD, ["+model=qwen3_4b_instruct_teacher_qwen3_4b"])
    assert_reaches(cross.config, {
        "actor_rollout_ref.model.path": "Qwen/Qwen3-4B-Instruct-2507", "opsd.teacher.kind": "checkpoint",
        "opsd.teacher.path": "Qwen/Qwen3-4B", "opsd.student_mode": "native", "opsd.teacher_mode": "no_think",
        "data.train_batch_size": 32, "trainer.n_gpus_per_node": 2,
    })
    assert prepare_config(cross.config).teacher.path == "Qwen/Qwen3-4B"

    plans = plan_sweep(["sft10_then_no_privilege"], model="qwen3_1p7b", sweep_dir=tmp_path / "sweep", device="gpu",
                       dry_run=True, overrides=["data.train_files=/data/train.parquet", "data.val_files=/data/val.parquet"],
                       evaluation=EvalSettings())
    cfg = OmegaConf.create(plans[0]["config_yaml"])
    assert cfg.actor_rollout_ref.model.path == plans[0]["eval"]["init_model"] != "Qwen/Qwen3-1.7B"  # the SFT-10 model
    assert (cfg.opsd.teacher.kind, cfg.opsd.teacher.path, cfg.opsd.teacher_context) == ("checkpoint", "Qwen/Qwen3-1.7B", "none")
    assert prepare_config(cfg).teacher.path == "Qwen/Qwen3-1.7B"

    with pytest.raises(ValueError, match="the student's own checkpoint .*opsd.teacher.allow_zero_loss=true"):
        gpu_plan(OPSD, ["+model=qwen3_1p7b", "+experiment=sft10_then_no_privilege"])  # the launch's start-up checks
    fixed = gpu_plan(OPSD, ["+model=qwen3_1p7b", "+experiment=sft10_then_no_privilege", f"opsd.teacher.path={a_model()}"])
    assert prepare_config(fixed.config).teacher.path == a_model()


@pytest.mark.slow
def test_a_rollout_cap_missing_from_the_model_presets_table_is_said():
    note = "the model preset's micro-batch table has no entry for data.max_response_length=3000"
    odd = gpu_plan(OPSD, ["+model=qwen3_1p7b", "data.max_response_length=3000"])
    assert odd.config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8  # the 1,024-token value
    assert note in odd.describe() and "(caps 128, 256, 512, 1024, 2048, 4096, 6144, 8192)" in odd.describe()
    chosen = gpu_plan(OPSD, ["+model=qwen3_1p7b", "data.max_response_length=3000",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    assert "micro-batch table" not in chosen.describe()
    listed = gpu_plan(OPSD, ["+model=qwen3_1p7b", "data.max_response_length=8192"])
    assert listed.config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1
    assert "micro-batch table" not in listed.describe()


@pytest.mark.slow
def test_dry_run_runs_the_launchs_start_up_checks():
    """A value only the typed OPSD config rejects stops a dry run with the line the launch would print."""
    with pytest.raises(ValueError, match=r"^config: opsd.student_mode must be one of"):
        gpu_plan(OPSD, ["+model=qwen3_1p7b", "opsd.student_mode=bogus"])
    bad = _script("recipe/opsd/run_opsd.sh", "+model=qwen3_1p7b", "opsd.loss.beta=2", DEVICE="gpu",
                  TRAIN_FILES=str(INPUTS.train))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: config: opsd.loss.beta")


@pytest.mark.slow
@pytest.mark.parametrize("recipe, argv, device", [
    (OPSD, ["+model=qwen3_4b", "+experiment=[context_answer_only,rollout_256]", "actor_rollout_ref.actor.optim.lr=3e-6",
            '+ray_kwargs.ray_init.runtime_env.env_vars.OPSD_X="1e-3"', "~trainer.logger", "+trainer.logger=[console]"], "gpu"),
    (GRPO, ["+experiment=released_grpo", "data.seed=7", "++ray_kwargs.ray_init.num_cpus=null"], "gpu"),
    (OPSD, ["+demo=tiny", "trainer.total_training_steps=3", 'trainer.experiment_name="a b"'], "cpu"),
])
def test_the_launchs_config_is_what_hydra_composes_from_its_override_list(recipe, argv, device):
    """The launcher composes the group selections once and applies the value overrides itself (a delete falls
    back to hydra's composition); verl composes the launch's whole override list: the two configs are equal."""
    from recipe.launch.config import compose

    if device == "gpu":
        launch = gpu_plan(recipe, argv, model_path=a_model())
    else:
        launch = plan(recipe, Settings(device="cpu", model_path=a_model(), train_files=str(INPUTS.train)), argv,
                      environ=INPUTS.env)
    assert OmegaConf.to_container(launch.config) == OmegaConf.to_container(compose(recipe, launch.overrides.as_list()))
