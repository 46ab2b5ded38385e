"""Hydra entry point of the OPSD recipe (On-Policy Self-Distillation on verl 0.9.1).

    python -m recipe.opsd.main_opsd actor_rollout_ref.model.path=Qwen/Qwen3-1.7B \\
        data.train_files=train.parquet data.val_files=val.parquet opsd.teacher_context=answer_only

Usually launched by ``recipe/opsd/run_opsd.sh``. The start-up checks (``recipe.opsd.startup``) run before Ray
starts; the pre-flight gate's model-level part runs on the workers before the first rollout. Either failure
prints one line and exits with code 2. An ``async_training`` block runs the same step on verl's one-step-off or
fully-async trainer (``recipe.opsd.opsd_async_trainers``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import hydra
import ray
from omegaconf import OmegaConf, open_dict

from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_v0 import BaseTaskRunner

from recipe.async_rl.config import AsyncConfigError, apply_derived, async_settings
from recipe.opsd.core.nonfinite import NonFiniteTrainingError
from recipe.opsd.core.preflight import PreflightError
from recipe.opsd.startup import StartupError, preflight_error, prepare_config, startup_checks, uses_reference_slot


class OPSDTaskRunner(BaseTaskRunner):
    """Maps the actor/rollout/teacher role to the OPSD worker and runs ``RayOPSDTrainer``; a subclass may run
    a subclass of either (``trainer_class``, ``worker_base``)."""

    def trainer_class(self) -> type:
        """The synchronous trainer ``run`` builds: ``RayOPSDTrainer`` or a subclass of it."""
        from recipe.opsd.opsd_ray_trainer import RayOPSDTrainer

        return RayOPSDTrainer

    def worker_base(self, config) -> type:
        """The worker class the role's worker subclasses (``worker_class_for``): ``OPSDActorRolloutRefWorker``
        or a subclass of it."""
        from recipe.opsd.worker import OPSDActorRolloutRefWorker

        return OPSDActorRolloutRefWorker

    def run(self, config):
        from verl.single_controller.ray import RayWorkerGroup
        from verl.trainer.ppo.ray_trainer import Role
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        from recipe.opsd.worker import worker_class_for

        print(f"OPSD TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        OmegaConf.resolve(config)
        if async_settings(config, opsd=True) is not None:  # one_step_off (prepared before Ray)
            from recipe.opsd.opsd_async_trainers import run_opsd_one_step_off

            run_opsd_one_step_off(config)
            return
        opsd = prepare_config(config)
        lora = bool(config.actor_rollout_ref.model.get("lora_rank", 0) or config.actor_rollout_ref.model.get(
            "lora", {}
        ).get("rank", 0))
        # no second copy for live (the actor module) and LoRA frozen_initial (adapters disabled)
        role = Role.ActorRolloutRef if uses_reference_slot(opsd, lora=lora) else Role.ActorRollout
        worker_cls = worker_class_for(OmegaConf.to_container(config.opsd, resolve=True), base=self.worker_base(config))
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
        trainer = self.trainer_class()(
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
    run(config)


def run(config, *, runner: type = OPSDTaskRunner, checks=startup_checks) -> None:
    """The launch of ``config`` with ``runner`` (``OPSDTaskRunner`` or a subclass) after ``checks`` (``startup_checks``
    or a superset of them, raising ``StartupError``); a run with an ``async_training`` block gets its own runner."""
    try:  # every check before Ray starts (recipe.opsd.startup); the launcher ran them too
        startup = checks(config)
    except StartupError as err:
        print(err.line, file=sys.stderr)
        sys.exit(2)
    total = config.trainer.get("total_training_steps")
    saved = None if startup.resume_dir is None else int(Path(startup.resume_dir).name.removeprefix("global_step_"))
    if saved is not None and total is not None and saved >= int(total):
        # a relaunch of a finished run (the launcher says so before this; the sweep runner starts this module directly)
        print(f"[opsd] {Path(startup.resume_dir).parent} holds a finished run: its save step {saved} is the last "
              f"step (trainer.total_training_steps={total}); nothing to train", flush=True)
        return
    if startup.resume_note:  # the tracker's save is not whole (killed while saving): resume from the last whole one
        print(f"[opsd] WARNING: {startup.resume_note}", file=sys.stderr)
        with open_dict(config):
            config.trainer.resume_mode = "resume_path"
            config.trainer.resume_from_path = str(startup.resume_dir)
    if startup.preflight_line:
        print(startup.preflight_line)
    try:  # rollouts that overlap training: the verl values the mode derives, before Ray
        settings = async_settings(config, opsd=True)
        if settings is not None:
            prepare_config(config)
            print("\n".join(apply_derived(config, settings)), flush=True)
    except AsyncConfigError as err:
        print(err.line, file=sys.stderr)
        sys.exit(2)
    if settings is not None and settings.mode == "fully_async":
        from verl.experimental.reward_loop import migrate_legacy_reward_impl

        from recipe.opsd.opsd_async_trainers import OPSDAsyncTaskRunner

        config, runner = migrate_legacy_reward_impl(config), OPSDAsyncTaskRunner
    try:
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(runner))
    except NonFiniteTrainingError as err:  # Ray re-raises the trainer's error as a subclass of it
        print(f"[opsd] stopped: {getattr(err, 'cause', err)}", file=sys.stderr)
        sys.exit(3)
    except PreflightError as err:  # the workers' part of the gate (the none control), before the first rollout
        print(preflight_error(getattr(err, "cause", err)).line, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
