"""Teacher kinds (opsd.teacher): the registry's flags (and a kind the glue has never heard of), the EMA
update (float64, hand-written values), the zero-loss predicate, and their validation before Ray (config,
prepare_config, the teacher checkpoint's tokenizer)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from recipe.opsd.core.config import OPSDConfig, TeacherConfig
from recipe.opsd.core.teacher_kinds import (
    TEACHER_KINDS,
    TeacherKind,
    ema_update_,
    ema_update_all_,
    teacher_kind,
    zero_loss_reason,
)


# ------------------------------------------------------------------ the registry
# what the shipped kinds are (the sets the glue used to name): a second copy in verl's reference slot, the
# student's weights before the first update, the student at every step, its own model path, follows the student
SHIPPED = {
    "frozen_initial": dict(second_copy=True, starts_as_student=True, is_student=False, loads_path=False,
                           follows_student=False, lora_base_weights=True),
    "checkpoint": dict(second_copy=True, starts_as_student=False, is_student=False, loads_path=True,
                       follows_student=False, lora_base_weights=False),
    "ema": dict(second_copy=True, starts_as_student=True, is_student=False, loads_path=False,
                follows_student=True, lora_base_weights=False),
    "live": dict(second_copy=False, starts_as_student=True, is_student=True, loads_path=False,
                 follows_student=False, lora_base_weights=False),
}


def test_the_shipped_kinds_and_their_flags():
    for name, flags in SHIPPED.items():
        kind = teacher_kind(name)
        assert kind.name == name and {flag: getattr(kind, flag) for flag in flags} == flags
    assert [name for name, kind in TEACHER_KINDS.items() if kind.needs_full_parameters] == ["checkpoint", "ema"]
    with pytest.raises(ValueError, match=r"opsd.teacher.kind must be one of \['frozen_initial', 'checkpoint', 'ema', "
                                         r"'live'.*got 'frozen'"):
        teacher_kind("frozen")


@pytest.mark.parametrize("name", list(TEACHER_KINDS))
def test_every_kinds_flags_are_consistent(name):
    kind = teacher_kind(name)
    assert kind.name == name
    if kind.loads_path or kind.follows_student or kind.lora_base_weights:  # what only a copy of the weights can do
        assert kind.second_copy
    if kind.is_student:
        assert kind.starts_as_student and not kind.second_copy
    if kind.loads_path:  # another model's weights
        assert not kind.starts_as_student


def test_a_new_teacher_kind_is_one_registry_entry(monkeypatch):
    """A kind the glue has never heard of: a second copy loaded from opsd.teacher.path that follows the
    student. Config validation, the zero-loss predicate, the reference slot, the pre-flight gate and the
    launcher read its flags."""
    from recipe.launch.checks import teacher_kind_flag
    from recipe.opsd.core.preflight import teacher_is_student
    from recipe.opsd.startup import uses_reference_slot

    new = TeacherKind("test_following_checkpoint", second_copy=True, loads_path=True, follows_student=True)
    monkeypatch.setitem(TEACHER_KINDS, new.name, new)
    with pytest.raises(ValueError, match="opsd.teacher.path must be a model directory or Hub id with "
                                         "opsd.teacher.kind=test_following_checkpoint"):
        OPSDConfig.from_hydra({"teacher": {"kind": "test_following_checkpoint", "ema_decay": 0.9}})
    with pytest.raises(ValueError, match="opsd.teacher.ema_decay must be a number"):
        OPSDConfig.from_hydra({"teacher": {"kind": "test_following_checkpoint", "path": "/m/t"}})
    opsd = OPSDConfig.from_hydra({"teacher": {"kind": "test_following_checkpoint", "path": "/m/t", "ema_decay": 0.9}})
    assert opsd.teacher.kind_flags.follows_student and opsd.teacher.kind_flags.needs_full_parameters
    with pytest.raises(ValueError, match=r"opsd.teacher.path must be null unless opsd.teacher.kind=checkpoint\|"
                                         r"test_following_checkpoint"):
        OPSDConfig.from_hydra({"teacher": {"kind": "live", "path": "x"}})
    assert uses_reference_slot(opsd, lora=False) and uses_reference_slot(opsd, lora=True)
    assert not teacher_is_student("test_following_checkpoint", resumed=False)
    assert _zero(kind="test_following_checkpoint", teacher_path="/m/pre_sft") is None
    assert "the student's own checkpoint" in _zero(kind="test_following_checkpoint", teacher_path="/m/student")
    assert teacher_kind_flag("test_following_checkpoint", flag="loads_path")
    assert teacher_kind_flag("test_following_checkpoint", flag="follows_student")
    assert not teacher_kind_flag("frozen_initial", flag="loads_path") and not teacher_kind_flag(None, flag="loads_path")
    assert not teacher_kind_flag("no_such_kind", flag="loads_path")  # the start-up checks name it


# ------------------------------------------------------------------ EMA update
def test_ema_update_by_hand():
    teacher = torch.tensor([1.0, 2.0, -4.0], dtype=torch.float64)
    student = torch.tensor([3.0, -2.0, 0.0], dtype=torch.float64)
    out = ema_update_(teacher, student, decay=0.75)
    assert out is teacher  # in place
    # 0.75 * 1 + 0.25 * 3, 0.75 * 2 + 0.25 * (-2), 0.75 * (-4) + 0
    assert teacher.tolist() == [1.5, 1.0, -3.0]
    assert student.tolist() == [3.0, -2.0, 0.0]  # the student is never written


def test_decay_one_is_bit_identical_and_decay_zero_copies_the_student():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(64, 8, generator=gen)
    student = torch.randn(64, 8, generator=gen) * 1e3
    frozen = teacher.clone()
    ema_update_(teacher, student, decay=1.0)
    assert torch.equal(teacher, frozen)
    ema_update_(teacher, student, decay=0.0)
    assert torch.equal(teacher, student)


def test_float32_update_matches_a_float64_reference_over_many_steps():
    """A float32 teacher followed over 50 steps of a moving float32 student stays within float32
    rounding of the float64 recursion, and the recursion of a constant student is the closed form
    d^k t0 + (1 - d^k) s."""
    gen = torch.Generator().manual_seed(1)
    decay = 0.9
    teacher32 = torch.randn(1000, generator=gen)
    teacher64 = teacher32.double().clone()
    for _ in range(50):
        student32 = teacher32 + torch.randn(1000, generator=gen)
        ema_update_(teacher32, student32, decay=decay)
        teacher64 = decay * teacher64 + (1 - decay) * student32.double()
    torch.testing.assert_close(teacher32.double(), teacher64, rtol=1e-5, atol=1e-5)

    t0 = torch.randn(100, dtype=torch.float64, generator=gen)
    s = torch.randn(100, dtype=torch.float64, generator=gen)
    teacher = t0.clone()
    for _ in range(7):
        ema_update_(teacher, s, decay=decay)
    torch.testing.assert_close(teacher, decay**7 * t0 + (1 - decay**7) * s, rtol=1e-12, atol=1e-12)


def test_student_is_cast_to_the_teacher_dtype():
    teacher = torch.zeros(3, dtype=torch.float32)
    ema_update_(teacher, torch.tensor([2.0, 4.0, 8.0], dtype=torch.float64), decay=0.5)
    assert teacher.dtype == torch.float32 and teacher.tolist() == [1.0, 2.0, 4.0]


def test_ema_errors_name_the_tensor_and_the_decay():
    with pytest.raises(ValueError, match="decay must be in"):
        ema_update_(torch.zeros(2), torch.zeros(2), decay=1.5)
    pairs = [("a", torch.zeros(2), torch.ones(2)), ("model.norm.weight", torch.zeros(2), torch.zeros(3))]
    with pytest.raises(ValueError, match="model.norm.weight: EMA of tensors of different shapes"):
        ema_update_all_(pairs, decay=0.5)
    assert pairs[0][1].tolist() == [0.0, 0.0]  # nothing updated
    assert ema_update_all_(pairs[:1], decay=0.5) == 1 and pairs[0][1].tolist() == [0.5, 0.5]


# ------------------------------------------------------------------ zero-loss setting
def _zero(**changes):
    values = dict(kind="frozen_initial", teacher_path=None, student_path="/m/student", teacher_context="none",
                  student_mode="think", teacher_mode="think", student_temperature=1.1, teacher_temperature=1.1)
    return zero_loss_reason(**(values | changes))


def test_zero_loss_when_weights_prompt_mode_and_temperature_are_the_students():
    for kind in ("frozen_initial", "ema", "live"):
        assert "identically 0" in _zero(kind=kind)
    assert "the student's own checkpoint" in _zero(kind="checkpoint", teacher_path="/m/student/")
    # any one difference makes the loss nonzero
    assert _zero(kind="checkpoint", teacher_path="/m/pre_sft") is None
    assert _zero(teacher_context="full_solution") is None
    assert _zero(student_mode="no_think") is None
    assert _zero(student_mode=None, teacher_mode=None) is not None
    assert _zero(teacher_temperature=0.6) is None


# ------------------------------------------------------------------ config validation
def test_teacher_block_defaults_to_the_paper_and_validates():
    assert OPSDConfig().teacher == TeacherConfig(kind="frozen_initial", path=None, ema_decay=None)
    assert set(TEACHER_KINDS) == {"frozen_initial", "checkpoint", "ema", "live"}
    assert OPSDConfig.from_hydra({"teacher": {"kind": "ema", "ema_decay": 1}}).teacher.ema_decay == 1.0
    assert OPSDConfig.from_hydra({"teacher": {"kind": "checkpoint", "path": "Qwen/Qwen3-4B"}}).teacher.path == "Qwen/Qwen3-4B"
    bad = [
        ({"kind": "frozen"}, "opsd.teacher.kind must be one of"),
        ({"kind": "checkpoint"}, "opsd.teacher.path must be a model directory or Hub id"),
        ({"kind": "ema"}, "opsd.teacher.ema_decay must be a number in \\[0, 1\\]"),
        ({"kind": "ema", "ema_decay": 1.01}, "opsd.teacher.ema_decay"),
        ({"kind": "live", "path": "x"}, "opsd.teacher.path must be null"),
        ({"ema_decay": 0.9}, "opsd.teacher.ema_decay must be null"),
        ({"allow_zero_loss": "yes"}, "opsd.teacher.allow_zero_loss"),
        ({"decay": 0.9}, "opsd.teacher.decay"),
    ]
    for teacher, message in bad:
        with pytest.raises(ValueError, match=message):
            OPSDConfig.from_hydra({"teacher": teacher})


CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "recipe" / "opsd" / "config")


def _prepare(overrides):
    from hydra import compose, initialize_config_dir

    from recipe.opsd.startup import prepare_config

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="opsd_trainer", overrides=["actor_rollout_ref.model.path=/m/student", *overrides])
    return prepare_config(cfg)


@pytest.mark.slow
def test_prepare_config_refuses_the_zero_loss_setting_unless_allowed():
    with pytest.raises(ValueError, match="opsd.teacher: the teacher is the student itself .*opsd.teacher.allow_zero_loss=true"):
        _prepare(["opsd.teacher_context=none"])
    with pytest.raises(ValueError, match="the student's own checkpoint"):
        _prepare(["opsd.teacher_context=none", "opsd.teacher.kind=checkpoint", "opsd.teacher.path=/m/student"])
    assert _prepare(["opsd.teacher_context=none", "opsd.teacher.allow_zero_loss=true"]).teacher.allow_zero_loss
    assert _prepare(["opsd.teacher_context=none", "opsd.teacher.kind=checkpoint", "opsd.teacher.path=/m/pre_sft"])
    assert _prepare(["opsd.teacher_context=none", "opsd.teacher_mode=no_think"])


@pytest.mark.slow
def test_prepare_config_refuses_kinds_that_cannot_work():
    with pytest.raises(ValueError, match="opsd.teacher.kind=ema needs full-parameter training"):
        _prepare(["opsd.teacher.kind=ema", "opsd.teacher.ema_decay=0.99", "actor_rollout_ref.model.lora_rank=8"])
    with pytest.raises(ValueError, match="opsd.teacher.kind=checkpoint needs full-parameter training"):
        _prepare(["opsd.teacher.kind=checkpoint", "opsd.teacher.path=/m/t", "actor_rollout_ref.model.lora_rank=8"])
    with pytest.raises(ValueError, match="actor_rollout_ref.ref.fsdp_config.model_dtype must be fp32"):
        _prepare(["opsd.teacher.kind=ema", "opsd.teacher.ema_decay=0.99", "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"])
    # live needs no reference slot, with or without LoRA
    from recipe.opsd.startup import uses_reference_slot

    live = _prepare(["opsd.teacher.kind=live"])
    assert not uses_reference_slot(live, lora=False) and not uses_reference_slot(live, lora=True)
    frozen = _prepare([])
    assert uses_reference_slot(frozen, lora=False) and not uses_reference_slot(frozen, lora=True)


def test_teacher_checkpoint_needs_the_students_tokenizer(tmp_path):
    from recipe.common.cli import InputError
    from recipe.models.tiny import build_tiny_model
    from recipe.opsd.startup import check_teacher_checkpoint

    student = build_tiny_model(tmp_path / "student", seed=0)
    larger = build_tiny_model(tmp_path / "larger", seed=1, hidden_size=128, num_heads=4, num_kv_heads=2)
    opsd = OPSDConfig.from_hydra({"teacher": {"kind": "checkpoint", "path": str(larger)}})
    check_teacher_checkpoint(opsd, student_path=str(student))  # another architecture, same tokenizer: fine
    other = tmp_path / "other"
    shutil.copytree(larger, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    tokenizer["added_tokens"][0]["content"] = "<|renamed|>"
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    opsd = OPSDConfig.from_hydra({"teacher": {"kind": "checkpoint", "path": str(other)}})
    with pytest.raises(InputError, match="vocabulary differs"):
        check_teacher_checkpoint(opsd, student_path=str(student))
    config = json.loads((larger / "config.json").read_text())
    config["vocab_size"] += 8
    (larger / "config.json").write_text(json.dumps(config))
    opsd = OPSDConfig.from_hydra({"teacher": {"kind": "checkpoint", "path": str(larger)}})
    with pytest.raises(InputError, match="vocab_size"):
        check_teacher_checkpoint(opsd, student_path=str(student))


def test_a_teacher_directory_that_does_not_exist_is_named(tmp_path):
    from recipe.common.cli import InputError
    from recipe.opsd.startup import check_teacher_checkpoint

    opsd = OPSDConfig.from_hydra({"teacher": {"kind": "checkpoint", "path": str(tmp_path / "no_teacher")}})
    with pytest.raises(InputError, match=f"{tmp_path / 'no_teacher'}: no such model directory"):
        check_teacher_checkpoint(opsd, student_path=str(tmp_path / "student"))


def test_an_ema_run_resumes_only_from_a_checkpoint_with_the_ema_teacher(tmp_path):
    from recipe.common.cli import InputError
    from recipe.opsd.startup import check_ema_resume

    ema = OPSDConfig.from_hydra({"teacher": {"kind": "ema", "ema_decay": 0.99}})
    step = tmp_path / "global_step_4"
    step.mkdir()
    check_ema_resume(ema, resume_dir=None)  # a fresh run
    check_ema_resume(OPSDConfig(), resume_dir=step)  # another kind
    with pytest.raises(InputError, match="no opsd_ema_teacher/ \\(the EMA teacher\\)"):
        check_ema_resume(ema, resume_dir=step)
    (step / "opsd_ema_teacher").mkdir()
    check_ema_resume(ema, resume_dir=step)


def _hub_snapshot(model_dir, hub_cache, repo_id):
    """``hub_cache`` laid out as Hugging Face's cache holding a copy of ``model_dir`` as ``repo_id``."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    revision = "0" * 40
    shutil.copytree(model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def test_the_workers_tokenizer_check_resolves_hub_ids(tmp_path, monkeypatch):
    """On the workers a Hub model's local_path is its id: the check reads the files from the cache."""
    from types import SimpleNamespace

    import huggingface_hub.constants

    from recipe.common.cli import InputError
    from recipe.models.tiny import build_tiny_model
    from recipe.opsd.worker import OPSDActorRolloutRefWorker

    student = build_tiny_model(tmp_path / "student", seed=0)
    hub = tmp_path / "hub"
    _hub_snapshot(student, hub, "org/student")
    _hub_snapshot(build_tiny_model(tmp_path / "teacher", seed=1, hidden_size=128, num_heads=4, num_kv_heads=2), hub,
                  "org/teacher")
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "teacher", other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    tokenizer["added_tokens"][0]["content"] = "<|renamed|>"
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    _hub_snapshot(other, hub, "org/other")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    worker = SimpleNamespace(actor=SimpleNamespace(model_config=SimpleNamespace(local_path="org/student")))
    OPSDActorRolloutRefWorker._check_teacher_tokenizer(worker, SimpleNamespace(local_path="org/teacher"))
    with pytest.raises(InputError, match="vocabulary differs"):
        OPSDActorRolloutRefWorker._check_teacher_tokenizer(worker, SimpleNamespace(local_path="org/other"))
