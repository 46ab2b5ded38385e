"""verl glue: the OPSD worker -- actor, rollout and teacher in verl's ``ActorRolloutRefWorker``.

The teacher is verl's reference policy: a frozen FSDP copy of the initial student in the actor's processes
(``actor_rollout_ref.model.path``, no optimizer, parameters in host memory: verl's forward-only FSDP2 engine
always uses ``CPUOffloadPolicy``; with LoRA, verl builds no second copy: the actor with its adapters disabled),
reused instead of a separate pool (which would need its own GPUs or a second colocated worker group, and ship
its output through the driver). ``OPSDActorRolloutRefWorker`` gives actor and teacher the OPSD engine
(``recipe.opsd.engine``), sets the OPSD loss with a frozen copy of the teacher's lm_head and runs the teacher
forward inside ``update_actor``, on the rank's own rows: the teacher's hidden states [B, R, H] never travel
through the driver (details: ``OPSDActorRolloutRefWorker``).
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import torch

from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from recipe.common.heads import checkpoint_lm_head, output_logit_scale
from recipe.opsd import teacher_state
from recipe.opsd.actor_loss import loss_heads, opsd_loss
from recipe.opsd.engine import OPSD_FORWARD_KEY, RESPONSE_LENGTHS_KEY, TEACHER_RANK_CHUNK_KEY, opsd_engine_class

# the teacher's inputs travel with the actor batch: <prefix><field> tensors [B, T_teacher], left/right
# padded (recipe.opsd.core.inputs.TeacherInputs.spliced); the reference-only ones for objectives that
# need a reference forward (Purified OPSD)
TEACHER_INPUT_PREFIX = "opsd_teacher_"
REFERENCE_INPUT_PREFIX = "opsd_reference_"
TEACHER_INPUT_FIELDS = ("input_ids", "attention_mask", "position_ids")
# set on the actor batch (trainer.log_fingerprints) to get the float64 sums of the teacher's weights
# taken right before its forward: opsd/teacher_param_{checksum,sqsum}
TEACHER_FINGERPRINT_KEY = "opsd_teacher_fingerprint"
# wall time of the teacher forward inside update_actor (max over ranks), reported with the update's metrics
TEACHER_TIME_METRIC = "timing_s/teacher"
# the pre-flight batch's row index [B] (micro-batching may reorder rows)
PREFLIGHT_ROW_KEY = "opsd_preflight_row"


def opsd_loss_function(loss_config, model_config, *, frozen_teacher_head: bool, teacher_model_config=None,
                       head_dtype=None):
    """The actor's verl loss function: ``actor_loss.opsd_loss`` with the teacher's lm_head.

    ``frozen_teacher_head``: a copy of the teacher's lm_head, read once from its checkpoint
    (``teacher_model_config``, default ``model_config``: ``actor_rollout_ref.model.path``; a
    directory or a Hub id), with that model's head scale folded in; False (LoRA, or the teacher is the
    student): the live lm_head, detached. ``head_dtype``: the copy's dtype (default: the checkpoint's;
    a teacher that follows the student keeps float32). Soft-capped heads are refused here, at start.
    """
    output_logit_scale(model_config.hf_config)  # the student's head too: refuse soft-capping now
    head = None
    if frozen_teacher_head:
        head = teacher_head(teacher_model_config or model_config)
        head = head if head_dtype is None else head.to(head_dtype)
    return partial(opsd_loss, loss_config=loss_config, objective=loss_config.build_objective(), teacher_weight_VH=head)


def teacher_head(model_config) -> torch.Tensor:
    """The lm_head weight [V, H] of ``model_config``'s checkpoint as the model applies it (head scale
    folded in), on this worker's device."""
    scale = output_logit_scale(model_config.hf_config)
    return checkpoint_lm_head(
        model_config.local_path,
        tie_word_embeddings=bool(getattr(model_config.hf_config, "tie_word_embeddings", False)),
    ).to(get_device_id()) * scale


class OPSDTrainingWorker(TrainingWorker):
    """verl's TrainingWorker whose engine (picked by verl's EngineRegistry) gets the OPSD forward.

    The engine object is created but not yet initialised in ``TrainingWorker.__init__``; we only
    swap its class for the subclass with the mixin, so every engine setting verl chose stays.
    """

    # a teacher kind that loads_path (set on the reference slot's class by ``worker_class_for``): the model
    # this worker loads instead of the student's
    model_path_override: str | None = None

    def __init__(self, config):
        if self.model_path_override is not None:
            config = dataclasses.replace(config, model_config=other_model_config(config.model_config, self.model_path_override))
        super().__init__(config)
        strategy = getattr(self.engine_config, "strategy", None)
        if strategy != "fsdp2":
            raise ValueError(f"OPSD needs the fsdp2 engine (actor_rollout_ref.actor.strategy=fsdp2), got {strategy!r}")
        self.engine.__class__ = opsd_engine_class(type(self.engine))


def other_model_config(model_config, path: str):
    """verl's ``HFModelConfig`` of the model at ``path`` with every other setting of ``model_config``
    (dtype overrides, remove-padding, trust_remote_code, ...); tokenizer, config and local copy are
    the new model's own (resolved as verl resolves the student's)."""
    derived = dict(local_path=None, hf_config_path=None, local_hf_config_path=None, tokenizer_path=None,
                   local_tokenizer_path=None, hf_config=None, generation_config=None, tokenizer=None,
                   processor=None, architectures=None)
    return dataclasses.replace(model_config, path=path, **derived)


class OPSDActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor + rollout + frozen teacher (verl's ref) with the OPSD loss and teacher hidden states.

    Gives actor and teacher the OPSD engine (``recipe.opsd.engine``), sets the OPSD loss with a frozen copy
    of the teacher's lm_head (read once from its checkpoint; in LoRA mode the lm_head is not adapted, so the
    live one is the initial one), and runs the teacher forward inside ``update_actor``, on the rows verl
    dispatched to the rank, right before the update: the teacher's hidden states [B, R, H] never travel
    through the driver (only its input ids do). What the objective needs beyond that (a reference-only
    teacher forward) it says itself (``recipe.opsd.core.objectives``).
    """

    actor_worker_cls = OPSDTrainingWorker
    ref_worker_cls = OPSDTrainingWorker
    # the `opsd:` block as a plain dict; set by `worker_class_for(...)` (verl builds the worker
    # with the actor_rollout_ref config only)
    opsd_config: dict | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if self.actor is None:
            return
        from recipe.opsd.core.config import OPSDConfig

        if self.opsd_config is None:
            raise ValueError("OPSDActorRolloutRefWorker needs the opsd config: build it with worker_class_for(opsd)")
        self.opsd = OPSDConfig.from_hydra(self.opsd_config)
        # the teacher head: a copy read from the teacher's checkpoint when the teacher is a second copy
        # in the ref slot; the live lm_head, detached, when the teacher is the actor module (LoRA with
        # the base weights: the lm_head is not adapted; the student itself: the student's head)
        teacher_config = self.ref.model_config if self.ref is not None else None
        kind = self.opsd.teacher.kind_flags
        if kind.loads_path:
            self._check_teacher_tokenizer(teacher_config)
        loss_fn = opsd_loss_function(
            self.opsd.loss, self.actor.model_config, frozen_teacher_head=self.ref is not None,
            teacher_model_config=teacher_config, head_dtype=torch.float32 if kind.follows_student else None,
        )
        self.actor.set_loss_fn(loss_fn)
        self.objective = loss_fn.keywords["objective"]
        if kind.follows_student:
            self._teacher_head_VH = loss_fn.keywords["teacher_weight_VH"]
            self.actor.engine.opsd_after_optimizer_step = self._ema_teacher_step

    def _check_teacher_tokenizer(self, teacher_config) -> None:
        """A kind that loads_path: the teacher's tokenizer and vocabulary size are the student's (also
        checked before Ray for local models; here for Hub ids, after the download)."""
        from recipe.common.checkpoints import check_same_model
        from recipe.common.heads import local_checkpoint_dir
        from recipe.opsd.core.teacher_kinds import TEACHER_SAME_KEYS

        # local_path is a Hub id for Hub models: their files are in the local cache by now
        student, teacher = (local_checkpoint_dir(c.local_path) for c in (self.actor.model_config, teacher_config))
        check_same_model(student, teacher, keys=TEACHER_SAME_KEYS)

    def _ema_teacher_step(self, grad_norm) -> None:
        """A kind that follows_student, after every optimizer step of the actor (``teacher_state.ema_teacher_step``)."""
        teacher_state.ema_teacher_step(
            teacher_module=self.ref.engine.module, student_module=self.actor.engine.module,
            teacher_head_VH=self._teacher_head_VH, hf_config=self.actor.model_config.hf_config,
            decay=self.opsd.teacher.ema_decay, grad_norm=grad_norm,
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data):
        """verl's actor update; for an OPSD batch the frozen teacher runs first, here, on this rank's
        rows: no teacher hidden state ever leaves the worker.

        The trainer sends each row's teacher input (``opsd_teacher_{input_ids, attention_mask,
        position_ids}``: teacher prompt + the student's response ids, left/right padded; Purified
        OPSD also ``opsd_reference_*``) with the actor batch, so verl's dispatch gives every dp rank
        the teacher inputs of its own rows. The teacher's hidden states at the response positions
        (and, for ``advt:K``, the loss mask from its ranks of the sampled tokens) are added to the
        batch before verl's mini-batch loop; ``timing_s/teacher`` (max over ranks) is added to the
        update's metrics.
        """
        if tu.get_non_tensor_data(data=data, key=OPSD_FORWARD_KEY, default=None) != "student_loss":
            return super().update_actor(data)
        teacher_sums = None
        if tu.get_non_tensor_data(data=data, key=TEACHER_FINGERPRINT_KEY, default=False):
            teacher_sums = self._teacher_param_sums()
        start = time.perf_counter()
        self._add_teacher_outputs(data)
        seconds = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=get_device_id())
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
        output = super().update_actor(data)
        if output is not None:
            metrics = tu.get(output, "metrics")
            metrics[TEACHER_TIME_METRIC] = float(seconds)
            if teacher_sums is not None:
                metrics["opsd/teacher_param_checksum"], metrics["opsd/teacher_param_sqsum"] = teacher_sums
        return output

    def _teacher_param_sums(self) -> list[float] | None:
        """float64 (sum, sum of squares) of the weights that score this step, taken right before the
        teacher forward: the reference copy (a second copy), the actor module (the teacher is the student);
        None for the LoRA base-weights teacher (the actor's base weights, adapters disabled: no own copy)."""
        if self.ref is not None:
            return teacher_state.sharded_param_sums(self.ref.engine.module.parameters())
        if self.opsd.teacher.kind_flags.is_student:
            return teacher_state.sharded_param_sums(self.actor.engine.module.parameters())
        return None

    def _add_teacher_outputs(self, data) -> None:
        from recipe.opsd.core.positions import select_positions

        loss = self.opsd.loss
        rank = loss.position_kind == "advt"
        teacher = self._teacher_forward(data, TEACHER_INPUT_PREFIX, rank_chunk=loss.chunk_size if rank else None)
        data["teacher_hidden"] = teacher["teacher_hidden"]
        if rank:  # AdvT: positions where the teacher ranks the sampled token in its top K
            data["loss_mask"] = select_positions(
                loss.positions, response_mask_BT=data["response_mask"].bool(), teacher_rank_BT=teacher["teacher_rank"]
            )
        if self.objective.needs_reference_forward:
            data["reference_hidden"] = self._teacher_forward(data, REFERENCE_INPUT_PREFIX)["teacher_hidden"]

    def _teacher_forward(self, data, prefix: str, *, rank_chunk: int | None = None) -> dict:
        """Final hidden states [b, R, H] of the frozen teacher on the inputs ``prefix*`` of ``data``
        (popped) at the positions predicting the response, and ``teacher_rank`` [b, R] if ``rank_chunk``."""
        from verl import DataProto
        from verl.workers.utils.padding import left_right_2_no_padding

        tensors = {field: data.pop(prefix + field) for field in TEACHER_INPUT_FIELDS}
        for key in ("responses", "response_mask", RESPONSE_LENGTHS_KEY):
            tensors[key] = data[key]
        teacher = left_right_2_no_padding(
            DataProto.from_dict(tensors=tensors, meta_info={"temperature": tu.get(data, "temperature")}).to_tensordict()
        )
        tu.assign_non_tensor(teacher, **{OPSD_FORWARD_KEY: "teacher_hidden", "compute_loss": False})
        if rank_chunk is not None:
            tu.assign_non_tensor(teacher, **{TEACHER_RANK_CHUNK_KEY: int(rank_chunk)})
        if self.ref is not None:
            output = self.ref.infer_batch(data=teacher)
        else:  # the actor module: the student itself (as it is now) or LoRA's base weights (adapters disabled)
            teacher_state.fsdp2_lazy_init(self.actor.engine.module)
            if self.opsd.teacher.kind_flags.lora_base_weights:
                tu.assign_non_tensor(teacher, no_lora_adapter=True)
            output = self.actor.infer_batch(teacher)
        keys = ("teacher_hidden", "teacher_rank") if rank_chunk is not None else ("teacher_hidden",)
        return {key: torch.stack(list(tu.get(output, key).unbind())) for key in keys}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_ema_teacher(self, folder: str) -> None:
        """A kind that follows_student: this rank's shards of the EMA teacher into the checkpoint ``folder``
        (``teacher_state``)."""
        if self.opsd.teacher.kind_flags.follows_student:
            teacher_state.save_ema_teacher(folder, teacher_module=self.ref.engine.module,
                                           teacher_head_VH=self._teacher_head_VH)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_ema_teacher(self, folder: str) -> None:
        """A kind that follows_student, on resume: the EMA teacher saved with the checkpoint (verl restores the
        actor only)."""
        teacher_state.load_ema_teacher(folder, teacher_module=self.ref.engine.module,
                                       teacher_head_VH=self._teacher_head_VH)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def param_checksums(self) -> dict:
        """float64 sum and sum of squares of the actor's parameters (``trainer.log_fingerprints``:
        tests and drift checks), ``{"actor": [sum, sqsum]}``, equal on every rank. The teacher's are
        taken at its forward (``update_actor`` with ``opsd_teacher_fingerprint``)."""
        return {"actor": teacher_state.sharded_param_sums(self.actor.engine.module.parameters())}


    # ------------------------------------------------------------------ pre-flight gate, the workers' part
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def preflight_divergence(self, tensors: dict, temperature: float) -> dict:
        """The pre-flight gate's model-level part (``recipe.opsd.core.preflight``, docs/opsd_recipe.md
        "Start-up checks"), at the start of training, on every rank with the same few rows (FSDP needs
        every rank in each forward; the rows are a handful).

        ``tensors``: a verl-layout batch (``input_ids``, ``attention_mask``, ``position_ids``: the student
        prompt left-padded + the teacher-forced response right-padded; ``responses``, ``response_mask``,
        ``opsd_response_lengths``) with each row's teacher input (``opsd_teacher_*``) and its row index
        (``PREFLIGHT_ROW_KEY``). The teacher runs as in training (``_teacher_forward``), the student as in
        training (the ``student_loss`` forward, its loss function replaced by one that scores the rows
        with ``preflight.first_position_values`` and returns 0). Returns ``divergence``, ``fwd_kl``,
        ``control`` [B, R] (float64, 0 off the response) and ``dtype`` (of the hidden states).
        """
        from verl import DataProto
        from verl.workers.utils.padding import left_right_2_no_padding

        data = left_right_2_no_padding(
            DataProto.from_dict(tensors=dict(tensors), meta_info={"temperature": float(temperature)}).to_tensordict()
        )
        data["teacher_hidden"] = self._teacher_forward(data, TEACHER_INPUT_PREFIX)["teacher_hidden"]
        tu.assign_non_tensor(data, **{OPSD_FORWARD_KEY: "student_loss"}, compute_loss=True)
        store: dict = {"rows": []}
        training_loss = self.actor.loss_fn
        self.actor.set_loss_fn(partial(
            _preflight_loss, loss_config=self.opsd.loss, teacher_weight_VH=training_loss.keywords["teacher_weight_VH"],
            store=store,
        ))
        teacher_state.fsdp2_lazy_init(self.actor.engine.module)
        try:
            self.actor.infer_batch(data)
        finally:
            self.actor.set_loss_fn(training_loss)
        shape = tuple(tensors["responses"].shape)
        out = {key: torch.zeros(shape, dtype=torch.float64) for key in ("divergence", "fwd_kl", "control")}
        for rows_b, values in store["rows"]:
            for key in out:
                out[key][rows_b] = values[key]
        out["dtype"] = store.get("dtype", "float32")
        return out


def _preflight_loss(model_output, data, dp_group=None, *, loss_config, teacher_weight_VH, store):
    """The pre-flight gate's stand-in for ``actor_loss.opsd_loss`` (same inputs, same head handling):
    records each row's ``preflight.first_position_values`` in ``store["rows"]`` and returns 0."""
    from recipe.opsd.core.preflight import first_position_values

    hidden_bRH, student_weight_VH, student_bias_V, teacher_weight, teacher_bias = loss_heads(
        model_output, teacher_weight_VH=teacher_weight_VH)
    dtype, device = hidden_bRH.dtype, hidden_bRH.device
    mask_bR = data["response_mask"].bool().to(device)
    values = first_position_values(
        hidden_bRH[mask_bR], student_weight_VH, data["teacher_hidden"].to(device=device, dtype=dtype)[mask_bR],
        teacher_weight, data["responses"].to(device).long()[mask_bR], student_bias=student_bias_V,
        teacher_bias=teacher_bias, beta=loss_config.beta, clip_tau=loss_config.clip_tau,
        student_temperature=loss_config.student_temperature,
        teacher_temperature=loss_config.effective_teacher_temperature, topk=loss_config.topk,
        chunk_size=loss_config.chunk_size,
    )
    rows = {}
    for key, values_N in values.items():
        rows[key] = torch.zeros(mask_bR.shape, dtype=torch.float64)
        rows[key][mask_bR.cpu()] = values_N.double().cpu()
    store["rows"].append((data[PREFLIGHT_ROW_KEY].long().cpu(), rows))
    store["dtype"] = str(dtype).removeprefix("torch.")
    return hidden_bRH.new_zeros(()), {}


def worker_class_for(opsd_config: dict, *, base: type = OPSDActorRolloutRefWorker) -> type:
    """A subclass of ``base`` (``OPSDActorRolloutRefWorker`` or a subclass of it) carrying the ``opsd:`` block
    (pickled to Ray by value); a teacher kind that loads_path: its reference slot loads ``opsd.teacher.path``."""
    from recipe.opsd.core.teacher_kinds import DEFAULT_TEACHER_KIND, teacher_kind

    attrs = {"opsd_config": dict(opsd_config)}
    teacher = dict(opsd_config.get("teacher") or {})
    if teacher_kind(teacher.get("kind", DEFAULT_TEACHER_KIND)).loads_path:
        attrs["ref_worker_cls"] = type(
            "OPSDTeacherCheckpointWorker", (OPSDTrainingWorker,), {"model_path_override": str(teacher["path"])}
        )
    return type("OPSDWorker", (base,), attrs)
