"""OPSD on verl's async trainers: the OPSD step on verl's one-step-off and fully-async loops (verl glue).

    bash recipe/opsd/run_opsd.sh +experiment=async_one_step_off      # or +experiment=async_fully

The rollout runs on its own resource pool; the training pool holds the OPSD worker (actor and frozen teacher
in one process per rank, as in the synchronous trainer), so the teacher scores each sample's exact tokens
whatever policy version produced them and only the student side is off-policy: the OPSD loss takes no
off-policy correction. The weight push between the pools is verl's checkpoint engine (on the CPU:
``recipe.cpu.checkpoint_engine``); every step logs each sample's policy-version lag (``async/lag_*``).
``OPSDOneStepOffTrainer``, ``OPSDFullyAsyncTrainer`` and their task runners (``OPSDAsyncTaskRunner``,
``run_opsd_one_step_off``) are what ``main_opsd`` starts.
"""

from __future__ import annotations

import asyncio
import os

import ray
from omegaconf import OmegaConf
from tqdm import tqdm

from verl.experimental.fully_async_policy.fully_async_trainer import TrainingStopException
from verl.trainer.ppo.metric_utils import compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.utils import Role
from verl.utils.debug import marked_timer

from recipe.async_rl.trainers import (
    AsyncTaskRunner,
    InputsKeepingRollouter,
    VersionedFullyAsyncTrainer,
    VersionedOneStepOffTrainer,
    batch_lag_metrics,
    run_one_step_off,
)
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.opsd_step import OPSDStepMixin


def _lora(config) -> bool:
    model = config.actor_rollout_ref.model
    return bool(model.get("lora_rank", 0) or (model.get("lora") or {}).get("rank", 0))


def worker_role(config, opsd: OPSDConfig) -> str:
    """verl's role string of the OPSD worker on the training pool: actor + teacher in the reference slot,
    or the actor alone (teacher kind live, LoRA frozen_initial). It includes ``rollout`` because verl's
    worker accepts no ``actor_ref``: the rollout adapter it builds stays unused (the weights go to the
    rollout pool through the checkpoint engine)."""
    from recipe.opsd.startup import uses_reference_slot

    return "actor_rollout_ref" if uses_reference_slot(opsd, lora=_lora(config)) else "actor_rollout"


def opsd_worker_mapping(config) -> dict:
    """``{Role.Actor: the OPSD worker}``: the one worker group of the training pool."""
    from recipe.opsd.worker import worker_class_for

    return {Role.Actor: ray.remote(worker_class_for(OmegaConf.to_container(config.opsd, resolve=True)))}


class SeparatePoolsOPSD(OPSDStepMixin):
    """The OPSD step on a separated trainer: the OPSD worker in verl's ``Role.Actor`` slot of the
    training pool, with the role string that builds its teacher; no reference, critic or reward group."""

    stale_samples = True

    def _init_separated_opsd(self, opsd: OPSDConfig) -> None:
        self.use_reference_policy, self.use_critic, self.use_rm = False, False, False
        self.opsd_worker_role = worker_role(self.config, opsd)
        self.resumed_from_step = 0
        self.stopped = False
        self._init_opsd(opsd)

    def _create_actor_rollout_classes(self):
        from verl.single_controller.ray import RayClassWithInitArgs

        pool = self.resource_pool_manager.get_resource_pool(Role.Actor)
        self.resource_pool_to_cls[pool][str(Role.Actor)] = RayClassWithInitArgs(
            cls=self.role_worker_mapping[Role.Actor], config=self.config.actor_rollout_ref, role=self.opsd_worker_role
        )

    def _step_metrics(self, batch) -> dict:
        metrics = compute_timing_metrics(batch=batch, timing_raw=self.timing_raw)
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=self.timing_raw,
                                                  n_gpus=self.resource_pool_manager.get_n_gpus()))
        if self.config.trainer.get("log_fingerprints", False):
            metrics.update(self._param_checksum_metrics())
            metrics.update(self._data_fingerprint(batch))
        return metrics


class OPSDOneStepOffTrainer(SeparatePoolsOPSD, VersionedOneStepOffTrainer):
    """OPSD on verl's one-step-off trainer: ``OPSDStepMixin`` on ``recipe.async_rl.trainers.VersionedOneStepOffTrainer``
    (verl's ``OneStepOffRayTrainer``, the rollout on verl's standalone rollout replicas, ``rollout.*``): its
    ``fit`` / ``fit_step`` are verl's with the PPO stages replaced by ``_opsd_step`` (and the pre-flight gate,
    a resumed run's monitor stop, the stop of a step)."""

    def __init__(self, *args, opsd_config: OPSDConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_dump_executor()
        self._init_separated_opsd(opsd_config)

    async def fit(self):
        """verl's ``OneStepOffRayTrainer.fit`` plus the OPSD start: a resumed run's monitor stop, the
        pre-flight gate before the first weight push."""
        from verl.utils.tracking import Tracking

        self.logger = Tracking(project_name=self.config.trainer.project_name,
                               experiment_name=self.config.trainer.experiment_name,
                               default_backend=self.config.trainer.logger,
                               config=OmegaConf.to_container(self.config, resolve=True))
        self.global_steps = 0
        self._load_checkpoint()
        self.resumed_from_step = self.global_steps
        if self._stopped_by_monitor() or self._finished_run():
            return
        preflight_metrics = self._preflight_divergence() if self.opsd.diagnostics.preflight else {}
        self._fit_update_weights()
        if self.config.trainer.get("val_before_train", True) and self.val_dataset is not None:
            self.logger.log(data=self._validate(), step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                return
        self.progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="OPSD one-step-off")
        self.global_steps += 1
        if preflight_metrics:
            self.logger.log(data=preflight_metrics, step=self.global_steps)
        self.last_val_metrics, self.max_steps_duration = None, 0
        steps = self.config.global_profiler.steps
        self.prev_step_profile, self.next_step_profile = False, False
        self.curr_step_profile = steps is not None and self.global_steps in steps
        continuous_iterator = self._create_continuous_iterator()
        future = asyncio.create_task(self._async_gen_next_batch(continuous_iterator))
        while future is not None and not self.is_last_step:
            future = await self.fit_step(future, continuous_iterator)
        self._shutdown_dump_executor()
        self._finish_run(stop=self.stopped)

    async def fit_step(self, batch_data_future, continuous_iterator):
        """verl's ``OneStepOffRayTrainer.fit_step`` with the OPSD step in place of the PPO stages."""
        self.metrics = {"training/epoch": self.epoch, "training/resumed_from_step": self.resumed_from_step}
        self.timing_raw = {}
        self._fit_prepare_step()
        self._fit_start_profile()
        with marked_timer("step", self.timing_raw):
            # the next rollout starts inside, right after this step's batch arrived and the weights were pushed
            batch, batch_data_future = await self._fit_generate(batch_data_future, continuous_iterator)
            await asyncio.sleep(0)
            self.metrics.update(batch_lag_metrics(batch, policy_version=self.policy_version))
            self.stopped = self._opsd_step(batch, metrics=self.metrics, timing_raw=self.timing_raw)
            self.policy_version += 1
        self.is_last_step = self.is_last_step or self.stopped
        self._fit_validate()
        self._fit_save_checkpoint()
        self._fit_stop_profile()
        self.metrics.update(self._step_metrics(batch))
        self._fit_postprocess_step()
        return None if self.is_last_step else batch_data_future


class OPSDFullyAsyncTrainer(SeparatePoolsOPSD, VersionedFullyAsyncTrainer):
    """OPSD on verl's fully-async trainer: the same as ``OPSDOneStepOffTrainer`` on
    ``VersionedFullyAsyncTrainer`` (verl's ``FullyAsyncTrainer``, samples from verl's message queue), with
    ``InputsKeepingRollouter`` on the rollout side. Steps and checkpoints count weight versions
    (``trigger_parameter_sync_step`` = 1: one version per optimizer step)."""

    def __init__(self, config, tokenizer, role_worker_mapping, resource_pool_manager, ray_worker_group_cls,
                 device_name=None):
        from verl.trainer.ppo.utils import create_rl_dataset

        super().__init__(config, tokenizer, role_worker_mapping, resource_pool_manager, ray_worker_group_cls,
                         device_name)
        # the rollouter owns the data loader; the trainer reads the first rows for the pre-flight gate
        self.train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None,
                                               max_samples=config.data.get("train_max_samples", -1))
        self.total_training_steps = int(config.trainer.total_training_steps)
        self._init_separated_opsd(OPSDConfig.from_hydra(config.opsd))

    def set_total_train_steps(self, total_training_steps):
        super().set_total_train_steps(total_training_steps)
        self.total_training_steps = int(total_training_steps)

    def _checkpoint_folder(self, version: int) -> str:
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path" and version == self.resumed_from_step:
            folder = trainer.resume_from_path
        else:
            folder = os.path.join(trainer.default_local_dir, f"global_step_{version}")
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _save_checkpoint(self):
        """verl's fully-async checkpoint of the current weight version, plus the OPSD state."""
        self._save_opsd_state(self._checkpoint_folder(self.current_param_version))
        VersionedFullyAsyncTrainer._save_checkpoint(self)

    async def load_checkpoint(self):
        version = await super().load_checkpoint()  # global_steps = version: fit() then trains step version + 1
        self.resumed_from_step = version
        if version:
            self._load_opsd_state(self._checkpoint_folder(version))
        return version

    async def fit(self):
        """verl's ``FullyAsyncTrainer.fit`` plus the OPSD start and end (the trainer stops after
        ``trainer.total_training_steps`` steps or when the monitor / non-finite guard asks)."""
        if self._stopped_by_monitor():
            return
        preflight_metrics = self._preflight_divergence() if self.opsd.diagnostics.preflight else {}
        self.max_steps_duration = 0
        self.global_steps += 1
        if preflight_metrics:
            self.logger.log(data=preflight_metrics, step=self.global_steps)
        self.prev_step_profile = self.curr_step_profile = self.next_step_profile = False
        while True:
            try:
                await self.fit_step()
            except TrainingStopException:
                break
        self.progress_bar.close()
        self._fit_save_checkpoint(force=True)
        self._finish_run(stop=self.stopped)

    async def fit_step(self, batch_dict=None):
        """One step: samples from the queue (lag metrics), the OPSD step, the weight push that lets the
        rollout go on, a checkpoint when due; logged at the new weight version."""
        self.metrics = {"training/resumed_from_step": self.resumed_from_step}
        self.timing_raw = {}
        with marked_timer("step", self.timing_raw):
            batch = await self._fit_generate(None)
            self.stopped = self._opsd_step(batch, metrics=self.metrics, timing_raw=self.timing_raw)
            self._fit_update_local_step()
            await self._fit_update_weights()
        last = self.stopped or self.current_param_version >= self.total_training_steps
        self._fit_save_checkpoint(force=last)
        self.metrics.update(self._step_metrics(batch))
        self.logger.log(data=self.metrics, step=self.current_param_version)
        self.global_steps += 1
        self.progress_bar.update(1)
        if last:
            raise TrainingStopException("OPSD: last step" if not self.stopped else "OPSD: stopped")


class OPSDAsyncTaskRunner(AsyncTaskRunner):
    """verl's fully-async task runner with the OPSD trainer, worker and rollouter."""

    trainer_cls = OPSDFullyAsyncTrainer
    rollouter_cls = InputsKeepingRollouter

    def role_worker_mapping(self, config) -> dict:
        return opsd_worker_mapping(config)


def run_opsd_one_step_off(config) -> None:
    """The one-step-off run (inside the task runner; ``config`` prepared before Ray)."""
    run_one_step_off(config, trainer_cls=OPSDOneStepOffTrainer, role_worker_mapping=opsd_worker_mapping(config),
                     opsd_config=OPSDConfig.from_hydra(config.opsd))
