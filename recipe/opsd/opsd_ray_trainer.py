"""OPSD trainer: verl's legacy ``RayPPOTrainer`` with the PPO step replaced by the OPSD step.

What differs from PPO is the step (``recipe.opsd.opsd_step.OPSDStepMixin``: teacher inputs, loss
positions, task / SFT extras, the update with the teacher forward inside, the collapse monitor,
the checkpoint extras); everything else -- dataloader and its resumable state, agent-loop rollout,
weight sync to the rollout servers, validation, checkpoints, logging -- is verl's. The same step
runs on verl's one-step-off and fully-async trainers (``recipe.opsd.opsd_async_trainers``).
"""

from __future__ import annotations

import uuid
from pprint import pprint

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask, compute_spec_decode_metrics
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.skip.skip_manager import SkipManager
from verl.utils.tracking import Tracking

from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.opsd_step import MONITOR_STATE_FILE, OPSDStepMixin

__all__ = ["MONITOR_STATE_FILE", "RayOPSDTrainer"]


class RayOPSDTrainer(OPSDStepMixin, RayPPOTrainer):
    def __init__(self, *args, opsd_config: OPSDConfig, **kwargs):
        super().__init__(*args, **kwargs)
        # the teacher is verl's reference policy (ActorRolloutRef worker; LoRA: the actor, adapters
        # off), except for a teacher that is no second copy: the actor module itself, no reference slot
        self.use_reference_policy = opsd_config.teacher.kind_flags.second_copy or self.ref_in_actor
        self.use_critic = False
        self.use_rm = False
        self._init_opsd(opsd_config)

    def _training_batches(self, current_epoch: int):
        """``(epoch, batch_dict)`` of every step: verl's epochs over the dataloader."""
        for epoch in range(current_epoch, self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                yield epoch, batch_dict

    def _after_step(self, stop: bool, metrics: dict) -> bool:
        """Whether the run stops after this step's OPSD step (before its checkpoint and logging): ``stop`` as the
        step said. A subclass may add to ``metrics`` or end a segment of the run instead of the run."""
        return stop

    def fit(self):
        """verl 0.9.1's ``RayPPOTrainer.fit`` with the PPO step replaced by the OPSD step. Also differs: the
        pre-flight divergence before the first rollout, a run that the collapse monitor stopped or that finished
        is not trained again, a stop ends the run; the batches come from ``_training_batches`` and each step's
        stop goes through ``_after_step``."""
        if self._dump_executor._shutdown:
            self._init_dump_executor()
        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        # logged with every step: a step logged by an earlier launch above this one was replayed
        resumed_from_step = self.global_steps
        if self._stopped_by_monitor() or self._finished_run():
            self._shutdown_dump_executor()
            return
        # the pre-flight gate's model-level part (opsd.diagnostics.preflight): before the first rollout and update
        preflight_metrics = self._preflight_divergence() if self.opsd.diagnostics.preflight else {}
        self.checkpoint_manager.update_weights(self.global_steps)
        current_epoch = self.global_steps // len(self.train_dataloader)
        SkipManager.init(self.config)

        if self.config.trainer.get("val_before_train", True) and self.val_dataset is not None:
            val_metrics = self._validate()
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                self._shutdown_dump_executor()
                return

        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="OPSD")
        batches = self._training_batches(current_epoch)
        self.global_steps += 1
        if preflight_metrics:  # logged with the launch's first step (readers merge a step's records)
            logger.log(data=preflight_metrics, step=self.global_steps)
        self.max_steps_duration = 0
        SkipManager.set_step(self.global_steps)
        profile_steps = self.config.global_profiler.steps
        prev_step_profile = False
        curr_step_profile = self.global_steps in profile_steps if profile_steps is not None else False
        rollout_n = self.config.actor_rollout_ref.rollout.n
        for epoch, batch_dict in batches:
            if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
            metrics, timing_raw = {}, {}
            with marked_timer("start_profile", timing_raw):
                self._start_profiling(
                    not prev_step_profile and curr_step_profile
                    if self.config.global_profiler.profile_continuous_steps
                    else curr_step_profile
                )
            is_last_step = self.global_steps >= self.total_training_steps
            batch = DataProto.from_single_dict(batch_dict)
            batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
            batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
            gen_batch = self._get_gen_batch(batch)
            gen_batch.meta_info["global_steps"] = self.global_steps
            gen_batch = gen_batch.repeat(repeat_times=rollout_n, interleave=True)

            with marked_timer("step", timing_raw):
                with marked_timer("gen", timing_raw, color="red"):
                    if curr_step_profile:
                        self.llm_server_manager.start_profile()
                    gen_output = self.async_rollout_manager.generate_sequences(gen_batch)
                    self.checkpoint_manager.sleep_replicas()
                    if curr_step_profile:
                        self.llm_server_manager.stop_profile()
                    timing_raw.update(gen_output.meta_info.pop("timing", {}))
                batch = batch.repeat(repeat_times=rollout_n, interleave=True).union(gen_output)
                if "response_mask" not in batch.batch.keys():
                    batch.batch["response_mask"] = compute_response_mask(batch)
                if self.config.trainer.balance_batch:
                    self._balance_batch(batch, metrics=metrics)
                batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()

                metrics.update({"training/epoch": epoch, "training/resumed_from_step": resumed_from_step})
                stop = self._opsd_step(batch, metrics=metrics, timing_raw=timing_raw)
                stop = self._after_step(stop, metrics)
                esi_close_to_expiration = should_save_ckpt_esi(
                    max_steps_duration=self.max_steps_duration,
                    redundant_time=self.config.trainer.esi_redundant_time,
                )
                if self.config.trainer.save_freq > 0 and (
                    is_last_step
                    or stop
                    or self.global_steps % self.config.trainer.save_freq == 0
                    or esi_close_to_expiration
                ):
                    if esi_close_to_expiration:
                        print("Force saving checkpoint: ESI instance expiration approaching.")
                    with marked_timer("save_checkpoint", timing_raw, color="green"):
                        self._save_checkpoint()
                with marked_timer("update_weights", timing_raw, color="red"):
                    self.checkpoint_manager.update_weights(self.global_steps)

                rollout_data_dir = self.config.trainer.get("rollout_data_dir", None)
                if rollout_data_dir:
                    self._log_rollouts(batch, timing_raw, rollout_data_dir)

            if self.config.trainer.test_freq > 0 and (
                is_last_step or self.global_steps % self.config.trainer.test_freq == 0
            ):
                with marked_timer("testing", timing_raw, color="green"):
                    metrics.update(self._validate())

            with marked_timer("stop_profile", timing_raw):
                next_step_profile = self.global_steps + 1 in profile_steps if profile_steps is not None else False
                self._stop_profiling(
                    curr_step_profile and not next_step_profile
                    if self.config.global_profiler.profile_continuous_steps
                    else curr_step_profile,
                    run_command=bool(
                        curr_step_profile and profile_steps
                        and (self.global_steps == max(profile_steps) or is_last_step)
                    ),
                )
                prev_step_profile, curr_step_profile = curr_step_profile, next_step_profile
            self.max_steps_duration = max(self.max_steps_duration, timing_raw["step"])

            metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
            metrics.update(compute_throughout_metrics(
                batch=batch, timing_raw=timing_raw, n_gpus=self.resource_pool_manager.get_n_gpus()
            ))
            metrics.update(compute_spec_decode_metrics(
                *(batch.non_tensor_batch.get(f"spec_num_{k}") for k in ("draft_tokens", "accepted_tokens", "verify_steps"))
            ))
            if self.config.trainer.get("log_fingerprints", False):
                metrics.update(self._param_checksum_metrics())
                metrics.update(self._data_fingerprint(batch))
            logger.log(data=metrics, step=self.global_steps)
            progress_bar.update(1)
            self.global_steps += 1
            SkipManager.set_step(self.global_steps)
            if is_last_step or stop:
                if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                    self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=True)
                self._shutdown_dump_executor()
                progress_bar.close()
                self._finish_run(stop=stop)
                return
            if hasattr(self.train_dataset, "on_batch_end"):
                self.train_dataset.on_batch_end(batch=batch)
        self._shutdown_dump_executor()

