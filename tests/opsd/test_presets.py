"""Experiment and model presets: every preset composes and changes exactly its factor.

The resolved, flattened config of ``opsd_trainer`` + ``+experiment=<name>`` is diffed against the
resolved default; the changed keys must be exactly the expected set below (derived keys, such as
verl's rollout.response_length interpolating data.max_response_length, are listed explicitly).
Model presets are checked against the paper's tab:training_batch_config written out here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.evaluation.decoding_presets import PRESETS
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.core.objectives import get_objective, objective_names

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "opsd" / "config"
# the toy-world preset of another module; the async-trainer presets (not paper factors: tests/async_rl/test_config.py)
NOT_MINE = {"toy", "async_one_step_off", "async_fully"}

RESPONSE = {
    "data.max_response_length",
    "actor_rollout_ref.rollout.response_length",
    "distillation.teacher_models.teacher_model.inference.response_length",
}
LORA = {"actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora_alpha", "actor_rollout_ref.model.target_modules"}
ROLLOUT_N = {"actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.rollout_n", "actor_rollout_ref.ref.rollout_n",
             "critic.rollout_n"}
REPLICATION = LORA | {"actor_rollout_ref.actor.optim.lr", "trainer.total_training_steps", "sweep.global_batch"}
STUDENT_TEMP = {
    "actor_rollout_ref.rollout.temperature",
    "distillation.teacher_models.teacher_model.inference.temperature",
    "opsd.loss.student_temperature",
    "opsd.loss.teacher_temperature",
}
MODE_KEYS = {"opsd.student_mode", "opsd.teacher_mode", "sweep.eval_mode"}

# preset -> exactly the keys it changes against the default (sweep.label excluded). The presets of objectives with
# parameters fill the default's empty opsd.loss.params mapping, so that (empty) key changes too.
EXPECTED = {
    "default": set(),
    "mode_think-think-think": {"sweep.eval_mode"},
    "mode_think-no_think-think": {"opsd.teacher_mode", "sweep.eval_mode"},
    "mode_no_think-think-no_think": {"opsd.student_mode", "sweep.eval_mode"},
    "mode_no_think-no_think-no_think": MODE_KEYS,
    "mode_no_think-think-think": {"opsd.student_mode", "sweep.eval_mode"},
    "mode_think-no_think-no_think": {"opsd.teacher_mode", "sweep.eval_mode"},
    "no_privilege_no_think-think-think": {"opsd.teacher_context", "opsd.student_mode", "sweep.eval_mode"},
    "steps_300_fresh": {"trainer.total_training_steps", "trainer.save_freq", "sweep.eval_every"},
    "steps_300_continued": {"trainer.total_training_steps", "trainer.save_freq", "trainer.resume_mode", "sweep.eval_every",
                            "sweep.continue_from.run", "sweep.continue_from.step",
                            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "actor_rollout_ref.actor.optim.num_cycles"},
    **{f"rollout_{cap}": RESPONSE for cap in (128, 256, 512, 2048, 4096, 6144)},
    "rollout_1024": set(),
    "pos_first_256": RESPONSE,
    "pos_uniform_256": {"opsd.loss.positions"},
    "pos_final_256": {"opsd.loss.positions"},
    "context_full_solution": set(),
    "context_answer_only": {"opsd.teacher_context"},
    "context_unrelated": {"opsd.teacher_context"},
    "context_cot_solution": {"opsd.teacher_context", "opsd.teacher_max_prompt_length"},
    "omr_sol_1k": set(),
    "omr_cot_sol_1k": {"opsd.teacher_context", "opsd.teacher_max_prompt_length"},
    "omr_sol_4k": {"opsd.teacher_max_prompt_length"},
    "omr_cot_sol_4k": {"opsd.teacher_context", "opsd.teacher_max_prompt_length"},
    "context_short_prefix": RESPONSE | {"sweep.data_prep.kind", "sweep.data_prep.deciles"},
    "context_long_prefix": RESPONSE | {"sweep.data_prep.kind", "sweep.data_prep.deciles"},
    "divergence_fwd_kl": set(),
    "divergence_jsd": {"opsd.loss.beta"},
    "divergence_rev_kl": {"opsd.loss.beta"},
    "clip_tau_0p01": {"opsd.loss.clip_tau"},
    "clip_tau_0p05": set(),
    "clip_tau_0p1": {"opsd.loss.clip_tau"},
    "clip_tau_0p2": {"opsd.loss.clip_tau"},
    **{f"entropy_{m}": RESPONSE | {"opsd.loss.positions"} for m in ("he20", "he80", "le20", "le80")},
    "advt4": RESPONSE | {"opsd.loss.positions"},
    "advt16": RESPONSE | {"opsd.loss.positions"},
    "topk_4": {"opsd.loss.topk"},
    "topk_16": {"opsd.loss.topk"},
    "topk_4_rev_kl": {"opsd.loss.topk", "opsd.loss.beta"},
    "topk_16_rev_kl": {"opsd.loss.topk", "opsd.loss.beta"},
    "temp_s11_t11": set(),
    "temp_s06_t06": STUDENT_TEMP,
    "temp_s06_t11": STUDENT_TEMP,
    "temp_s11_t06": {"opsd.loss.teacher_temperature"},
    "lora_r64": LORA,
    "instruction_concise_to_detailed": {"opsd.teacher_context"},
    "instruction_detailed_to_concise": {"opsd.teacher_context"},
    "sft10_then_no_privilege": {
        "opsd.teacher_context", "opsd.teacher.kind", "opsd.teacher.path", "sweep.init_stage.kind", "sweep.init_stage.total_steps", "sweep.init_stage.train_files",
    },
    "opsd_vs_grpo_matched": {
        "data.shuffle", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size",
        "critic.ppo_mini_batch_size", "trainer.total_training_steps", "opsd.teacher_max_prompt_length",
        "sweep.global_batch", "sweep.data_prep.kind", "sweep.data_prep.seed", "sweep.data_prep.num_rows",
    },
    # train_batch_size 32 equals the recipe default, so it does not show here (it does with a model preset)
    "purified_answer": REPLICATION | {
        "opsd.teacher_context", "opsd.loss.objective", "opsd.loss.beta", "opsd.loss.clip_tau",
        "opsd.loss.params.pmi_strength", "opsd.loss.params.pmi_clip",
        "opsd.loss.params",
    },
    "purified_solution": REPLICATION | {
        "opsd.loss.objective", "opsd.loss.beta", "opsd.loss.clip_tau",
        "opsd.loss.params.pmi_strength", "opsd.loss.params.pmi_clip",
        "opsd.loss.params",
    },
    "objective_sampled_token": {"opsd.loss.objective"},
    # verl interpolates rollout.n into the actor, ref and critic blocks
    "objective_sampled_token_task": {"opsd.loss.objective", "opsd.loss.task_weight"} | ROLLOUT_N,
    "objective_divergence_task": {"opsd.loss.task_weight"} | ROLLOUT_N,
    "objective_sft": {"opsd.loss.sft_weight"},
    "objective_rlsd": {"opsd.loss.objective", "opsd.loss.params", "opsd.loss.params.eps_w", "opsd.loss.params.lam",
                       "opsd.loss.params.lam_decay_steps", "opsd.teacher_context", "opsd.teacher.kind",
                       "actor_rollout_ref.actor.ppo_epochs", "critic.ppo_epochs"} | ROLLOUT_N,
    "objective_rlsd_frozen": {"opsd.loss.objective", "opsd.loss.params", "opsd.loss.params.eps_w", "opsd.loss.params.lam",
                              "opsd.loss.params.lam_decay_steps"} | ROLLOUT_N,
    "beta_opsd": REPLICATION | {
        "opsd.loss.objective", "opsd.loss.params.teacher_weight_start",
        "opsd.loss.params.teacher_weight_end", "opsd.loss.params.discount", "opsd.loss.params",
    },
}

# Paper tab:training_batch_config: preset -> (engine, GPUs, micro-batch, accumulation, global batch).
BATCH_TABLE = {
    "qwen3_0p6b": ("vllm", 2, 16, 4, 128),
    "qwen3_1p7b": ("vllm", 2, 8, 4, 64),
    "qwen3_4b": ("vllm", 2, 4, 4, 32),
    "qwen3_4b_instruct": ("vllm", 2, 4, 4, 32),
    "qwen3_4b_instruct_teacher_qwen3_4b": ("vllm", 2, 4, 4, 32),  # the cross-model row "Qwen3-4B-Instruct (Qwen3-4B)"
    "qwen3_4b_thinking": ("vllm", 2, 4, 4, 32),
    "qwen3_8b": ("vllm", 4, 4, 2, 32),
    "qwen3p5_4b": ("sglang", 2, 4, 4, 32),
    "deepseek_r1_distill_qwen_1p5b": ("vllm", 2, 8, 4, 64),
    "olmo3_7b_think": ("sglang", 4, 4, 4, 64),
    "olmo3_7b_instruct": ("sglang", 4, 4, 4, 64),
    "falcon_h1r_7b": ("sglang", 4, 2, 4, 32),
    "mimo_7b_rl": ("sglang", 4, 2, 4, 32),
    "tiny_cpu": ("hf", 1, 2, 2, 4),
    "smollm2_135m": ("hf", 1, 4, 2, 8),  # not a paper model (CPU)
}
# Paper tab:evaluation_config: preset -> decoding preset per evaluation mode.
EVAL_TABLE = {
    "qwen3_0p6b": {"think": "qwen3_think"},
    "qwen3_1p7b": {"think": "qwen3_think", "no_think": "qwen3_no_think"},
    "qwen3_4b": {"think": "qwen3_think", "no_think": "qwen3_no_think"},
    "qwen3_8b": {"think": "qwen3_think", "no_think": "qwen3_no_think"},
    "qwen3_4b_instruct": {"native": "qwen3_4b_instruct"},
    "qwen3_4b_instruct_teacher_qwen3_4b": {"native": "qwen3_4b_instruct"},
    "qwen3_4b_thinking": {"native": "qwen3_4b_thinking"},
    "qwen3p5_4b": {"think": "qwen35_4b", "no_think": "qwen35_4b"},
    "deepseek_r1_distill_qwen_1p5b": {"native": "deepseek_r1_distill"},
    "olmo3_7b_think": {"native": "olmo3_think"},
    "olmo3_7b_instruct": {"native": "olmo3_instruct"},
    "falcon_h1r_7b": {"native": "falcon_h1r"},
    "mimo_7b_rl": {"native": "mimo_7b_rl"},
    "tiny_cpu": {"think": "tiny_cpu", "no_think": "tiny_cpu"},
    "smollm2_135m": {"native": "smollm2_cpu"},
}
# Cross-model presets (paper: "A parenthetical teacher denotes a cross-model experiment"): teacher, (S, T) modes.
CROSS_MODEL = {"qwen3_4b_instruct_teacher_qwen3_4b": ("Qwen/Qwen3-4B", ("native", "no_think"))}
CAPS = (128, 256, 512, 1024, 2048, 4096, 6144)


def _names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml") if p.stem not in NOT_MINE)


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {} if node else {prefix[:-1]: {}}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _resolved(cfg) -> dict:
    return _flat(OmegaConf.to_container(cfg, resolve=True))


def _changed(base: dict, cfg: dict) -> set[str]:
    absent = object()
    return {k for k in set(base) | set(cfg) if base.get(k, absent) != cfg.get(k, absent)}


@pytest.fixture(scope="module")
def hydra_dir():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        yield


@pytest.fixture(scope="module")
def default_flat(hydra_dir):
    return _resolved(compose(config_name="opsd_trainer"))


_CACHE: dict[tuple[str, ...], object] = {}


def _compose(*overrides: str):
    """Composed config (cached: composing takes ~1 s; tests must not mutate it)."""
    if overrides not in _CACHE:
        _CACHE[overrides] = compose(config_name="opsd_trainer", overrides=list(overrides))
    return _CACHE[overrides]


def test_every_preset_has_an_expectation():
    assert sorted(EXPECTED) == _names("experiment")
    assert sorted(BATCH_TABLE) == _names("model")


def test_every_registered_objective_has_an_experiment_preset():
    """An objective is its module plus a preset that selects it (the default's: the recipe yaml itself)."""
    selected = {OmegaConf.select(OmegaConf.load(CONFIG_DIR / "opsd_trainer.yaml"), "opsd.loss.objective")}
    selected |= {OmegaConf.select(OmegaConf.load(CONFIG_DIR / "experiment" / f"{name}.yaml"), "opsd.loss.objective")
                 for name in _names("experiment")}
    assert set(objective_names()) <= selected, sorted(set(objective_names()) - selected)


@pytest.mark.parametrize("name", _names("experiment"))
def test_experiment_changes_only_its_factor(name, default_flat):
    text = (CONFIG_DIR / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n# "), "header + a comment citing the paper"
    assert "tab:" in text or "fig:" in text or "Default OPSD Configuration" in text
    cfg = _compose(f"+experiment={name}")
    assert isinstance(cfg.sweep.label, str) and cfg.sweep.label
    assert _changed(default_flat, _resolved(cfg)) - {"sweep.label"} == EXPECTED[name]


@pytest.mark.parametrize("name", _names("experiment"))
def test_experiment_opsd_block_validates(name, hydra_dir):
    cfg = _compose(f"+experiment={name}")
    loss = OmegaConf.to_container(cfg.opsd.loss, resolve=True)
    get_objective(loss["objective"]).parse_params(loss.get("params"))
    opsd = OPSDConfig.from_hydra(cfg.opsd)
    assert opsd.loss.build_objective().params == get_objective(loss["objective"]).parse_params(loss.get("params"))


@pytest.mark.parametrize("name", _names("model"))
def test_model_preset_matches_paper_tables(name, hydra_dir):
    engine, gpus, micro, accum, global_batch = BATCH_TABLE[name]
    assert micro * accum * gpus == global_batch  # the table's own identity
    overrides = [f"+model={name}"]
    if name in ("tiny_cpu", "smollm2_135m"):  # locally built models: no hub id
        overrides.append("actor_rollout_ref.model.path=/tmp/local_model")
    cfg = _compose(*overrides)
    preset = cfg.model_preset
    assert (preset.engine, preset.gpus, preset.micro_batch, preset.accumulation, preset.global_batch) == BATCH_TABLE[name]
    assert cfg.actor_rollout_ref.rollout.name == engine
    assert cfg.trainer.n_gpus_per_node == gpus
    assert cfg.data.train_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size == global_batch
    assert cfg.actor_rollout_ref.rollout.n == 1
    got_micro = cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    assert got_micro == micro and cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == micro
    assert global_batch // (got_micro * gpus) == accum  # verl's derived accumulation
    assert dict(preset.eval_presets) == EVAL_TABLE[name]
    assert all(p in PRESETS for p in preset.eval_presets.values())
    # micro-batch table: the documented rule, and always a divisor of the per-GPU batch
    per_gpu = global_batch // gpus
    for cap in (*CAPS, 8192):  # 8,192: the longest cap a preset's table holds (no rollout_8192 experiment)
        m = preset.micro_batch_by_cap[f"cap_{cap}"]
        want = micro if cap <= 1024 else max(1, micro * 1024 // cap)
        while per_gpu % want:
            want -= 1
        assert m == want, (name, cap)
    hybrid = set(preset.native_modes) == {"think", "no_think"}
    modes = (cfg.opsd.student_mode, cfg.opsd.teacher_mode)
    if name in CROSS_MODEL:  # the teacher's own mode, matched to the student's native one
        teacher_path, modes_expected = CROSS_MODEL[name]
        assert (cfg.opsd.teacher.kind, cfg.opsd.teacher.path) == ("checkpoint", teacher_path)
        assert modes == modes_expected
    else:
        assert cfg.opsd.teacher.kind == "frozen_initial"
        assert modes == (("think", "think") if hybrid else ("native", "native"))
    opsd = OPSDConfig.from_hydra(cfg.opsd)
    assert opsd.student_enable_thinking == (True if hybrid else None)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_1p7b", "qwen3_8b", "falcon_h1r_7b"])
def test_rollout_caps_keep_the_global_batch(model, hydra_dir):
    _, gpus, micro, _, global_batch = BATCH_TABLE[model]
    for cap in CAPS:
        cfg = _compose(f"+model={model}", f"+experiment=rollout_{cap}")
        got = cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
        assert cfg.data.max_response_length == cap
        assert got == cfg.model_preset.micro_batch_by_cap[f"cap_{cap}"]
        assert got <= micro and (cap > 1024 or got == micro)
        assert cfg.data.train_batch_size == global_batch
        assert (global_batch // gpus) % got == 0  # integer accumulation: micro x accumulation x GPUs = global


@pytest.mark.parametrize(
    "model,experiment,checks",
    [
        ("qwen3_4b", "opsd_vs_grpo_matched", {"data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4}),
        ("qwen3_1p7b", "purified_answer", {"data.train_batch_size": 32, "actor_rollout_ref.model.lora_rank": 64}),
        ("qwen3_1p7b", "rollout_4096", {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2}),
        ("qwen3_1p7b", "mode_no_think-think-think", {"opsd.student_mode": "no_think", "sweep.eval_mode": "think"}),
    ],
)
@pytest.mark.slow
def test_model_and_experiment_order_does_not_matter(model, experiment, checks, hydra_dir):
    a = _resolved(_compose(f"+model={model}", f"+experiment={experiment}"))
    b = _resolved(_compose(f"+experiment={experiment}", f"+model={model}"))
    assert a == b
    for key, value in checks.items():
        assert a[key] == value, key


def test_presets_combine(hydra_dir, default_flat):
    cfg = _compose("+experiment=[context_answer_only,rollout_256]")
    assert _changed(default_flat, _resolved(cfg)) - {"sweep.label"} == RESPONSE | {"opsd.teacher_context"}


# Paper tab:topk_loss_macro: model row -> (model preset, {loss support: experiment preset}). The Qwen3 rows use
# forward KL on the teacher's top-k; "OLMo-3-7B-Think uses reverse KL with student Top-k", whose full-vocabulary
# row is the reverse-KL run of tab:divergence_macro.
TOPK_TABLE = {
    "Qwen3-1.7B": ("qwen3_1p7b", {"Full vocab": "default", "k=16": "topk_16", "k=4": "topk_4"}),
    "Qwen3-4B-Instruct": ("qwen3_4b_instruct", {"Full vocab": "default", "k=16": "topk_16", "k=4": "topk_4"}),
    "OLMo-3-7B-Think": ("olmo3_7b_think", {"Full vocab": "divergence_rev_kl", "k=16": "topk_16_rev_kl", "k=4": "topk_4_rev_kl"}),
}


def _topk_by_hand(ps, pt, *, reverse: bool, k, clip_tau):
    """Clipped KL on the renormalised top-k support, written out: the student's top-k for reverse KL
    (D_KL(pS~ || pT~)), the teacher's for forward KL (D_KL(pT~ || pS~)); k None = full vocabulary."""
    import math

    ranked = ps if reverse else pt
    support = sorted(range(len(ps)), key=lambda v: -ranked[v])[: k or len(ps)]
    zs, zt = sum(ps[v] for v in support), sum(pt[v] for v in support)
    total = 0.0
    for v in support:
        s, t = ps[v] / zs, pt[v] / zt
        term = s * math.log(s / t) if reverse else t * math.log(t / s)
        total += term if clip_tau is None else min(term, clip_tau)
    return total


@pytest.mark.slow
@pytest.mark.parametrize("row", sorted(TOPK_TABLE))
def test_topk_presets_are_the_papers_rows(row, hydra_dir):
    import math

    import torch

    from recipe.opsd.core.losses import token_divergence

    model, supports = TOPK_TABLE[row]
    # 20 entries: the student's and the teacher's top-4 / top-16 differ
    ps = [0.30, 0.20, 0.10, 0.08] + [0.02] * 16
    pt = [0.02, 0.05, 0.10, 0.03, 0.25, 0.20] + [0.35 / 14] * 14
    for support, experiment in supports.items():
        cfg = _compose(f"+model={model}", f"+experiment={experiment}")
        opsd = OPSDConfig.from_hydra(cfg.opsd)
        k = None if support == "Full vocab" else int(support.removeprefix("k="))
        assert opsd.loss.topk == k and opsd.loss.clip_tau == 0.05, (row, support)
        assert opsd.loss.beta == (1.0 if row == "OLMo-3-7B-Think" else 0.0), (row, support)
        value = token_divergence(torch.tensor([[math.log(p) for p in ps]], dtype=torch.float64),
                                 torch.tensor([[math.log(p) for p in pt]], dtype=torch.float64),
                                 beta=opsd.loss.beta, clip_tau=opsd.loss.clip_tau, topk=opsd.loss.topk).item()
        expected = _topk_by_hand(ps, pt, reverse=row == "OLMo-3-7B-Think", k=k, clip_tau=0.05)
        assert value == pytest.approx(expected, abs=1e-12), (row, support)
