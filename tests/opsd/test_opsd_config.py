"""OPSD config: hydra composition of opsd_trainer.yaml and validation errors that name the field."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from hydra import compose, initialize_config_dir

from recipe.opsd.core.config import LossConfig, OPSDConfig
from recipe.opsd.startup import prepare_config

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "opsd" / "config")


def _compose(overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="opsd_trainer", overrides=list(overrides))


def test_composes_with_the_paper_defaults():
    cfg = _compose()
    arr = cfg.actor_rollout_ref
    assert arr.actor.optim.lr == 1e-6
    assert arr.actor.optim.lr_scheduler_type == "cosine"
    assert arr.actor.optim.lr_warmup_steps_ratio == 0.1
    assert arr.actor.optim.weight_decay == 0.0
    assert arr.actor.optim.clip_grad == 0.1
    assert (arr.rollout.temperature, arr.rollout.top_p, arr.rollout.top_k, arr.rollout.n) == (1.1, 0.95, 20, 1)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (1024, 1024)
    assert (cfg.trainer.total_training_steps, cfg.trainer.save_freq, cfg.data.seed) == (100, 25, 42)
    assert cfg.trainer.use_v1 is False
    assert arr.actor.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
    # verl's own defaults are still there (composition over ppo_trainer)
    assert arr.actor.ppo_epochs == 1
    opsd = OPSDConfig.from_hydra(cfg.opsd)
    assert (opsd.teacher_context, opsd.student_mode, opsd.teacher_mode) == ("full_solution", "think", "think")
    assert opsd.loss == LossConfig(objective="divergence", params={}, beta=0.0, clip_tau=0.05, student_temperature=1.1,
                                   teacher_temperature=None, topk=None, positions="all", chunk_size=1024,
                                   loss_agg_mode="seq-mean-token-mean")
    assert opsd.loss.build_objective().params is None
    assert opsd.loss.effective_teacher_temperature == 1.1


def test_student_mode_sets_enable_thinking_and_cannot_disagree():
    cfg = _compose(["opsd.student_mode=no_think"])
    prepare_config(cfg)
    assert cfg.data.apply_chat_template_kwargs.enable_thinking is False
    cfg = _compose(["opsd.student_mode=think", "+data.apply_chat_template_kwargs.enable_thinking=false"])
    with pytest.raises(ValueError, match="enable_thinking"):
        prepare_config(cfg)


@pytest.mark.parametrize(
    "override, field",
    [
        ("opsd.teacher_context=full_soln", "opsd.teacher_context"),
        ("opsd.loss.beta=1.5", "opsd.loss.beta"),
        ("opsd.loss.beta=-0.1", "opsd.loss.beta"),
        ("opsd.loss.clip_tau=-0.05", "opsd.loss.clip_tau"),
        ("opsd.loss.clip_tau=0", "opsd.loss.clip_tau"),
        ("opsd.student_mode=thinking", "opsd.student_mode"),
        ("opsd.teacher_mode=on", "opsd.teacher_mode"),
        ("opsd.loss.positions=first:0", "opsd.loss.positions"),
        ("opsd.loss.positions=middle:3", "opsd.loss.positions"),
        ("opsd.loss.topk=0", "opsd.loss.topk"),
        ("opsd.loss.objective=ppo", "opsd.loss.objective"),
        ("opsd.loss.loss_agg_mode=seq-mean", "opsd.loss.loss_agg_mode"),
        ("opsd.teacher_max_prompt_length=0", "opsd.teacher_max_prompt_length"),
        ("opsd.diagnostics.max_consecutive_nonfinite=0", "opsd.diagnostics.max_consecutive_nonfinite"),
        ("opsd.diagnostics.max_consecutive_nonfinite=1.5", "opsd.diagnostics.max_consecutive_nonfinite"),
        ("opsd.diagnostics.dump_steps=1", "opsd.diagnostics.dump_steps"),
        ("+opsd.loss.clip=0.1", "opsd.loss.clip"),
        ("opsd.loss.positions=he:1.5", "opsd.loss.positions"),
        ("opsd.loss.positions=advt:0", "opsd.loss.positions"),
        ("+opsd.loss.params.pmi_strength=1", "opsd.loss.params"),
        # the collapse monitor's options are typed and validated with the rest (before Ray starts)
        ("opsd.diagnostics.monitor.recent_window=0", "opsd.diagnostics.monitor.recent_window"),
        ("opsd.diagnostics.monitor.stop_on=[colapse]", "opsd.diagnostics.monitor.stop_on"),
        ("+opsd.diagnostics.monitor.window=5", "opsd.diagnostics.monitor.window"),
    ],
)
def test_bad_options_fail_naming_the_field(override, field):
    cfg = _compose([override])
    with pytest.raises(ValueError) as err:
        prepare_config(cfg)
    assert field in str(err.value)


def test_unknown_context_lists_the_allowed_values():
    with pytest.raises(ValueError) as err:
        OPSDConfig(teacher_context="oracle")
    assert "opsd.teacher_context" in str(err.value) and "answer_only" in str(err.value) and "'oracle'" in str(err.value)


def test_clip_off_and_teacher_temperature():
    loss = LossConfig(clip_tau=None, teacher_temperature=1.0)
    assert loss.clip_tau is None and loss.effective_teacher_temperature == 1.0


def test_non_fsdp2_strategy_is_rejected_before_ray():
    cfg = _compose(["actor_rollout_ref.actor.strategy=fsdp"])
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.strategy"):
        prepare_config(cfg)


def test_every_opsd_field_is_commented_in_the_yaml():
    lines = (Path(CONFIG_DIR) / "opsd_trainer.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("opsd:"))
    fields = [(prev, line) for prev, line in zip(lines[start:], lines[start + 1:]) if not line.strip().startswith("#")]
    # the scan saw every key of the block (nested ones too), as the yaml loader reads it
    block = OmegaConf.load(Path(CONFIG_DIR) / "opsd_trainer.yaml").opsd

    def keys(node):
        return [k for k, v in node.items_ex(resolve=False) for k in [k, *(keys(v) if OmegaConf.is_dict(v) else [])]]

    assert sorted(line.split(":")[0].strip() for _, line in fields) == sorted(keys(block))
    for prev, line in fields:
        assert prev.strip().startswith("#"), f"no comment above {line!r}"


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["opsd.loss.objective=purified", "+opsd.loss.params.pmi_clip=-1"], "opsd.loss.params.pmi_clip"),
        (["opsd.loss.objective=purified", "+opsd.loss.params.pmi_strength=0"], "opsd.loss.params.pmi_strength"),
        (["opsd.loss.objective=purified", "+opsd.loss.params.strength=1"], "opsd.loss.params"),
        (["opsd.loss.objective=beta_opsd", "+opsd.loss.params.teacher_weight_end=1.2"],
         "opsd.loss.params.teacher_weight_end"),
        (["opsd.loss.objective=beta_opsd", "+opsd.loss.params.discount=1.5"], "opsd.loss.params.discount"),
        (["opsd.loss.objective=beta_opsd", "+opsd.loss.params.pmi_clip=10"], "opsd.loss.params"),
        (["opsd.loss.objective=purified", "opsd.teacher_context=unrelated"], "opsd.teacher_context"),
        (["opsd.loss.objective=purified", "opsd.loss.topk=4"], "opsd.loss.topk"),
        # the SFT term: a number >= 0, an integer cap, refused with an objective's own target
        (["opsd.loss.sft_weight=-0.1"], "opsd.loss.sft_weight"),
        (["opsd.loss.sft_weight=0.1", "opsd.loss.sft_max_length=0"], "opsd.loss.sft_max_length"),
        (["opsd.loss.sft_max_length=1.5"], "opsd.loss.sft_max_length"),
        (["opsd.loss.sft_weight=0.1", "opsd.loss.objective=beta_opsd"], "opsd.loss.sft_weight"),
        # a setting that moved is named with where it went
        (["+opsd.objective.kind=sampled_token"], "opsd.objective is now opsd.loss"),
        (["+opsd.loss.variant=purified"], "opsd.loss.variant is now opsd.loss.objective"),
    ],
)
def test_bad_objective_options_fail_naming_the_field(overrides, field):
    cfg = _compose(overrides)
    with pytest.raises(ValueError) as err:
        prepare_config(cfg)
    assert field in str(err.value)


def test_objective_params_are_validated_and_default_to_the_paper():
    from recipe.opsd.core.objectives.beta_opsd import BetaOPSDParams
    from recipe.opsd.core.objectives.purified import PurifiedParams

    loss = LossConfig(objective="beta_opsd", params={"discount": 0.9})
    assert loss.build_objective().params == BetaOPSDParams(teacher_weight_start=0.5, teacher_weight_end=0.8, discount=0.9)
    assert LossConfig(objective="purified").build_objective().params == PurifiedParams(pmi_strength=1.0, pmi_clip=10.0)
    with pytest.raises(ValueError, match="opsd.loss.params"):
        LossConfig(objective="purified", params=[1.0])


def test_native_modes_render_without_the_switch():
    cfg = _compose(["opsd.student_mode=native", "opsd.teacher_mode=native"])
    opsd = prepare_config(cfg)
    assert (opsd.student_mode, opsd.teacher_mode, opsd.student_enable_thinking) == ("native", "native", None)
    assert "enable_thinking" not in cfg.data.apply_chat_template_kwargs
    cfg = _compose(["opsd.student_mode=native", "+data.apply_chat_template_kwargs.enable_thinking=true"])
    with pytest.raises(ValueError, match="opsd.student_mode"):
        prepare_config(cfg)
    # a hybrid mode next to a native one is allowed (e.g. a native student, a switched teacher)
    assert OPSDConfig(student_mode="no_think", teacher_mode="native").student_enable_thinking is False
    # one vocabulary: null is not a mode
    with pytest.raises(ValueError, match="opsd.student_mode must be one of \\['think', 'no_think', 'native'\\]"):
        OPSDConfig(student_mode=None)


def test_position_kinds():
    assert [LossConfig(positions=p).position_kind for p in ("all", "he:0.2", "le:0.8", "advt:4", "uniform:256")] == [
        "all", "he", "le", "advt", "uniform"]


def test_monitor_options_become_a_monitor_config():
    from recipe.opsd.core.monitor import MonitorConfig

    opsd = prepare_config(_compose(["opsd.diagnostics.monitor.stop_on=[collapse]",
                                    "opsd.diagnostics.monitor.early_end=5"]))
    assert opsd.diagnostics.monitor == MonitorConfig(enabled=True, stop_on=("collapse",), early_end=5)
    assert prepare_config(_compose(["opsd.diagnostics.monitor.enabled=false"])).diagnostics.monitor.enabled is False


def test_a_batch_that_does_not_divide_across_the_gpus_fails_at_start():
    """verl's validate_config runs before Ray starts (verl's TaskRunner runs it; ours must too)."""
    with pytest.raises(ValueError, match="validate_config.*train_batch_size.*divisible"):
        prepare_config(_compose(["trainer.n_gpus_per_node=2", "data.train_batch_size=3"]))
    prepare_config(_compose(["trainer.n_gpus_per_node=2", "data.train_batch_size=4"]))


def test_fused_kernels_are_refused():
    """verl's fused kernels replace model.forward: the OPSD loss head would never run."""
    with pytest.raises(ValueError, match="use_fused_kernels must be False"):
        prepare_config(_compose(["actor_rollout_ref.model.use_fused_kernels=true"]))


def test_another_verl_version_is_refused_naming_the_private_apis(monkeypatch):
    from recipe.opsd.startup import ALLOW_OTHER_VERL_ENV, check_verl_version

    check_verl_version()  # the installed one (pyproject pins 0.9.1)
    monkeypatch.delenv(ALLOW_OTHER_VERL_ENV, raising=False)
    with pytest.raises(ValueError, match=r"verl 0\.9\.2 is installed.*forward_step.*docs/verl_private_apis.md"):
        check_verl_version("0.9.2")
    monkeypatch.setenv(ALLOW_OTHER_VERL_ENV, "1")
    with pytest.warns(RuntimeWarning, match="verl 0.9.2"):
        check_verl_version("0.9.2")


def test_the_sft_weight_reaches_the_actor_objective():
    opsd = prepare_config(_compose(["opsd.loss.sft_weight=0.25", "opsd.loss.objective=sampled_token"]))
    assert opsd.loss.sft_weight == 0.25 and opsd.loss.objective == "sampled_token"
    assert opsd.loss.sft_max_length is None  # = data.max_response_length (the trainer)
    assert prepare_config(_compose([])).loss.sft_weight == 0  # the paper: no SFT term

