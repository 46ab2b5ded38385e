"""verl glue: verl 0.9.1's one-step-off and fully-async trainers with policy-version bookkeeping.

What is added to verl's own trainers (``verl.experimental.one_step_off_policy``,
``verl.experimental.fully_async_policy``), for GRPO (``recipe.async_rl.main_grpo``) and as the base of
the OPSD async trainers (``recipe.opsd.opsd_async_trainers``): versioned weight pushes and per-step lag
metrics (``VersionedOneStepOffTrainer``, ``VersionedFullyAsyncTrainer``), samples that keep their
prompt's ``extra_info`` (``InputsKeepingRollouter``: the OPSD teacher prompt is built from it), and task
runners with the trainer class as a parameter (``AsyncTaskRunner``, ``run_one_step_off``). Every
subclass, override and private name used: docs/verl_private_apis.md.
"""

from __future__ import annotations

import asyncio

import ray

from verl.experimental.fully_async_policy.fully_async_main import FullyAsyncTaskRunner
from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager, FullyAsyncRollouter
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.utils.debug import marked_timer

from recipe.async_rl.staleness import lag_metrics

# the classes verl decorated with @ray.remote, undecorated (to subclass them)
FullyAsyncTrainerBase = FullyAsyncTrainer.__ray_actor_class__
FullyAsyncRollouterBase = FullyAsyncRollouter.__ray_actor_class__
FullyAsyncTaskRunnerBase = FullyAsyncTaskRunner.__ray_actor_class__


def batch_lag_metrics(batch, *, policy_version: int) -> dict[str, float]:
    """``async/...`` lag metrics of a trained batch from the rollout's version labels (verl's
    ``min_global_steps`` / ``max_global_steps`` columns)."""
    return lag_metrics(policy_version=policy_version, min_versions=list(batch.non_tensor_batch["min_global_steps"]),
                       max_versions=list(batch.non_tensor_batch["max_global_steps"]))


class VersionedOneStepOffTrainer(OneStepOffRayTrainer):
    """verl's one-step-off trainer; pushes labelled with the update count; lag metrics per step.

    The weights pushed before step s hold s - 1 updates and are labelled so (verl labels them s, so its
    samples would read one version too new); every step logs the lag of each trained sample."""

    policy_version = 0  # updates applied to the trainer's weights

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        self.policy_version = self.global_steps  # a checkpoint of step s holds s updates
        return result

    def _fit_update_weights(self):
        with marked_timer("update_weights", self.timing_raw, color="red"):
            sync_metrics = self.checkpoint_manager.update_weights(self.policy_version)
        if sync_metrics:
            self.metrics.update(sync_metrics)

    def _fit_update_actor(self, batch):
        self.metrics.update(batch_lag_metrics(batch, policy_version=self.policy_version))
        batch = super()._fit_update_actor(batch)
        self.policy_version += 1
        return batch


class VersionedFullyAsyncTrainer(FullyAsyncTrainerBase):
    """verl's fully-async trainer (whose labels are already the update count, ``current_param_version``)
    with the lag metrics of every trained batch, every step's metrics logged at that step (verl logs a
    sync cycle's aggregate before the cycle's last step joins it, so each record holds the previous step
    and the run's last step is never logged), and a resumed run numbering its steps from the
    checkpoint's (verl's resume starts one step later)."""

    def _compute_old_log_prob(self, batch):
        # verl's method, called through a method of this importable class: Ray makes an actor class by wrapping
        # every inherited method and pickling the wrappers by value, and a method of verl's decorated class
        # cannot be pickled by reference (its module's name holds the Ray ActorClass), so the copy's
        # zero-argument super() would name a copy of verl's class: "super(type, obj): obj must be an instance".
        # Every such method of verl's undecorated actor classes is overridden here (tests/async_rl/test_trainers.py).
        return super()._compute_old_log_prob(batch)

    def _collect_metrics_from_samples(self, batch, metrics):
        super()._collect_metrics_from_samples(batch, metrics)
        metrics.update(batch_lag_metrics(batch, policy_version=self.current_param_version))

    def _fit_log_aggregated_training_metrics(self, rollout_reset_timing_raw: dict):
        self.metrics_aggregator.reset()  # the step's own record is logged by _fit_postprocess_step

    def _fit_postprocess_step(self):
        step = self.global_steps
        super()._fit_postprocess_step()
        self.logger.log(data=self.metrics, step=step)

    async def load_checkpoint(self):
        version = await super().load_checkpoint()
        # verl sets version * trigger + 1, then fit() adds 1: the first step would be numbered one too far
        self.global_steps = version * self.trigger_parameter_sync_step
        return version


class KeepInputsAgentLoopManager(FullyAsyncAgentLoopManager):
    """Fully-async agent loop whose output keeps the prompt's non-tensor columns it does not set
    (``extra_info``, ``reward_model``, ...: verl's agent loop drops them when the reward is computed in
    the loop, and the OPSD teacher prompt is built from ``extra_info``)."""

    async def generate_sequences_single(self, prompts):
        output = await super().generate_sequences_single(prompts)
        for key, values in prompts.non_tensor_batch.items():
            if key not in output.non_tensor_batch:
                output.non_tensor_batch[key] = values
        return output


class InputsKeepingRollouter(FullyAsyncRollouterBase):
    """verl's fully-async rollouter with ``KeepInputsAgentLoopManager`` (class swapped after verl built it)."""

    async def _init_async_rollout_manager(self):
        await super()._init_async_rollout_manager()
        if type(self.async_rollout_manager) is not FullyAsyncAgentLoopManager:
            raise TypeError(f"expected verl's FullyAsyncAgentLoopManager, got {type(self.async_rollout_manager)}")
        self.async_rollout_manager.__class__ = KeepInputsAgentLoopManager


class AsyncTaskRunner(FullyAsyncTaskRunnerBase):
    """verl's fully-async task runner with the trainer / rollouter classes as parameters.

    ``trainer_cls`` / ``rollouter_cls``: undecorated classes (made Ray actors here, with verl's
    resources); ``role_worker_mapping(config)``: the trainer's workers (default: verl's);
    ``trainer_kwargs(config)``: extra constructor arguments of the trainer.
    """

    trainer_cls = VersionedFullyAsyncTrainer
    rollouter_cls = FullyAsyncRollouterBase

    def role_worker_mapping(self, config) -> dict:
        return self.components["role_worker_mapping"]

    def trainer_kwargs(self, config) -> dict:
        return {}

    def _create_trainer(self, config) -> None:
        from verl.experimental.separation.utils import create_resource_pool_manager
        from verl.trainer.ppo.utils import Role

        set_schedule_length(config)

        mapping = {role: cls for role, cls in self.role_worker_mapping(config).items() if role != Role.Rollout}
        trainer = ray.remote(num_cpus=1)(self.trainer_cls).remote(
            config=config, tokenizer=self.components["tokenizer"], role_worker_mapping=mapping,
            resource_pool_manager=create_resource_pool_manager(config, roles=list(mapping.keys())),
            ray_worker_group_cls=self.components["ray_worker_group_cls"], device_name=config.trainer.device,
            **self.trainer_kwargs(config),
        )
        ray.get(trainer.init_workers.remote())
        self.components["trainer"] = trainer

    def _create_rollouter(self, config) -> None:
        rollouter = ray.remote(num_cpus=1, max_concurrency=100)(self.rollouter_cls).remote(
            config=config, tokenizer=self.components["tokenizer"], processor=self.components["processor"],
            device_name=config.trainer.device,
        )
        if "hybrid_worker_group" in self.components:
            ray.get(rollouter.set_hybrid_worker_group.remote(self.components["hybrid_worker_group"]))
        ray.get(rollouter.init_workers.remote())
        ray.get(rollouter.set_max_required_samples.remote())
        self.components["rollouter"] = rollouter

    def _run_training_loop(self):
        """Run rollouter and trainer; the trainer's end (its last step or a stop) ends the run, rollouter
        included (verl's waits for the rollouter, which a trainer that stops early leaves paused forever).
        A rollouter error ends it too; a rollouter that finishes first leaves the trainer to drain the queue."""
        rollouter, trainer = self.components["rollouter"].fit.remote(), self.components["trainer"].fit.remote()
        try:
            done, _ = ray.wait([rollouter, trainer], num_returns=1)
            if rollouter in done:
                ray.get(rollouter)  # raises the rollouter's error
            ray.get(trainer)
        finally:
            ray.cancel(rollouter)
            asyncio.run(self.components["message_queue_client"].clear_queue())


def set_schedule_length(config) -> None:
    """Give the optimizers' learning-rate schedules the run's step count before the trainer builds its workers.

    verl's fully-async main passes the step count to the trainer (``set_total_train_steps``) only after the
    trainer built its workers, whose schedulers were then made with ``optim.total_training_steps=-1``: a
    constant learning rate at the peak, no warmup, no decay (a toy-world run at 1e-3 throughout ended 58
    points below the synchronous one). The synchronous trainer sets it before (``RayPPOTrainer._create_dataloader``);
    this does the same from ``trainer.total_training_steps``.
    """
    from omegaconf import OmegaConf, open_dict

    steps = OmegaConf.select(config, "trainer.total_training_steps")
    if steps is None:
        return
    with open_dict(config):
        for key in ("actor_rollout_ref.actor.optim", "critic.optim"):
            if OmegaConf.select(config, key) is not None:
                OmegaConf.select(config, key).total_training_steps = int(steps)


def run_one_step_off(config, *, trainer_cls, role_worker_mapping: dict, **trainer_kwargs) -> None:
    """Build the datasets and ``trainer_cls`` (a ``VersionedOneStepOffTrainer``) on verl's separate
    training and rollout pools, and run it (as verl's ``OneStepTaskRunner.run`` does)."""
    from verl.experimental.separation.utils import create_resource_pool_manager
    from verl.single_controller.ray import RayWorkerGroup
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.fs import copy_to_local

    model = config.actor_rollout_ref.model
    local_path = copy_to_local(model.path, use_shm=model.get("use_shm", False))
    trust_remote_code = config.data.get("trust_remote_code", False)
    tokenizer = hf_tokenizer(local_path, trust_remote_code=trust_remote_code)
    processor = hf_processor(local_path, trust_remote_code=trust_remote_code, use_fast=True)
    train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor,
                                      max_samples=config.data.get("train_max_samples", -1))
    val_dataset = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor,
                                    max_samples=config.data.get("val_max_samples", -1))
    trainer = trainer_cls(
        config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=role_worker_mapping,
        resource_pool_manager=create_resource_pool_manager(config, role_worker_mapping.keys()),
        ray_worker_group_cls=RayWorkerGroup, train_dataset=train_dataset, val_dataset=val_dataset,
        collate_fn=collate_fn, train_sampler=create_rl_sampler(config.data, train_dataset),
        device_name=config.trainer.device, **trainer_kwargs,
    )
    trainer.init_workers()
    asyncio.run(trainer.fit())


__all__ = ["AsyncTaskRunner", "InputsKeepingRollouter", "KeepInputsAgentLoopManager",
           "VersionedFullyAsyncTrainer", "VersionedOneStepOffTrainer", "batch_lag_metrics", "run_one_step_off",
           "set_schedule_length"]
