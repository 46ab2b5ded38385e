"""Start-up checks of the OPSD recipe: everything a launch verifies before Ray starts.

``startup_checks(config)`` runs them in order on the composed hydra config and returns the validated
``OPSDConfig`` and the checkpoint to resume from. The entry point (``main_opsd``) and the launcher (every launch
and every ``--dry-run``) both call it, so a dry run fails on exactly what the launch would: the verl release;
the ``opsd:`` block and verl's ``validate_config``; the model, resume checkpoint, teacher checkpoint (a kind that
``loads_path``) and EMA state (one that ``follows_student``); every row's reference solution (SFT term); the
pre-flight gate's tokenizer-only part. Errors: ``ValueError`` (config, names the field), ``InputError`` (a file),
``PreflightError`` (template / mode / EOS mismatch).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import open_dict

from recipe.common.checkpoints import check_training_inputs, choose_resume_dir
from recipe.common.cli import InputError
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.core.preflight import GATE_ROWS


@dataclass
class Startup:
    """What the checks found: the validated ``opsd:`` block, the ``global_step_N`` to resume from (None:
    from scratch), a note when that is not the save verl would pick, the pre-flight gate's report line."""

    opsd: OPSDConfig
    resume_dir: Path | None
    resume_note: str | None
    preflight_line: str | None


class StartupError(InputError):
    """A start-up check failed; its ``line`` is what a user sees (exit code 2, no traceback)."""


# where a configuration mistake is (its message names the field), and how to skip the pre-flight gate
CONFIG = "config"
PREFLIGHT = "preflight"
PREFLIGHT_SKIP = "opsd.diagnostics.preflight=false skips this gate"


def preflight_error(err: Exception) -> StartupError:
    """The pre-flight gate's failure (a first line, then the diff of the renderings) as a start-up error."""
    first, _, rest = str(err).partition("\n")
    return StartupError(first, file=PREFLIGHT, hint=PREFLIGHT_SKIP, detail=rest or None)


def startup_checks(config) -> Startup:
    """Every check of the module docstring, in order; ``config`` is completed in place (prepare_config).
    Raises ``StartupError`` with the line to print."""
    try:
        check_verl_version()
    except ValueError as err:
        raise StartupError(str(err), file="verl") from None
    try:
        opsd = prepare_config(config)
    except ValueError as err:  # a config mistake: the message names the field
        raise StartupError(str(err), file=CONFIG) from None
    try:  # the model directory and the checkpoint a run would resume from
        trainer = config.trainer
        resume_dir, note = choose_resume_dir(
            resume_mode=trainer.resume_mode, default_local_dir=trainer.default_local_dir,
            resume_from_path=trainer.get("resume_from_path"),
        )
        check_training_inputs(model_path=config.actor_rollout_ref.model.path, resume_dir=resume_dir)
        # a teacher that loads_path: the student's tokenizer; one that follows_student: a resume needs its state
        check_teacher_checkpoint(opsd, student_path=config.actor_rollout_ref.model.path)
        check_ema_resume(opsd, resume_dir=resume_dir)
        check_sft_solutions(opsd, train_files=config.data.train_files)  # SFT term only
    except InputError as err:  # names the file and what is wrong with it
        raise StartupError(err.what, file=err.file, line=err.line_number, row=err.row, hint=err.hint) from None
    line = None
    if opsd.diagnostics.preflight:  # template / reasoning-mode / EOS mismatches
        try:
            line = preflight_gate(config, opsd)
        except ValueError as err:  # PreflightError, or a row without a field its context needs
            raise preflight_error(err) from None
    return Startup(opsd=opsd, resume_dir=resume_dir, resume_note=note, preflight_line=line)


# The verl release the glue was written against: its private APIs (docs/verl_private_apis.md) are
# re-checked by hand on every upgrade.
EXPECTED_VERL_VERSION = "0.9.1"
# set to 1 to run on another verl anyway (a loud warning instead of the error)
ALLOW_OTHER_VERL_ENV = "OPSD_ALLOW_OTHER_VERL"


def check_verl_version(found: str | None = None) -> None:
    """Refuse another verl than ``EXPECTED_VERL_VERSION`` (warn instead with OPSD_ALLOW_OTHER_VERL=1)."""
    if found is None:
        from importlib.metadata import version

        found = version("verl")
    if found == EXPECTED_VERL_VERSION:
        return
    message = (
        f"the OPSD recipe was written against verl {EXPECTED_VERL_VERSION}, but verl {found} is installed. "
        "It relies on private verl APIs that change between releases without notice: the FSDP engine's "
        "forward_step / forward_backward_batch / prepare_model_inputs and _autocast_dtype (the loss computed in "
        "place of the lm_head), ActorRolloutRefWorker.actor_worker_cls / ref_worker_cls and the engine class swap "
        "(the OPSD worker), RayPPOTrainer's private helpers behind the trainer's copy of fit (_load_checkpoint, "
        "_save_checkpoint, _validate, _balance_batch, ...), the non-tensor keys of verl's micro-batches "
        "(batch_num_tokens, dp_size, global_batch_size) and FSDP2's _lazy_init: the full list is "
        "docs/verl_private_apis.md. Install verl==0.9.1 (pyproject.toml pins it), or re-check that list and set "
        f"{ALLOW_OTHER_VERL_ENV}=1 to run anyway."
    )
    if os.environ.get(ALLOW_OTHER_VERL_ENV) == "1":
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=2)
        print(f"[opsd] WARNING: {message}", file=sys.stderr)
        return
    raise ValueError(message)


def prepare_config(config) -> OPSDConfig:
    """Validate the ``opsd:`` block and derive the verl settings it owns (in place)."""
    opsd = OPSDConfig.from_hydra(config.get("opsd"))
    if config.trainer.get("use_v1", False):
        raise ValueError("the OPSD recipe runs on verl's RayPPOTrainer: set trainer.use_v1=False")
    lora_rank = config.actor_rollout_ref.model.get("lora_rank", 0) or config.actor_rollout_ref.model.get(
        "lora", {}
    ).get("rank", 0)
    if config.actor_rollout_ref.actor.strategy != "fsdp2":
        raise ValueError(
            f"actor_rollout_ref.actor.strategy must be fsdp2 for OPSD, got {config.actor_rollout_ref.actor.strategy!r}"
        )
    _check_teacher_kind(config, opsd, lora=lora_rank > 0)
    if uses_reference_slot(opsd, lora=lora_rank > 0) and config.actor_rollout_ref.ref.strategy != "fsdp2":
        raise ValueError(
            f"actor_rollout_ref.ref.strategy must be fsdp2 for OPSD (it holds the teacher), "
            f"got {config.actor_rollout_ref.ref.strategy!r}"
        )
    if config.actor_rollout_ref.model.get("use_fused_kernels", False):
        raise ValueError(
            "actor_rollout_ref.model.use_fused_kernels must be False for OPSD: verl's fused kernels replace the "
            "model's forward, so the OPSD loss computed in place of the lm_head would never run (the OPSD loss is "
            "already fused with the lm_head: recipe.opsd.core.losses.fused_linear_weighted_divergence)"
        )
    _validate_verl_config(config, use_reference_policy=uses_reference_slot(opsd, lora=lora_rank > 0))
    kwargs = dict(config.data.get("apply_chat_template_kwargs") or {})
    enable_thinking = opsd.student_enable_thinking
    if "enable_thinking" in kwargs and (enable_thinking is None or bool(kwargs["enable_thinking"]) != enable_thinking):
        raise ValueError(
            f"data.apply_chat_template_kwargs.enable_thinking={kwargs['enable_thinking']} contradicts "
            f"opsd.student_mode={opsd.student_mode!r} (native = the template's own mode, no switch); "
            "set only opsd.student_mode"
        )
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    with open_dict(config):
        config.data.apply_chat_template_kwargs = kwargs
    if config.actor_rollout_ref.rollout.get("temperature") != opsd.loss.student_temperature:
        print(
            f"[opsd] note: rollout temperature {config.actor_rollout_ref.rollout.temperature} != "
            f"opsd.loss.student_temperature {opsd.loss.student_temperature}"
        )
    actor = config.actor_rollout_ref.actor
    check_objective(config, opsd)
    if opsd.loss.position_kind in ("he", "le") and (
        actor.ppo_mini_batch_size != config.data.train_batch_size or actor.get("ppo_epochs", 1) != 1
    ):
        print(
            f"[opsd] note: opsd.loss.positions={opsd.loss.positions!r} ranks positions by the student entropy of "
            "each update's own forward; with several updates per batch (ppo_mini_batch_size < train_batch_size "
            "or ppo_epochs > 1) later updates rank by the partly updated student, not the rollout policy"
        )
    return opsd


def check_objective(config, opsd: OPSDConfig) -> None:
    """The objective of ``opsd`` against the launch's ``config``: the task reward needs groups of rollouts; the
    surrogate's pS_old of stale samples is the rollout's log-probs (``needs_behaviour_log_probs``; fresh samples:
    the actor's own, always available)."""
    loss = opsd.loss
    n = int(config.actor_rollout_ref.rollout.n)
    objective = loss.build_objective()
    if objective.uses_task_reward() and n < 2:
        what = f"opsd.loss.task_weight={loss.task_weight}" if loss.task_weight > 0 else \
            f"opsd.loss.objective={loss.objective} (its direction is the task reward)"
        fix = "or set task_weight=0" if loss.task_weight > 0 else "e.g. actor_rollout_ref.rollout.n=4"
        raise ValueError(
            f"{what} needs actor_rollout_ref.rollout.n > 1 (the GRPO advantage compares the rollouts of one "
            f"prompt; with n={n} it is 0), {fix}"
        )
    from recipe.async_rl.config import async_settings
    from recipe.opsd.core.objectives.base import needs_behaviour_log_probs

    stale = async_settings(config, opsd=True) is not None
    if needs_behaviour_log_probs(objective, stale_samples=stale, updates_per_batch=1) \
            and not config.actor_rollout_ref.rollout.get("calculate_log_probs", False):
        raise ValueError(
            f"actor_rollout_ref.rollout.calculate_log_probs=false: the policy-gradient surrogate of "
            f"opsd.loss.objective={loss.objective} (task_weight {loss.task_weight}) needs the rollout's log-probs as "
            "pS_old, because its samples come from the previous policy (async_training); set it to true"
        )


def preflight_gate(config, opsd: OPSDConfig) -> str:
    """The pre-flight gate on the first ``GATE_ROWS`` rows of the first train file, with the
    tokenizer verl will build (``tokenizer_path`` or ``path``, ``custom_chat_template``) and no model.
    Returns the report line; raises ``preflight.PreflightError`` (message with the diff). Data or a
    tokenizer the driver cannot read (a remote path verl copies to the workers, a model directory that
    only the worker nodes have) skip the gate with a line saying why: the gate never blocks a run verl
    could start."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer, GenerationConfig

    from recipe.opsd.core.preflight import run_preflight

    model = config.actor_rollout_ref.model
    files = config.data.train_files
    path = str(files if isinstance(files, str) else list(files)[0])
    prompt_key = config.data.get("prompt_key", "prompt")
    try:
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=GATE_ROWS, columns=[prompt_key, "extra_info"]))
    except (OSError, StopIteration, KeyError, ValueError) as err:
        return f"[opsd] preflight: skipped (cannot read the `{prompt_key}` and `extra_info` columns of {path} here: {err})"
    rows = batch.to_pylist()
    source = model.get("tokenizer_path") or model.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=bool(model.get("trust_remote_code", False)))
    except (OSError, ValueError) as err:
        return f"[opsd] preflight: skipped (cannot load the tokenizer of {source} here: {err})"
    if model.get("custom_chat_template"):
        tokenizer.chat_template = model.custom_chat_template
    eos_ids = {tokenizer.eos_token_id} - {None}
    try:  # the rollout also stops at the generation config's EOS ids
        generation_eos = GenerationConfig.from_pretrained(model.path).eos_token_id
        eos_ids |= set(generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]) - {None}
    except OSError:
        pass
    report = run_preflight(
        [row["extra_info"] for row in rows], rollout_prompts=[row[prompt_key] for row in rows],
        teacher_context=opsd.teacher_context, student_mode=opsd.student_mode, teacher_mode=opsd.teacher_mode,
        tokenizer=tokenizer, eos_ids=eos_ids,
    )
    return report.summary()


# ----------------------------------------------------------------- teacher kinds (opsd.teacher)
def uses_reference_slot(opsd: OPSDConfig, *, lora: bool) -> bool:
    """Whether the teacher is a second copy in verl's reference slot (``Role.ActorRolloutRef``;
    ``TeacherKind.uses_reference_slot``)."""
    return opsd.teacher.kind_flags.uses_reference_slot(lora=lora)


def _check_teacher_kind(config, opsd: OPSDConfig, *, lora: bool) -> None:
    """Teacher-kind settings that cannot work, and the zero-loss setting, before Ray starts."""
    from recipe.opsd.core.teacher_kinds import TEACHER_KINDS, zero_loss_reason

    teacher, kind = opsd.teacher, opsd.teacher.kind_flags
    if lora and kind.needs_full_parameters:
        adapters = {True: " (adapters disabled)", False: " (adapters enabled)"}
        with_lora = " or ".join(name + adapters[other.lora_base_weights] for name, other in TEACHER_KINDS.items()
                                if not other.needs_full_parameters)
        raise ValueError(
            f"opsd.teacher.kind={teacher.kind} needs full-parameter training (a second full copy in verl's "
            f"reference slot); with LoRA use {with_lora}"
        )
    if kind.follows_student:
        dtype = config.actor_rollout_ref.ref.get("fsdp_config", {}).get("model_dtype", "fp32")
        if str(dtype) not in ("fp32", "float32"):
            raise ValueError(
                f"actor_rollout_ref.ref.fsdp_config.model_dtype must be fp32 with opsd.teacher.kind={teacher.kind} "
                f"(the EMA increments (1 - d) x (student - teacher) vanish in {dtype}), got {dtype!r}"
            )
    reason = zero_loss_reason(
        kind=teacher.kind, teacher_path=teacher.path, student_path=str(config.actor_rollout_ref.model.path),
        teacher_context=opsd.teacher_context, student_mode=opsd.student_mode, teacher_mode=opsd.teacher_mode,
        student_temperature=opsd.loss.student_temperature,
        teacher_temperature=opsd.loss.effective_teacher_temperature,
    )
    if reason is not None and not teacher.allow_zero_loss:
        raise ValueError(
            f"opsd.teacher: {reason}; give the teacher another checkpoint (opsd.teacher.kind=checkpoint "
            "opsd.teacher.path=...), context or mode, or set opsd.teacher.allow_zero_loss=true to run anyway"
        )


def check_teacher_checkpoint(opsd: OPSDConfig, *, student_path: str) -> None:
    """A teacher kind that ``loads_path``: the teacher model has the student's tokenizer and vocabulary
    size (``recipe.common.checkpoints.check_same_model`` on those keys; any architecture), before Ray
    starts. A Hub id not in the local Hugging Face cache is checked on the workers instead."""
    if not opsd.teacher.kind_flags.loads_path:
        return
    from recipe.common.checkpoints import check_model_dir, check_model_source, check_same_model
    from recipe.common.heads import local_checkpoint_dir
    from recipe.opsd.core.teacher_kinds import TEACHER_SAME_KEYS

    # a teacher path that is not a whole model directory: an InputError naming it, also when the sweep runner starts
    # this entry point directly (a Hub id is checked by the launcher, which knows whether it is a dry run)
    if str(opsd.teacher.path).startswith(("/", ".", "~")):
        check_model_source(str(opsd.teacher.path), offline=True)
    dirs = []
    for path in (student_path, opsd.teacher.path):
        try:
            dirs.append(local_checkpoint_dir(path))
        except FileNotFoundError:
            print(f"[opsd] note: {path} is not local yet; the teacher's tokenizer is checked on the workers")
            return
    if os.path.isdir(opsd.teacher.path):
        check_model_dir(opsd.teacher.path)
    check_same_model(dirs[0], dirs[1], keys=TEACHER_SAME_KEYS)


def check_ema_resume(opsd: OPSDConfig, *, resume_dir) -> None:
    """A teacher kind that ``follows_student``: the checkpoint a run resumes from holds the EMA teacher
    (``opsd_ema_teacher/``); one from another teacher kind would silently restart the teacher from the
    initial model."""
    if not opsd.teacher.kind_flags.follows_student or resume_dir is None:
        return
    from recipe.opsd.core.teacher_kinds import EMA_TEACHER_DIR

    if not os.path.isdir(os.path.join(resume_dir, EMA_TEACHER_DIR)):
        raise InputError(
            f"no {EMA_TEACHER_DIR}/ (the EMA teacher) in the checkpoint a run with "
            f"opsd.teacher.kind={opsd.teacher.kind} resumes from",
            file=resume_dir, hint="resume it with the teacher kind it was trained with, or start a new CKPT_DIR",
        )


def check_sft_solutions(opsd: OPSDConfig, *, train_files) -> None:
    """opsd.loss.sft_weight > 0: every row of the train parquet(s) has a non-empty
    ``extra_info.solution`` (the SFT target), before Ray starts; the first row without one is named.
    A file the driver cannot read here (remote) is left to the trainer, which names the row too."""
    if opsd.loss.sft_weight <= 0:
        return
    import pyarrow.parquet as pq

    from recipe.opsd.core.inputs import SOLUTION_FIELD

    for path in [train_files] if isinstance(train_files, str) else list(train_files):
        try:
            rows = pq.read_table(str(path), columns=["extra_info"]).column("extra_info").to_pylist()
        except (OSError, KeyError, ValueError):
            continue
        for number, info in enumerate(rows):
            text = (info or {}).get(SOLUTION_FIELD)
            if not isinstance(text, str) or not text.strip():
                raise InputError(
                    f"row {number} has no non-empty extra_info.{SOLUTION_FIELD}, the target of the SFT term "
                    f"(opsd.loss.sft_weight={opsd.loss.sft_weight})",
                    file=path, row=str((info or {}).get("id", number)),
                    hint="use a data set whose every row has a reference solution, or set opsd.loss.sft_weight=0",
                )


def _validate_verl_config(config, *, use_reference_policy: bool) -> None:
    """verl's own ``validate_config`` (as its TaskRunner runs it): batch sizes that do not divide
    across the GPUs, micro-batch settings, ... fail now instead of late. Its assertion messages
    become ValueErrors (one line, no traceback); its success line is not printed (a dry run's stdout
    is the config). Its vLLM LoRA-rank check imports vLLM: where vLLM is not installed (a GPU config
    composed on a CPU machine) that one check is left to the machine that runs the launch."""
    import contextlib
    import importlib.util
    import io

    from omegaconf import OmegaConf

    from verl.utils.config import validate_config

    model = config.actor_rollout_ref.model
    lora = model.get("lora_rank", 0) or model.get("lora", {}).get("rank", 0)
    if lora and config.actor_rollout_ref.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        config = OmegaConf.create(OmegaConf.to_container(config))
        with open_dict(config):
            config.actor_rollout_ref.model.lora_rank = 0
            if config.actor_rollout_ref.model.get("lora") is not None:
                config.actor_rollout_ref.model.lora.rank = 0
    try:
        # the teacher is verl's reference policy, unless it is the actor itself (live; LoRA frozen:
        # the actor with adapters disabled)
        with contextlib.redirect_stdout(io.StringIO()):
            validate_config(config=config, use_reference_policy=use_reference_policy, use_critic=False)
    except AssertionError as err:
        raise ValueError(f"verl's validate_config: {err}") from None
