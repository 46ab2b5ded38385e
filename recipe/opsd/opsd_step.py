"""The OPSD step on a rolled-out batch, shared by every OPSD trainer (verl glue).

``OPSDStepMixin`` holds what an OPSD step does after verl's rollout, whichever verl trainer drives the loop
(``recipe.opsd.opsd_ray_trainer``, ``recipe.opsd.opsd_async_trainers``): no reward for training, no
advantage, critic, KL-to-ref or old log-probs; each sample's teacher input built at the token level
(``core.inputs.TeacherInputs``), the loss positions, what the objective asks for (a reference-only teacher
input, per-step values, task advantages, SFT rows), the update with the teacher forward inside
(``worker.OPSDActorRolloutRefWorker.update_actor``, ``actor_loss.opsd_loss``), then the rollout metrics,
the collapse monitor and the non-finite guard. The rollout reward is only logged unless the objective uses
it (docs/core_math.md, "Objectives", task reward). The step and what a trainer using the mixin owns:
``OPSDStepMixin``.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from verl import DataProto
from verl.trainer.ppo.reward import extract_reward
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from recipe.opsd.actor_loss import (
    OLD_LOG_PROBS_KEY,
    SFT_INPUT_FIELDS,
    SFT_INPUT_PREFIX,
    STEP_VALUE_PREFIX,
    TASK_ADVANTAGES_KEY,
)
from recipe.opsd.core import nonfinite
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd.core.inputs import TeacherInputs
from recipe.opsd.core.monitor import TrainingCollapseError, TrainingDynamicsMonitor
from recipe.opsd.core.objectives.base import needs_behaviour_log_probs
from recipe.opsd.engine import OPSD_FORWARD_KEY, RESPONSE_LENGTHS_KEY
from recipe.opsd.worker import (
    REFERENCE_INPUT_PREFIX,
    TEACHER_FINGERPRINT_KEY,
    TEACHER_INPUT_FIELDS,
    TEACHER_INPUT_PREFIX,
    TEACHER_TIME_METRIC,
)

# the collapse monitor's state, saved next to verl's data.pt in every global_step_<s>/ folder
MONITOR_STATE_FILE = "opsd_monitor.json"


class OPSDStepMixin:
    """The OPSD step; mixed in before a verl trainer class (the synchronous ``RayPPOTrainer`` or verl's
    one-step-off and fully-async trainers).

    - no reward for training, no advantage, no critic, no KL-to-ref, no old log-probs;
    - every sample's teacher input is built at the token level: its teacher prompt
      (``prompts.build_prompt_pair(opsd.teacher_context, extra_info)`` rendered by
      ``chat.render_ids`` in ``opsd.teacher_mode``, at most ``opsd.teacher_max_prompt_length`` tokens)
      followed by the student's response ids (``chat.splice_teacher_inputs``: never decoded, no pad in
      between);
    - the teacher inputs travel with the actor batch; inside ``update_actor`` each worker runs the
      frozen teacher on its own rows and keeps its final hidden states at the response positions
      (``worker.OPSDActorRolloutRefWorker.update_actor``; for ``advt:K`` the loss positions come
      from the teacher's rank of each sampled token there), the other loss positions are selected here
      (``positions.select_positions``; ``he:Q`` / ``le:Q`` are ranked by the student entropy inside the
      actor's loss, see ``recipe.opsd.actor_loss``), and the actor is updated with
      ``recipe.opsd.actor_loss.opsd_loss``;
    - what the objective asks for (``recipe.opsd.core.objectives``): a second teacher input on the
      reference-only prompt (``prompts.reference_only_messages``: the teacher prompt without the
      question, ``needs_reference_forward``) and the step's values (``step_values`` over
      ``trainer.total_training_steps``, e.g. beta-OPSD's teacher weight) go to the actor;
    - after the update: the rollout metrics, the collapse monitor and the non-finite guard, which may
      stop the run; a checkpoint also holds their state (``_save_opsd_state``).

    The rollout reward (the project's grader, if configured as verl's custom reward) is only logged.
    With ``opsd.loss.task_weight`` > 0 (or an objective that ``needs_task_reward``: RLSD) the trainer
    grades every rollout with the one grader and sends each response's GRPO group advantage to the actor
    (``_add_task_advantages``); with ``opsd.loss.sft_weight`` > 0 it sends each row's student prompt +
    reference solution + EOS (``_add_sft_inputs``) for the SFT term.

    A trainer using the mixin owns ``config``, ``tokenizer``, ``actor_rollout_wg`` (a worker group of
    ``recipe.opsd.worker.OPSDActorRolloutRefWorker``), ``global_steps`` (the step being trained,
    1-based), ``total_training_steps`` and ``train_dataset``; it calls ``_init_opsd`` once and
    ``_opsd_step`` on every rolled-out batch.
    """

    # a segment of the run that counts its own steps (set by a subclass that trains several short runs in one launch):
    # the global steps before it and its steps (a plain run: 0 and None = all of them); the collapse monitor, the
    # objective's schedule and the loss positions' seed count the segment's own steps
    step_offset, segment_steps = 0, None
    # the trained samples come from an older policy than the trainer's (verl's async trainers)
    stale_samples = False

    def _init_opsd(self, opsd_config: OPSDConfig) -> None:
        self.opsd = opsd_config
        self.teacher_inputs = TeacherInputs.from_config(
            opsd_config, self.tokenizer, teacher_tokenizer=self._teacher_tokenizer()
        )
        self.objective = opsd_config.loss.build_objective()
        monitor = opsd_config.diagnostics.monitor
        self.monitor = TrainingDynamicsMonitor(monitor) if monitor.enabled else None
        self.sft_inputs = self._sft_inputs()  # None unless opsd.loss.sft_weight > 0
        # non-finite loss / gradient: updates skipped (engine), counted and stopped on (here)
        self.nonfinite = nonfinite.NonFiniteGuard(opsd_config.diagnostics.max_consecutive_nonfinite)

    # ------------------------------------------------------------------ the step
    def _opsd_step(self, batch: DataProto, *, metrics: dict, timing_raw: dict) -> bool:
        """One OPSD step on ``batch`` (verl's rollout output joined with its prompts' rows, ``uid`` set):
        teacher inputs, loss positions and extras, the update (teacher forward inside), the rollout
        metrics and the collapse monitor. Fills ``metrics`` / ``timing_raw``; True when the run must
        stop (the monitor or the non-finite guard asks for it). The caller checkpoints, pushes the
        weights and logs."""
        response_len = batch.batch["responses"].shape[1]
        batch.batch[RESPONSE_LENGTHS_KEY] = batch.batch["attention_mask"][:, -response_len:].sum(-1)
        self._check_student_prompts(batch)
        self._add_teacher_inputs(batch)
        batch.batch["opsd_loss_mask"] = self._loss_positions(batch)
        if self.objective.uses_task_reward():  # the grader's GRPO advantage (a task weight, RLSD)
            metrics.update(self._add_task_advantages(batch))
        if self.sft_inputs is not None:  # the SFT rows (opsd.loss.sft_weight)
            metrics.update(self._add_sft_inputs(batch))
        updates = self._updates_per_step(len(batch))
        if needs_behaviour_log_probs(self.objective, stale_samples=self.stale_samples, updates_per_batch=updates):
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                batch.batch[OLD_LOG_PROBS_KEY] = self._behaviour_log_probs(batch)
        if self.opsd.diagnostics.dump_steps:
            self._dump_step(batch)
        step_values = self._step_values(updates_per_step=updates)  # what the objective needs at this step
        metrics.update({f"opsd/{name}": value for name, value in step_values.items()})

        # the teacher forward runs inside the update, on the workers (timing_s/teacher: its part of
        # timing_s/update_actor)
        with marked_timer("update_actor", timing_raw, color="red"):
            metrics.update(self._update_opsd_actor(
                batch, timing_raw=timing_raw, **{STEP_VALUE_PREFIX + name: value for name, value in step_values.items()}))
        # a non-finite loss or gradient norm: the engine skipped the update; count, maybe stop
        metrics.update(self.nonfinite.update(
            step=self.global_steps, loss=metrics.get("actor/loss"), grad_norm=metrics.get("actor/grad_norm")
        ))
        if metrics[nonfinite.SKIPPED_METRIC]:
            print(f"[opsd] step {self.global_steps}: non-finite loss or gradient norm, update skipped "
                  f"({self.nonfinite.consecutive} in a row, stop at {self.nonfinite.max_consecutive})")
        for prefix in (TEACHER_INPUT_PREFIX, REFERENCE_INPUT_PREFIX):
            for field in TEACHER_INPUT_FIELDS:
                batch.batch.pop(prefix + field, None)
        for field in SFT_INPUT_FIELDS:
            batch.batch.pop(SFT_INPUT_PREFIX + field, None)

        # the monitor sees this step's metrics before the checkpoint, so that a stop is saved and the
        # saved monitor state includes the step
        metrics.update(self._rollout_metrics(batch))
        metrics["training/global_step"] = self.global_steps
        return self._update_monitor(metrics) or self.nonfinite.should_stop

    def _finish_run(self, *, stop: bool) -> None:
        """After the last step (or a stop): say why the run stopped; a non-finite stop raises."""
        if stop and self.monitor is not None and self.monitor.should_stop:
            print(f"[opsd] stopped by the collapse monitor: {self.monitor.stop_reason}")
        if self.nonfinite.should_stop:
            raise nonfinite.NonFiniteTrainingError(self.nonfinite.stop_message())

    def _data_fingerprint(self, batch: DataProto) -> dict:
        """float sums of the step's prompts' ``extra_info.index`` (each prompt once, by ``uid``): with
        ``trainer.log_fingerprints`` a test checks that a resumed run sees the same data."""
        index_by_uid = {}
        for uid, info in zip(batch.non_tensor_batch["uid"], batch.non_tensor_batch["extra_info"]):
            index_by_uid.setdefault(uid, float(info.get("index", -1)))
        indices = list(index_by_uid.values())
        return {"training/data_index_sum": sum(indices), "training/data_index_sqsum": sum(i * i for i in indices)}

    # ------------------------------------------------------------------ teacher inputs
    def _teacher_tokenizer(self):
        """A teacher kind that loads_path: the teacher model's tokenizer, whose chat template renders the
        teacher prompts (paper: "Student and teacher prompts are rendered independently with the
        model's native chat template"); its vocabulary is the student's (checked at start). None
        (= the student's) for the other kinds."""
        if not self.opsd.teacher.kind_flags.loads_path:
            return None
        from verl.utils import hf_tokenizer
        from verl.utils.fs import copy_to_local

        model_cfg = self.config.actor_rollout_ref.model
        return hf_tokenizer(
            copy_to_local(self.opsd.teacher.path, use_shm=model_cfg.get("use_shm", False)),
            trust_remote_code=model_cfg.get("trust_remote_code", False),
        )

    def _check_student_prompts(self, batch: DataProto) -> None:
        """The student generated from exactly the prompt the teacher context pairs it with
        (``TeacherInputs.check_student_prompts``; each row once)."""
        prompts_BP = batch.batch["prompts"]
        mask_BP = batch.batch["attention_mask"][:, : prompts_BP.shape[1]].bool()
        self.teacher_inputs.check_student_prompts(
            [row[mask].tolist() for row, mask in zip(prompts_BP, mask_BP)], batch.non_tensor_batch["extra_info"]
        )

    def _add_teacher_inputs(self, batch: DataProto) -> None:
        """Each row's teacher input -- its teacher prompt + the student's response ids, left/right
        padded (``TeacherInputs.spliced``) -- as ``opsd_teacher_*`` tensors of the actor batch
        (objectives with a reference forward: also the reference-only ``opsd_reference_*``). The worker runs
        the teacher on them next to the update (``OPSDActorRolloutRefWorker.update_actor``)."""
        responses_BR = batch.batch["responses"]
        response_attention_BR = batch.batch["attention_mask"][:, -responses_BR.shape[1]:]
        prefixes = {TEACHER_INPUT_PREFIX: False}
        if self.objective.needs_reference_forward:
            prefixes[REFERENCE_INPUT_PREFIX] = True
        for prefix, reference_only in prefixes.items():
            spliced = self.teacher_inputs.spliced(
                batch.non_tensor_batch["extra_info"], responses_BR, response_attention_BR, reference_only=reference_only
            )
            for field in TEACHER_INPUT_FIELDS:
                batch.batch[prefix + field] = spliced[f"{field}_BT"]

    # ------------------------------------------------------------------ actor update
    def _loss_positions(self, batch: DataProto) -> torch.Tensor:
        """The loss mask [B, R] the actor batch carries (``advt:K``: all response positions here; the
        worker replaces it with the teacher-rank selection after its teacher forward)."""
        from recipe.opsd.core.positions import select_positions

        response_mask_BT = batch.batch["response_mask"].bool()
        if self.opsd.loss.position_kind == "advt":
            return response_mask_BT
        entropy_BT = None
        if self.opsd.loss.position_kind in ("he", "le"):
            # ranked by the student entropy inside the actor's loss (recipe.opsd.actor_loss); here only
            # the per-completion count matters (ceil(Q x length), independent of the entropy values),
            # so that verl's mini-batch token count is right: a constant entropy selects that many
            entropy_BT = torch.zeros(response_mask_BT.shape, dtype=torch.float32)
        return select_positions(
            self.opsd.loss.positions,
            response_mask_BT=response_mask_BT,
            entropy_BT=entropy_BT,
            seed=int(self.config.data.get("seed", 0) or 0) * 100003 + self.global_steps - self.step_offset,
        )

    def _step_values(self, *, updates_per_step: int) -> dict[str, float]:
        """The objective's values for this step (0-based: global_steps - step_offset - 1 of the run's or the segment's
        steps), e.g. beta-OPSD's teacher weight, RLSD's lambda."""
        return self.objective.step_values(step=self.global_steps - self.step_offset - 1,
                                          total_steps=int(self.segment_steps or self.total_training_steps),
                                          updates_per_step=updates_per_step)

    def _updates_per_step(self, rows: int) -> int:
        """Optimizer steps the update takes on a batch of ``rows`` samples: ppo_epochs x its mini-batches."""
        actor = self.config.actor_rollout_ref.actor
        mini_batch = int(actor.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        return int(actor.get("ppo_epochs", 1)) * -(-rows // mini_batch)

    def _behaviour_log_probs(self, batch: DataProto) -> torch.Tensor:
        """log pS_old(y_t) [B, R] of the policy that sampled the batch, the surrogate's pS_old when the update's own
        forward is not it (``needs_behaviour_log_probs``). Fresh samples: the actor before this step's update (verl's
        ``compute_log_prob``, full vocabulary at the student temperature). Stale samples (the trainer's weights are
        newer): the rollout's own log-probs of its sampled tokens."""
        if self.stale_samples:
            if "rollout_log_probs" not in batch.batch.keys():
                raise ValueError("the policy-gradient surrogate of stale samples needs the rollout's log-probs: set "
                                 "actor_rollout_ref.rollout.calculate_log_probs=true")
            return batch.batch["rollout_log_probs"].float()
        batch.meta_info["temperature"] = self.opsd.loss.student_temperature
        batch_td = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(batch_td, calculate_entropy=False, compute_loss=False)
        output = self.actor_rollout_wg.compute_log_prob(batch_td)
        return no_padding_2_padding(tu.get(output, "log_probs"), batch_td).float()

    def _update_opsd_actor(self, batch: DataProto, *, timing_raw: dict, **non_tensors) -> dict:
        batch.meta_info["temperature"] = self.opsd.loss.student_temperature
        batch_td = left_right_2_no_padding(batch.to_tensordict())
        batch_td["loss_mask"] = batch.batch["opsd_loss_mask"]
        actor_cfg = self.config.actor_rollout_ref.actor
        mini_batch_size = actor_cfg.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n
        tu.assign_non_tensor(
            batch_td,
            **{OPSD_FORWARD_KEY: "student_loss"},
            calculate_entropy=False,
            global_batch_size=mini_batch_size,
            mini_batch_size=mini_batch_size,
            epochs=actor_cfg.ppo_epochs,
            seed=actor_cfg.data_loader_seed,
            dataloader_kwargs={"shuffle": actor_cfg.shuffle},
            compute_loss=True,
            **{TEACHER_FINGERPRINT_KEY: bool(self.config.trainer.get("log_fingerprints", False))},
            **non_tensors,
        )
        output = tu.get(self.actor_rollout_wg.update_actor(batch_td), "metrics")
        timing_raw["teacher"] = output.pop(TEACHER_TIME_METRIC)
        metrics = {}
        for key, value in output.items():
            if key == "mfu":
                metrics["perf/mfu/actor"] = value
            elif key.startswith(("opsd/", "perf/")):
                metrics[key] = value
            else:
                metrics[f"actor/{key}"] = value
        return reduce_metrics(metrics)

    # ------------------------------------------------------------------ task reward (opsd.loss.task_weight)
    def _add_task_advantages(self, batch: DataProto) -> dict:
        """Each response's GRPO advantage in its prompt's group (``objectives.group_advantages`` over verl's
        ``uid``) of the one grader's reward (``recipe.common.reward.compute_score`` on the response decoded as
        verl's reward managers decode it, against ``reward_model.ground_truth``), as ``opsd_task_advantages``
        [B] of the actor batch. Returns the step's reward metrics."""
        from recipe.common.reward import compute_score
        from recipe.opsd.core.objectives.terms import group_advantages

        lengths = batch.batch[RESPONSE_LENGTHS_KEY]
        texts = self.tokenizer.batch_decode(
            [ids[: int(n)] for ids, n in zip(batch.batch["responses"], lengths)], skip_special_tokens=True
        )
        if "reward_model" not in batch.non_tensor_batch:
            raise ValueError("the task reward (opsd.loss.task_weight > 0, objective rlsd) grades the rollouts against "
                             "the parquet's reward_model.ground_truth column, which this data set does not have")
        truths = [info["ground_truth"] for info in batch.non_tensor_batch["reward_model"]]
        rewards_B = torch.tensor([compute_score("", text, truth)["score"] for text, truth in zip(texts, truths)],
                                 dtype=torch.float32)
        advantages_B = group_advantages(rewards_B=rewards_B, group_ids_B=list(batch.non_tensor_batch["uid"]))
        batch.batch[TASK_ADVANTAGES_KEY] = advantages_B
        return {"opsd/task_reward": rewards_B.mean().item(), "opsd/task_advantage_abs": advantages_B.abs().mean().item()}

    # ------------------------------------------------------------------ SFT term (opsd.loss.sft_weight)
    def _sft_inputs(self):
        """``inputs.SFTInputs`` of this run (student prompts as the rollouts', cap
        ``opsd.loss.sft_max_length`` or ``data.max_response_length``); None with sft_weight 0."""
        from recipe.opsd.core.inputs import SFTInputs

        loss = self.opsd.loss
        if loss.sft_weight <= 0:
            return None
        cap = loss.sft_max_length or int(self.config.data.max_response_length)
        return SFTInputs(student_prompt_ids=self.teacher_inputs.student_prompt_ids, tokenizer=self.tokenizer,
                         max_length=cap)

    def _add_sft_inputs(self, batch: DataProto) -> dict:
        """Each row's SFT input -- its student prompt (left-padded) + reference solution + EOS (right-padded,
        ``SFTInputs.spliced``) -- as ``opsd_sft_*`` tensors of the actor batch, split per rank and
        micro-batch with the rows; the engine runs the student on them inside the update. Returns the share
        of rows whose solution was cut to the cap (``opsd/sft_truncated_frac``)."""
        spliced = self.sft_inputs.spliced(batch.non_tensor_batch["extra_info"])
        suffix = {"responses": "BS", "response_mask": "BS"}
        for field in SFT_INPUT_FIELDS:
            batch.batch[SFT_INPUT_PREFIX + field] = spliced[f"{field}_{suffix.get(field, 'BT')}"]
        return {"opsd/sft_truncated_frac": spliced["truncated_B"].float().mean().item()}

    # ------------------------------------------------------------------ step dumps
    def _dump_step(self, batch: DataProto) -> None:
        """``opsd.diagnostics.dump_steps``: this step's rows as ``recipe.opsd.core.step_dump`` describes them."""
        from dataclasses import asdict

        from recipe.opsd.core import step_dump

        inputs = {key: (batch.batch[prefix + "input_ids"], batch.batch[prefix + "attention_mask"])
                  for prefix, key in ((TEACHER_INPUT_PREFIX, "teacher_prompt_ids"),
                                      (REFERENCE_INPUT_PREFIX, "reference_prompt_ids"))
                  if prefix + "input_ids" in batch.batch.keys()}
        rows = step_dump.step_rows(
            prompts_BP=batch.batch["prompts"], responses_BR=batch.batch["responses"],
            attention_BT=batch.batch["attention_mask"], loss_mask_BR=batch.batch["opsd_loss_mask"],
            extra_infos=batch.non_tensor_batch["extra_info"], teacher_inputs=inputs,
        )
        step_dump.write_step_dump(
            step_dump.dump_path(self.config.trainer.default_local_dir, self.global_steps),
            step=self.global_steps, rows=rows, loss_config=asdict(self.opsd.loss),
        )

    # ------------------------------------------------------------------ metrics
    def _rollout_metrics(self, batch: DataProto) -> dict:
        from recipe.common.grader import extract_boxed, has_boxed_answer

        response_len = batch.batch["responses"].shape[1]
        lengths = batch.batch[RESPONSE_LENGTHS_KEY].float()
        prompt_lengths = batch.batch["attention_mask"][:, :-response_len].sum(-1).float()
        texts = self.tokenizer.batch_decode(
            [ids[: int(n)] for ids, n in zip(batch.batch["responses"], lengths)], skip_special_tokens=True
        )
        metrics = {
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "response_length/min": lengths.min().item(),
            "response_length/clip_ratio": (lengths >= response_len).float().mean().item(),
            "prompt_length/mean": prompt_lengths.mean().item(),
            "opsd/rollout_boxed_rate": float(np.mean([has_boxed_answer(extract_boxed(t)) for t in texts])),
        }
        if "rm_scores" in batch.batch.keys():
            metrics["opsd/rollout_score"] = batch.batch["rm_scores"].sum(-1).mean().item()
        return metrics

    def _param_checksum_metrics(self) -> dict:
        sums = self.actor_rollout_wg.param_checksums()[0]
        return {f"opsd/{name}_param_checksum": float(vals[0]) for name, vals in sums.items()} | {
            f"opsd/{name}_param_sqsum": float(vals[1]) for name, vals in sums.items()
        }

    # ------------------------------------------------------------------ checkpoints
    def _save_opsd_state(self, folder: str) -> None:
        """What a checkpoint holds beyond verl's: the collapse monitor's state, the non-finite guard's
        counts and an EMA teacher (written before verl's own save, whose last act is the
        ``latest_checkpointed_iteration.txt`` a resume trusts)."""
        os.makedirs(folder, exist_ok=True)
        if self.monitor is not None:
            with open(os.path.join(folder, MONITOR_STATE_FILE), "w") as handle:
                json.dump(self.monitor.state_dict(), handle)
        with open(os.path.join(folder, nonfinite.STATE_FILE), "w") as handle:
            json.dump(self.nonfinite.state_dict(), handle)
        if self.opsd.teacher.kind_flags.follows_student:  # verl saves the actor only; the EMA teacher is state too
            self.actor_rollout_wg.save_ema_teacher(os.path.abspath(folder))

    def _load_opsd_state(self, folder: str) -> None:
        """On resume from ``folder``: the EMA teacher, the non-finite counts and the collapse monitor's
        window (so collapse detection is not silently off for the first ``early_end + recent_window``
        steps after a resume)."""
        folder = os.path.abspath(folder)
        if self.opsd.teacher.kind_flags.follows_student:
            self.actor_rollout_wg.load_ema_teacher(folder)
            print(f"[opsd] EMA teacher restored from {folder}")
        nonfinite_path = os.path.join(folder, nonfinite.STATE_FILE)
        if os.path.isfile(nonfinite_path):  # absent in checkpoints of older versions: counts start at 0
            with open(nonfinite_path) as handle:
                self.nonfinite.load_state_dict(json.load(handle))
        if self.monitor is None:
            return
        path = os.path.join(folder, MONITOR_STATE_FILE)
        if not os.path.isfile(path):
            print(f"[opsd] WARNING: no {MONITOR_STATE_FILE} in {folder}: the collapse monitor starts with an empty "
                  "window (it compares steps after the resume only)")
            return
        with open(path) as handle:
            self.monitor.load_state_dict(json.load(handle))
        acting = (*self.opsd.diagnostics.monitor.stop_on, *self.opsd.diagnostics.monitor.rollback_on)
        if self.monitor.should_stop and self.monitor.stop_signature not in acting:
            # the signature that stopped the run is no longer a stop condition: the user chose to go on
            self.monitor.should_stop, self.monitor.stop_reason, self.monitor.stop_signature = False, None, None
        print(f"[opsd] collapse monitor resumed with {len(self.monitor.history)} logged steps")

    def _save_checkpoint(self):
        """verl's checkpoint of ``global_step_<global_steps>``, plus ``_save_opsd_state``."""
        self._save_opsd_state(os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        """verl's resume, plus ``_load_opsd_state`` of the folder it resumed from, then the collapse monitor's
        actions so far (``_resume_monitor_actions``; also on a relaunch from the initial model)."""
        result = super()._load_checkpoint()
        if self.global_steps > 0:
            trainer_cfg = self.config.trainer
            if trainer_cfg.resume_mode == "resume_path":
                folder = trainer_cfg.resume_from_path
            else:
                folder = os.path.join(trainer_cfg.default_local_dir, f"global_step_{self.global_steps}")
            self._load_opsd_state(folder)
        self._resume_monitor_actions()
        return result

    def _stopped_by_monitor(self) -> bool:
        """True (and says so) when a resumed run's collapse monitor had stopped it: nothing to train."""
        if self.monitor is None or not self.monitor.should_stop:
            return False
        print(f"[opsd] the collapse monitor stopped this run ({self.monitor.stop_reason}); not training further. "
              f"To continue anyway, rerun with that signature removed from opsd.diagnostics.monitor.stop_on "
              f"(now {list(self.opsd.diagnostics.monitor.stop_on)}).")
        return True

    # ------------------------------------------------------------------ pre-flight gate, the workers' part
    def _finished_run(self) -> bool:
        """A relaunch of a finished run (resumed at ``trainer.total_training_steps``): nothing to train. verl's fit
        would train one step past the end (it increments the step before comparing it)."""
        if self.global_steps < self.total_training_steps:
            return False
        print(f"[opsd] step {self.global_steps} is trainer.total_training_steps={self.total_training_steps}: the run is "
              "finished, nothing to train", flush=True)
        return True

    def _preflight_divergence(self) -> dict:
        """The pre-flight gate's model-level part (docs/opsd_recipe.md "Start-up checks"): the first
        ``preflight.GATE_ROWS`` training rows, each twice -- student prompt of the configured context with
        its teacher prompt (the trainer's ``TeacherInputs``), and the none control (student and teacher
        prompt of context ``none``, both in the student's mode) -- with the reference solution's first
        ``opsd.diagnostics.preflight_positions`` tokens as the response, scored on the workers
        (``preflight_divergence``). Prints the table; raises ``PreflightError`` when the teacher has the
        student's weights and the none control is not 0. Returns the ``preflight/...`` metrics."""
        from recipe.opsd.core import preflight
        from recipe.opsd.worker import PREFLIGHT_ROW_KEY

        start = time.perf_counter()
        frame = getattr(self.train_dataset, "dataframe", None)
        if frame is None or len(frame) == 0 or "extra_info" not in frame.column_names:
            print("[opsd] preflight positions: skipped (the train dataset has no extra_info rows here)")
            return {}
        opsd = self.opsd
        infos = [dict(frame[i]["extra_info"]) for i in range(min(preflight.GATE_ROWS, len(frame)))]
        student, teacher, responses_BR, response_mask_BR = preflight.control_batch(
            infos, teacher_inputs=self.teacher_inputs, tokens=opsd.diagnostics.preflight_positions)
        tensors = {field: student[f"{field}_BT"] for field in TEACHER_INPUT_FIELDS}
        tensors |= {TEACHER_INPUT_PREFIX + field: teacher[f"{field}_BT"] for field in TEACHER_INPUT_FIELDS}
        tensors |= {"responses": responses_BR, "response_mask": response_mask_BR,
                    RESPONSE_LENGTHS_KEY: response_mask_BR.sum(-1), PREFLIGHT_ROW_KEY: torch.arange(len(responses_BR))}
        values = self.actor_rollout_wg.preflight_divergence(tensors, opsd.loss.student_temperature)[0]
        loss = opsd.loss
        report = preflight.divergence_report(
            values, mask_RK=response_mask_BR, is_none_R=[i >= len(infos) for i in range(len(responses_BR))],
            k=opsd.diagnostics.preflight_positions, teacher_context=opsd.teacher_context, teacher_kind=opsd.teacher.kind,
            weights_equal=preflight.teacher_is_student(opsd.teacher.kind, resumed=self.global_steps > 0),
            dtype=values["dtype"], seconds=time.perf_counter() - start,
            settings=(f"beta {loss.beta}, clip_tau {loss.clip_tau}, T_s {loss.student_temperature}, "
                      f"T_t {loss.effective_teacher_temperature}" + (f", topk {loss.topk}" if loss.topk else "")),
        )
        print("\n".join(report.lines()), flush=True)
        if not report.ok:
            raise preflight.PreflightError("\n".join([report.verdict(), *report.lines()]))
        return report.metrics()

    def _update_monitor(self, metrics: dict) -> bool:
        """Feed the collapse monitor this step's metrics; True if it asks to stop. With
        ``raise_on_stop`` the checkpoint of the step is saved before the error propagates."""
        if self.monitor is None:
            return False
        seen, acted = len(self.monitor.events), self.monitor.action
        try:
            metrics.update(self.monitor.update(metrics, step=self.global_steps - self.step_offset))
        except TrainingCollapseError:
            if self.config.trainer.save_freq > 0:
                self._save_checkpoint()
            raise
        finally:
            # The warnings also go to the console as "[opsd]" lines (the launcher's condensed output shows them).
            for event in self.monitor.events[seen:]:
                print(f"[opsd] collapse monitor ({event.signature}): {event.message}", flush=True)
        if self.monitor.action is not None and self.monitor.action is not acted:
            self._record_monitor_action(self.monitor.action)
        return self.monitor.should_stop

    def _log_rollouts(self, batch: DataProto, timing_raw: dict, rollout_data_dir: str) -> None:
        """verl's ``trainer.rollout_data_dir`` dump; the score is the (logged-only) reward, 0 without one."""
        if "rm_scores" in batch.batch.keys():
            scores, extra = extract_reward(batch)
        else:
            scores, extra = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32), {}
        batch.batch["token_level_scores"] = scores
        self._log_rollout_data(batch, extra, timing_raw, rollout_data_dir)

    # ------------------------------------------------------------------ collapse-monitor actions
    # (opsd.diagnostics.monitor stop_on / rollback_on: recipe.opsd.core.monitor; the relaunch: recipe.launch.monitor_actions)
    def _record_monitor_action(self, action) -> None:
        """Log the monitor's stop / rollback request in the checkpoint directory (the launcher acts on it when this
        launch ends; the caller saves the step's checkpoint) and print it."""
        from recipe.opsd.core.monitor import append_action

        append_action(self.config.trainer.default_local_dir, action)
        print(f"[opsd] {action.line()}", flush=True)

    def _resume_monitor_actions(self) -> None:
        """The rollbacks logged before this launch and, with ``rollback_setting=lr_scale``, the learning rate: the
        restored optimizer and scheduler are scaled to rollback_value ** rollbacks of the configured schedule
        (verl restores the saved schedule whatever the config's lr says)."""
        from recipe.opsd.core.monitor import learning_rate_scale, read_actions, rollbacks_done

        if self.monitor is None:
            return
        self.monitor.rollbacks = rollbacks_done(read_actions(self.config.trainer.default_local_dir))
        want = learning_rate_scale(self.opsd.diagnostics.monitor, self.monitor.rollbacks)
        if want != self.monitor.lr_scale:
            factor, ranks = want / self.monitor.lr_scale, self.actor_rollout_wg.world_size
            self.actor_rollout_wg.execute_with_func_generator(
                _scale_learning_rate, DataProto.from_dict(tensors={"rank": torch.arange(ranks)}, meta_info={"factor": factor}))
            print(f"[opsd] collapse monitor action: learning rate x{factor:g} from step {self.global_steps + 1} "
                  f"(rollback {self.monitor.rollbacks}: x{want:g} of the configured schedule)", flush=True)
            self.monitor.lr_scale = want


def _scale_learning_rate(worker, data: DataProto) -> DataProto:
    """On every actor worker (verl's ``execute_with_func_generator``): multiply the optimizer's learning rates and
    the scheduler's base rates by ``data.meta_info["factor"]`` (verl 0.9.1's engine worker: ``actor.engine``)."""
    factor = float(data.meta_info["factor"])
    engine = worker.actor.engine
    for group in engine.optimizer.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    scheduler = engine.lr_scheduler
    scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
    scheduler._last_lr = [group["lr"] for group in engine.optimizer.param_groups]
    return data
