"""Hydra entry point of the OPSD recipe (On-Policy Self-Distillation on verl 0.9.1).

    python -m recipe.opsd.main_opsd actor_rollout_ref.model.path=Qwen/Qwen3-1.7B \\
        data.train_files=train.parquet data.val_files=val.parquet opsd.teacher_context=answer_only

Usually launched by ``recipe/opsd/run_opsd.sh``. Before Ray starts any worker: the installed verl
is checked to be the version the glue was written against, the ``opsd:`` block is validated
(``recipe.opsd.config.OPSDConfig``), verl's own ``validate_config`` runs (batch sizes that do not
divide across the GPUs fail here), settings that would silently bypass the OPSD forward are
refused, and the student's chat-template mode is wired into verl's dataset
(``data.apply_chat_template_kwargs.enable_thinking``).
"""

from __future__ import annotations

import os
import socket
import sys

import hydra
import ray
from omegaconf import OmegaConf, open_dict

from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_v0 import BaseTaskRunner

from recipe.common.checkpoints import check_training_inputs, choose_resume_dir
from recipe.common.cli import InputError
from recipe.opsd.config import OPSDConfig
from recipe.opsd.nonfinite import NonFiniteTrainingError

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
    if lora_rank <= 0 and config.actor_rollout_ref.ref.strategy != "fsdp2":
        raise ValueError(
            f"actor_rollout_ref.ref.strategy must be fsdp2 for OPSD (it holds the teacher), "
            f"got {config.actor_rollout_ref.ref.strategy!r}"
        )
    if config.actor_rollout_ref.model.get("use_fused_kernels", False):
        raise ValueError(
            "actor_rollout_ref.model.use_fused_kernels must be False for OPSD: verl's fused kernels replace the "
            "model's forward, so the OPSD loss computed in place of the lm_head would never run (the OPSD loss is "
            "already fused with the lm_head: recipe.opsd.losses.fused_linear_weighted_divergence)"
        )
    _validate_verl_config(config, lora=lora_rank > 0)
    kwargs = dict(config.data.get("apply_chat_template_kwargs") or {})
    enable_thinking = opsd.student_enable_thinking
    if "enable_thinking" in kwargs and (enable_thinking is None or bool(kwargs["enable_thinking"]) != enable_thinking):
        raise ValueError(
            f"data.apply_chat_template_kwargs.enable_thinking={kwargs['enable_thinking']} contradicts "
            f"opsd.student_mode={opsd.student_mode!r} (null = the template's native mode, no switch); "
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
    if opsd.loss.position_kind in ("he", "le") and (
        actor.ppo_mini_batch_size != config.data.train_batch_size or actor.get("ppo_epochs", 1) != 1
    ):
        print(
            f"[opsd] note: opsd.loss.positions={opsd.loss.positions!r} ranks positions by the student entropy of "
            "each update's own forward; with several updates per batch (ppo_mini_batch_size < train_batch_size "
            "or ppo_epochs > 1) later updates rank by the partly updated student, not the rollout policy"
        )
    return opsd


def _validate_verl_config(config, *, lora: bool) -> None:
    """verl's own ``validate_config`` (as its TaskRunner runs it): batch sizes that do not divide
    across the GPUs, micro-batch settings, ... fail now instead of late. Its assertion messages
    become ValueErrors (one line, no traceback)."""
    from verl.utils.config import validate_config

    try:
        # the teacher is verl's reference policy (LoRA: the actor with adapters disabled)
        validate_config(config=config, use_reference_policy=not lora, use_critic=False)
    except AssertionError as err:
        raise ValueError(f"verl's validate_config: {err}") from None


class OPSDTaskRunner(BaseTaskRunner):
    """Maps the actor/rollout/teacher role to the OPSD worker and runs ``RayOPSDTrainer``."""

    def run(self, config):
        from verl.single_controller.ray import RayWorkerGroup
        from verl.trainer.ppo.ray_trainer import Role
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer
        from recipe.opsd.teacher_worker import worker_class_for

        print(f"OPSD TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        OmegaConf.resolve(config)
        opsd = prepare_config(config)
        lora = bool(config.actor_rollout_ref.model.get("lora_rank", 0) or config.actor_rollout_ref.model.get(
            "lora", {}
        ).get("rank", 0))
        # LoRA: no second copy, the teacher is the actor with its adapters disabled
        role = Role.ActorRollout if lora else Role.ActorRolloutRef
        worker_cls = worker_class_for(OmegaConf.to_container(config.opsd, resolve=True))
        self.role_worker_mapping[role] = ray.remote(worker_cls)
        self.mapping[role] = "global_pool"

        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        train_dataset = create_rl_dataset(
            config.data.train_files, config.data, tokenizer, processor, is_train=True,
            max_samples=config.data.get("train_max_samples", -1),
        )
        val_dataset = create_rl_dataset(
            config.data.val_files, config.data, tokenizer, processor, is_train=False,
            max_samples=config.data.get("val_max_samples", -1),
        )
        trainer = RayOPSDTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=RayWorkerGroup,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
            opsd_config=opsd,
        )
        trainer.init_workers()
        trainer.fit()


@hydra.main(config_path="config", config_name="opsd_trainer", version_base=None)
def main(config):
    try:
        check_verl_version()
    except ValueError as err:
        print(f"[opsd] wrong verl version: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        prepare_config(config)  # fail on a bad opsd block before Ray starts
    except ValueError as err:  # a config mistake: the message names the field, no traceback
        print(f"[opsd] invalid config: {err}", file=sys.stderr)
        sys.exit(2)
    try:  # the model directory and the checkpoint a run would resume from, before Ray starts
        trainer = config.trainer
        resume_dir, fallback = choose_resume_dir(
            resume_mode=trainer.resume_mode, default_local_dir=trainer.default_local_dir,
            resume_from_path=trainer.get("resume_from_path"),
        )
        check_training_inputs(model_path=config.actor_rollout_ref.model.path, resume_dir=resume_dir)
    except InputError as err:  # names the file and what is wrong with it, no traceback
        print(f"[opsd] {err}", file=sys.stderr)
        sys.exit(2)
    if fallback:  # the tracker's save is not whole (killed while saving): resume from the last whole one
        print(f"[opsd] WARNING: {fallback}", file=sys.stderr)
        with open_dict(config):
            config.trainer.resume_mode = "resume_path"
            config.trainer.resume_from_path = str(resume_dir)
    try:
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(OPSDTaskRunner))
    except NonFiniteTrainingError as err:  # Ray re-raises the trainer's error as a subclass of it
        print(f"[opsd] stopped: {getattr(err, 'cause', err)}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
