"""OPSD trainer: verl's legacy ``RayPPOTrainer`` with the PPO step replaced by a distillation step.

What differs from PPO (everything else -- dataloader and its resumable state, agent-loop rollout,
weight sync to the rollout servers, validation, checkpoints, logging -- is verl's):

- no reward for training, no advantage, no critic, no KL-to-ref, no old log-probs;
- after the rollout, every sample's teacher input is built at the token level: its teacher prompt
  (``prompts.build_prompt_pair(opsd.teacher_context, extra_info)`` rendered by
  ``chat.render_ids`` in ``opsd.teacher_mode``, at most ``opsd.teacher_max_prompt_length`` tokens)
  followed by the student's response ids (``chat.splice_teacher_inputs``: never decoded, no pad in
  between);
- the frozen teacher returns its final hidden states at the response positions
  (``compute_teacher_hidden``; for ``advt:K`` also the teacher rank of each sampled token), the
  loss positions are selected (``positions.select_positions``; ``he:Q`` / ``le:Q`` are ranked by
  the student entropy inside the actor's loss, see ``recipe.opsd.actor_loss``), and the actor is
  updated with ``recipe.opsd.actor_loss.opsd_loss``;
- ``variant: purified``: a second teacher forward on the reference-only prompt
  (``prompts.reference_only_messages``: the teacher prompt without the question) followed by the
  same response ids gives ``reference_hidden``; ``variant: beta_opsd``: the step's teacher weight
  (``variants.teacher_weight_schedule`` over ``trainer.total_training_steps``) goes to the actor.

The rollout reward (the project's grader, if configured as verl's custom reward) is only logged.
"""

from __future__ import annotations

import uuid
from pprint import pprint

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.tracking import Tracking
from verl.workers.utils.padding import left_right_2_no_padding

from recipe.opsd.config import OPSDConfig
from recipe.opsd.actor_loss import TEACHER_WEIGHT_KEY
from recipe.opsd.teacher_worker import OPSD_FORWARD_KEY, RESPONSE_LENGTHS_KEY, TEACHER_RANK_CHUNK_KEY


class RayOPSDTrainer(RayPPOTrainer):
    def __init__(self, *args, opsd_config: OPSDConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.opsd = opsd_config
        # the frozen teacher is verl's reference policy (ActorRolloutRef worker; LoRA: adapters off)
        self.use_reference_policy = True
        self.use_critic = False
        self.use_rm = False
        self._teacher_prompt_cache: dict = {}
        self._checked_student_prompts: set = set()
        self.monitor = None
        if self.opsd.monitor.get("enabled", True):
            try:
                from recipe.opsd.monitor import MonitorConfig, TrainingDynamicsMonitor
            except ImportError:
                TrainingDynamicsMonitor = None
            if TrainingDynamicsMonitor is not None:
                options = {k: v for k, v in self.opsd.monitor.items()}
                self.monitor = TrainingDynamicsMonitor(MonitorConfig(**options))

    # ------------------------------------------------------------------ teacher inputs
    def _teacher_prompt_ids(self, extra_info: dict, *, reference_only: bool = False) -> list[int]:
        """Rendered teacher prompt of one row; ``reference_only``: Purified OPSD's reference-only prompt."""
        from recipe.common.chat import render_ids
        from recipe.common.prompts import build_prompt_pair, reference_only_messages

        key = (reference_only, extra_info.get("id"), extra_info.get("index"), extra_info.get("problem"))
        if key not in self._teacher_prompt_cache:
            if reference_only:
                teacher_messages = reference_only_messages(self.opsd.teacher_context, extra_info)
            else:
                _, teacher_messages = build_prompt_pair(self.opsd.teacher_context, extra_info)
            ids = list(render_ids(teacher_messages, self.tokenizer, self.opsd.teacher_mode))
            if len(ids) > self.opsd.teacher_max_prompt_length:
                raise ValueError(
                    f"{'reference-only ' if reference_only else ''}teacher prompt of row id={extra_info.get('id')!r} "
                    f"has {len(ids)} tokens > "
                    f"opsd.teacher_max_prompt_length={self.opsd.teacher_max_prompt_length} "
                    f"(context {self.opsd.teacher_context!r}, mode {self.opsd.teacher_mode!r}); filter the data "
                    "with data_prep's length filter or raise the cap"
                )
            self._teacher_prompt_cache[key] = ids
        return self._teacher_prompt_cache[key]

    def _check_student_prompts(self, batch: DataProto) -> None:
        """The student generated from exactly the prompt the teacher context pairs it with.

        The rollout's prompt ids come from the parquet ``prompt`` column; the teacher's from
        ``extra_info`` at run time. A parquet built for another context (e.g. a default student
        prompt under an instruction-only context, whose student message differs) would silently
        run another experiment, so each row is checked once against
        ``build_prompt_pair(opsd.teacher_context, extra_info)`` rendered in ``opsd.student_mode``.
        """
        from recipe.common.chat import render_ids
        from recipe.common.prompts import build_prompt_pair

        prompts_BP = batch.batch["prompts"]
        mask_BP = batch.batch["attention_mask"][:, : prompts_BP.shape[1]].bool()
        for i, info in enumerate(batch.non_tensor_batch["extra_info"]):
            key = (info.get("id"), info.get("index"), info.get("problem"))
            if key in self._checked_student_prompts:
                continue
            student_messages, _ = build_prompt_pair(self.opsd.teacher_context, dict(info))
            expected = list(render_ids(student_messages, self.tokenizer, self.opsd.student_mode))
            actual = prompts_BP[i][mask_BP[i]].tolist()
            if actual != expected:
                raise ValueError(
                    f"row id={info.get('id')!r}: the parquet `prompt` the student generated from is not the student "
                    f"message of opsd.teacher_context={self.opsd.teacher_context!r} rendered in "
                    f"opsd.student_mode={self.opsd.student_mode!r} ({len(actual)} vs {len(expected)} tokens; "
                    f"rollout prompt starts {self.tokenizer.decode(actual[:48])!r}, expected "
                    f"{self.tokenizer.decode(expected[:48])!r}); rebuild the parquet for this context with "
                    "python -m data_prep.length_filter --teacher-context ..."
                )
            self._checked_student_prompts.add(key)

    def _teacher_batch(self, batch: DataProto, *, reference_only: bool = False) -> DataProto:
        """Teacher prompt + the student's response ids, in verl's left/right padded layout."""
        from recipe.common.chat import splice_teacher_inputs

        responses_BR = batch.batch["responses"]
        response_len = responses_BR.shape[1]
        response_attention_BR = batch.batch["attention_mask"][:, -response_len:]
        teacher_prompts = [
            self._teacher_prompt_ids(dict(info), reference_only=reference_only)
            for info in batch.non_tensor_batch["extra_info"]
        ]
        spliced = splice_teacher_inputs(
            teacher_prompts, responses_BR, response_attention_BR, pad_token_id=self.tokenizer.pad_token_id
        )
        return DataProto.from_dict(
            tensors={
                "input_ids": spliced["input_ids_BT"],
                "attention_mask": spliced["attention_mask_BT"],
                "position_ids": spliced["position_ids_BT"],
                "responses": responses_BR,
                "response_mask": batch.batch["response_mask"],
                RESPONSE_LENGTHS_KEY: batch.batch[RESPONSE_LENGTHS_KEY],
            },
            meta_info={"temperature": self.opsd.loss.effective_teacher_temperature},
        )

    def _compute_teacher_hidden(self, batch: DataProto, *, reference_only: bool = False, rank: bool = False) -> dict:
        """``teacher_hidden`` [B, R, H] (and ``teacher_rank`` [B, R] if ``rank``) of the frozen teacher."""
        teacher_td = left_right_2_no_padding(self._teacher_batch(batch, reference_only=reference_only).to_tensordict())
        if rank:
            tu.assign_non_tensor(teacher_td, **{TEACHER_RANK_CHUNK_KEY: self.opsd.loss.chunk_size})
        output = self.actor_rollout_wg.compute_teacher_hidden(teacher_td)
        keys = ("teacher_hidden", "teacher_rank") if rank else ("teacher_hidden",)
        return {key: torch.stack(list(tu.get(output, key).unbind())) for key in keys}

    # ------------------------------------------------------------------ actor update
    def _loss_positions(self, batch: DataProto, *, teacher_rank_BT: torch.Tensor | None = None) -> torch.Tensor:
        from recipe.opsd.positions import select_positions

        response_mask_BT = batch.batch["response_mask"].bool()
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
            teacher_rank_BT=teacher_rank_BT,
            seed=int(self.config.data.get("seed", 0) or 0) * 100003 + self.global_steps,
        )

    def _teacher_weight(self) -> float:
        """beta-OPSD's teacher weight at this step (0-based step = global_steps - 1)."""
        from recipe.opsd.variants import teacher_weight_schedule

        params = self.opsd.loss.params
        return teacher_weight_schedule(
            self.global_steps - 1,
            total_steps=int(self.total_training_steps),
            start=params.teacher_weight_start,
            end=params.teacher_weight_end,
        )

    def _update_opsd_actor(self, batch: DataProto, **non_tensors) -> dict:
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
            **non_tensors,
        )
        output = tu.get(self.actor_rollout_wg.update_actor(batch_td), "metrics")
        metrics = {}
        for key, value in output.items():
            if key == "mfu":
                metrics["perf/mfu/actor"] = value
            elif key.startswith(("opsd/", "perf/")):
                metrics[key] = value
            else:
                metrics[f"actor/{key}"] = value
        return reduce_metrics(metrics)

    # ------------------------------------------------------------------ metrics
    def _rollout_metrics(self, batch: DataProto) -> dict:
        from recipe.common.grader import extract_answer

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
            "opsd/rollout_boxed_rate": float(np.mean([extract_answer(t) is not None for t in texts])),
        }
        if "rm_scores" in batch.batch.keys():
            metrics["opsd/rollout_score"] = batch.batch["rm_scores"].sum(-1).mean().item()
        return metrics

    def _param_checksum_metrics(self) -> dict:
        sums = self.actor_rollout_wg.param_checksums()[0]
        return {f"opsd/{name}_param_checksum": float(vals[0]) for name, vals in sums.items()} | {
            f"opsd/{name}_param_sqsum": float(vals[1]) for name, vals in sums.items()
        }

    # ------------------------------------------------------------------ loop
    def fit(self):
        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        current_epoch = self.global_steps // len(self.train_dataloader)

        if self.config.trainer.get("val_before_train", True) and self.val_dataset is not None:
            val_metrics = self._validate()
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                return

        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="OPSD")
        self.global_steps += 1
        rollout_n = self.config.actor_rollout_ref.rollout.n
        for epoch in range(current_epoch, self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                metrics, timing_raw = {}, {}
                is_last_step = self.global_steps >= self.total_training_steps
                batch = DataProto.from_single_dict(batch_dict)
                indices = [float(info.get("index", -1)) for info in batch.non_tensor_batch["extra_info"]]
                data_fingerprint = {
                    "training/data_index_sum": sum(indices),
                    "training/data_index_sqsum": sum(i * i for i in indices),
                }
                batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
                batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
                gen_batch = self._get_gen_batch(batch)
                gen_batch.meta_info["global_steps"] = self.global_steps
                gen_batch = gen_batch.repeat(repeat_times=rollout_n, interleave=True)

                with marked_timer("step", timing_raw):
                    with marked_timer("gen", timing_raw, color="red"):
                        gen_output = self.async_rollout_manager.generate_sequences(gen_batch)
                        self.checkpoint_manager.sleep_replicas()
                        timing_raw.update(gen_output.meta_info.pop("timing", {}))
                    batch = batch.repeat(repeat_times=rollout_n, interleave=True).union(gen_output)
                    if "response_mask" not in batch.batch.keys():
                        batch.batch["response_mask"] = compute_response_mask(batch)
                    response_len = batch.batch["responses"].shape[1]
                    batch.batch[RESPONSE_LENGTHS_KEY] = batch.batch["attention_mask"][:, -response_len:].sum(-1)
                    if self.config.trainer.balance_batch:
                        self._balance_batch(batch, metrics=metrics)
                    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()

                    self._check_student_prompts(batch)
                    with marked_timer("teacher", timing_raw, color="olive"):
                        teacher = self._compute_teacher_hidden(batch, rank=self.opsd.loss.position_kind == "advt")
                        if self.opsd.loss.variant == "purified":
                            reference = self._compute_teacher_hidden(batch, reference_only=True)
                            teacher["reference_hidden"] = reference["teacher_hidden"]
                    teacher_rank_BT = teacher.pop("teacher_rank", None)
                    batch.batch.update(teacher)
                    batch.batch["opsd_loss_mask"] = self._loss_positions(batch, teacher_rank_BT=teacher_rank_BT)
                    variant_inputs = {}
                    if self.opsd.loss.variant == "beta_opsd":
                        variant_inputs[TEACHER_WEIGHT_KEY] = self._teacher_weight()
                        metrics["opsd/teacher_weight"] = variant_inputs[TEACHER_WEIGHT_KEY]

                    with marked_timer("update_actor", timing_raw, color="red"):
                        metrics.update(self._update_opsd_actor(batch, **variant_inputs))
                    for key in teacher:
                        batch.batch.pop(key)

                    if self.config.trainer.save_freq > 0 and (
                        is_last_step or self.global_steps % self.config.trainer.save_freq == 0
                    ):
                        with marked_timer("save_checkpoint", timing_raw, color="green"):
                            self._save_checkpoint()
                    with marked_timer("update_weights", timing_raw, color="red"):
                        self.checkpoint_manager.update_weights(self.global_steps)

                if self.config.trainer.test_freq > 0 and (
                    is_last_step or self.global_steps % self.config.trainer.test_freq == 0
                ):
                    with marked_timer("testing", timing_raw, color="green"):
                        metrics.update(self._validate())

                metrics.update(self._rollout_metrics(batch))
                metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
                metrics.update({"training/global_step": self.global_steps, "training/epoch": epoch})
                if self.config.trainer.get("log_fingerprints", False):
                    metrics.update(self._param_checksum_metrics())
                    metrics.update(data_fingerprint)
                if self.monitor is not None:
                    metrics.update(self.monitor.update(metrics, step=self.global_steps))
                logger.log(data=metrics, step=self.global_steps)
                progress_bar.update(1)
                self.global_steps += 1
                if is_last_step or (self.monitor is not None and self.monitor.should_stop):
                    progress_bar.close()
                    return
