"""verl glue for OPSD: the frozen teacher role and the hidden-state forward of the actor.

The teacher is verl's reference policy: ``ActorRolloutRefWorker`` already builds, in the same
worker processes as the actor, a frozen FSDP copy of the initial student loaded from the same
checkpoint (``actor_rollout_ref.model.path``), never given an optimizer, its parameters in host
memory (verl's forward-only FSDP2 engine always uses ``CPUOffloadPolicy``). In LoRA mode verl builds no second copy and
the teacher is the actor with its adapters disabled. We reuse that role instead of a separate pool
(a separate pool would need its own GPUs or a second colocated worker group, and ship its output
through the driver); what OPSD changes is what the forward returns:

- ``OPSDEngineMixin.forward_step`` (mixed into the FSDP engine of both actor and teacher when a
  micro-batch carries ``opsd_forward``) runs the unchanged HF model, captures the FINAL hidden
  states (the output of the decoder after its final norm = the lm_head input) with a forward hook,
  asks HF for the logits of one position only (``logits_to_keep=1``, so no [N, V] tensor), and
  gathers the hidden states that predict the response tokens: ``[B, R, H]``.
  * ``opsd_forward="teacher_hidden"``: returns them (teacher, no grad); with
    ``opsd_teacher_rank_chunk_size`` set it also returns ``teacher_rank`` [B, R], the rank of each
    sampled token under the teacher's own lm_head (``signals.sampled_token_rank_from_hidden``,
    computed in place of that lm_head, chunked; for ``positions: advt:K``).
  * ``opsd_forward="student_loss"``: hands them, with the live lm_head weight (an FSDP2 DTensor
    gathered with ``full_tensor()``, which is differentiable), to the loss function
    (``recipe.opsd.actor_loss.opsd_loss``). With SFT rows in the micro-batch
    (``opsd.objective.sft_weight`` > 0) a first student forward on them gives ``sft_hidden`` (with
    grad), handed to the same loss function: one loss, one backward through both forwards.
  Without ``opsd_forward`` the stock verl forward runs (log-probs for validation tools etc.).
- ``OPSDActorRolloutRefWorker`` uses that engine for actor and teacher, sets the OPSD loss with a
  frozen copy of the initial lm_head (read once from the initial checkpoint; in LoRA mode the
  lm_head is not adapted, so the live one is the initial one), and runs the teacher forward inside
  ``update_actor``, on the rows verl dispatched to the rank, right before the update: the teacher's
  hidden states [B, R, H] never travel through the driver (only its input ids do).

Only FSDP2 without Ulysses sequence parallelism is supported (checked at start).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from functools import partial

import torch
from torch.distributed.tensor import DTensor

from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id, get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from recipe.common.heads import checkpoint_lm_head, output_logit_scale, response_rows
from recipe.opsd.actor_loss import (
    LOSS_SEQUENCES_KEY,
    RESPONSE_TOKENS_KEY,
    SFT_INPUT_PREFIX,
    SFT_TOKENS_KEY,
    loss_heads,
    opsd_loss,
)
from recipe.opsd.nonfinite import TEST_NAN_TEACHER_KEY, SkipNonFiniteLossMixin
from recipe.opsd.signals import sampled_token_rank_from_hidden
from recipe.opsd.teacher_kinds import EMA_TEACHER_DIR

OPSD_FORWARD_KEY = "opsd_forward"
RESPONSE_LENGTHS_KEY = "opsd_response_lengths"
# set on a teacher batch (to the chunk size) to also get the teacher rank of each sampled token
TEACHER_RANK_CHUNK_KEY = "opsd_teacher_rank_chunk_size"
# the teacher's inputs travel with the actor batch: <prefix><field> tensors [B, T_teacher], left/right
# padded (recipe.opsd.teacher_inputs.TeacherInputs.spliced); the reference-only ones for Purified OPSD
TEACHER_INPUT_PREFIX = "opsd_teacher_"
REFERENCE_INPUT_PREFIX = "opsd_reference_"
TEACHER_INPUT_FIELDS = ("input_ids", "attention_mask", "position_ids")
# set on the actor batch (trainer.log_fingerprints) to get the float64 sums of the teacher's weights
# taken right before its forward: opsd/teacher_param_{checksum,sqsum}
TEACHER_FINGERPRINT_KEY = "opsd_teacher_fingerprint"
# wall time of the teacher forward inside update_actor (max over ranks), reported with the update's metrics
TEACHER_TIME_METRIC = "timing_s/teacher"


def _unwrap_causal_lm(module):
    """The HF causal LM inside FSDP / PEFT wrappers (FSDP2 keeps the module object itself)."""
    if hasattr(module, "get_base_model"):  # peft.PeftModel
        module = module.get_base_model()
    return module


@contextlib.contextmanager
def capture_final_hidden(module):
    """Record the decoder's output (post final norm, the lm_head input) during one forward."""
    store = {}
    decoder = _unwrap_causal_lm(module).get_decoder()

    def hook(_mod, _inputs, output):
        store["hidden"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]

    handle = decoder.register_forward_hook(hook)
    try:
        yield store
    finally:
        handle.remove()


class OPSDEngineMixin:
    """Mixed into verl's FSDP LM engine class: an OPSD forward that works on final hidden states."""

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        if tu.get_non_tensor_data(data=data, key=OPSD_FORWARD_KEY, default=None) == "student_loss":
            # over the whole mini-batch (all dp ranks): response tokens (the normaliser of the
            # token-mean diagnostics) and rollouts with at least one loss position (of the
            # per-rollout aggregation modes), so that neither depends on the micro-batch split
            counts = torch.stack([data["response_mask"].sum(), (data["loss_mask"].sum(-1) > 0).sum()])
            counts = counts.to(get_device_id())
            torch.distributed.all_reduce(counts, group=self.get_data_parallel_group())
            tu.assign_non_tensor(
                data, **{RESPONSE_TOKENS_KEY: int(counts[0].item()), LOSS_SEQUENCES_KEY: int(counts[1].item())}
            )
            self._opsd_count_sft_tokens(data)
        return super().forward_backward_batch(data, loss_function, forward_only=forward_only)

    # --- the SFT term (opsd.objective.sft_weight): a second student forward on the opsd_sft_* rows
    def _opsd_count_sft_tokens(self, data) -> None:
        """``opsd_sft_tokens``: the solution tokens of the whole mini-batch (all dp ranks), the SFT
        term's normaliser, so that it does not depend on the micro-batch split (no SFT rows: nothing)."""
        if SFT_INPUT_PREFIX + "response_mask" not in data.keys():
            return
        tokens = data[SFT_INPUT_PREFIX + "response_mask"].sum().to(get_device_id())
        torch.distributed.all_reduce(tokens, group=self.get_data_parallel_group())
        tu.assign_non_tensor(data, **{SFT_TOKENS_KEY: int(tokens.item())})

    def _opsd_sft_hidden(self, micro_batch, autocast_ctx):
        """Final hidden states [b, S, H] of the student, with grad, on the micro-batch's SFT rows (student
        prompt + solution + EOS) at the positions predicting each solution token; None without SFT rows.

        A forward of its own (HF computes the logits of one position only; the hidden states reach the
        loss function of the main forward, which scores them with the live lm_head), so one backward
        of the summed loss runs through both forwards."""
        if SFT_INPUT_PREFIX + "response_mask" not in micro_batch.keys():
            return None
        from verl import DataProto
        from verl.workers.utils.padding import left_right_2_no_padding

        tensors = {field: micro_batch[SFT_INPUT_PREFIX + field]
                   for field in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")}
        tensors[RESPONSE_LENGTHS_KEY] = tensors["response_mask"].sum(-1)
        rows = left_right_2_no_padding(DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}).to_tensordict())
        for key in ("use_remove_padding", "pad_mode", "use_fused_kernels"):
            value = tu.get_non_tensor_data(data=micro_batch, key=key, default=None)
            if value is not None:
                tu.assign_non_tensor(rows, **{key: value})
        model_inputs, _ = self.prepare_model_inputs(micro_batch=rows)
        with autocast_ctx, capture_final_hidden(self.module) as store:
            self.module(**model_inputs, use_cache=False, logits_to_keep=1)
        return _response_hidden(store["hidden"], micro_batch=rows, packed=model_inputs["attention_mask"] is None)

    def optimizer_step(self):
        grad_norm = super().optimizer_step()
        after_step = getattr(self, "opsd_after_optimizer_step", None)
        if after_step is not None:  # teacher kind ema: the teacher follows the student
            after_step(grad_norm)
        return grad_norm

    def forward_step(self, micro_batch, loss_function, forward_only):
        mode = tu.get_non_tensor_data(data=micro_batch, key=OPSD_FORWARD_KEY, default=None)
        if mode is None:
            return super().forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
        if mode not in ("teacher_hidden", "student_loss"):
            raise ValueError(f"{OPSD_FORWARD_KEY} must be teacher_hidden or student_loss, got {mode!r}")
        if getattr(self, "use_ulysses_sp", False):
            raise NotImplementedError("OPSD hidden-state forward does not support Ulysses sequence parallelism")

        micro_batch = micro_batch.to(get_device_id())
        model_inputs, _ = self.prepare_model_inputs(micro_batch=micro_batch)
        autocast_dtype = getattr(self, "_autocast_dtype", torch.bfloat16)
        autocast_ctx = (
            contextlib.nullcontext()
            if autocast_dtype == torch.float32
            else torch.autocast(device_type=get_device_name(), dtype=autocast_dtype)
        )
        response_hidden = partial(_response_hidden, micro_batch=micro_batch, packed=model_inputs["attention_mask"] is None)

        head = _unwrap_causal_lm(self.module).get_output_embeddings()
        captured = {}

        scale = output_logit_scale(self.model_config.hf_config)

        def head_params():
            """The head as the model applies it: logits = h @ weight.T + bias (scale folded in)."""
            weight = head.weight.full_tensor() if isinstance(head.weight, DTensor) else head.weight
            bias = head.bias
            bias = bias.full_tensor() if isinstance(bias, DTensor) else bias
            if scale != 1.0:
                weight = weight * scale
                bias = None if bias is None else bias * scale
            return weight, bias

        if mode == "teacher_hidden":
            rank_chunk = tu.get_non_tensor_data(data=micro_batch, key=TEACHER_RANK_CHUNK_KEY, default=None)
            if rank_chunk is None:  # hidden states only: HF computes the logits of one position
                with autocast_ctx, capture_final_hidden(self.module) as store:
                    self.module(**model_inputs, use_cache=False, logits_to_keep=1)
            else:
                # AdvT: the rank of each sampled token under the teacher's own lm_head, computed in
                # place of that lm_head (inside the forward, where FSDP has its weight gathered)
                def rank_head(hidden):
                    with torch.autocast(device_type=get_device_name(), enabled=False):
                        weight, bias = head_params()
                        mask_bR = micro_batch["response_mask"].bool()
                        rank_N = sampled_token_rank_from_hidden(
                            response_hidden(hidden)[mask_bR], weight, micro_batch["responses"][mask_bR],
                            bias=bias, chunk_size=int(rank_chunk),
                        )
                        captured["rank"] = torch.zeros(mask_bR.shape, dtype=rank_N.dtype, device=rank_N.device)
                        captured["rank"][mask_bR] = rank_N
                    return hidden.new_zeros(1, 1, 1)

                head.forward = rank_head
                try:
                    with autocast_ctx, capture_final_hidden(self.module) as store:
                        self.module(**model_inputs, use_cache=False, logits_to_keep=0)
                finally:
                    del head.forward
            model_output = {"teacher_hidden": response_hidden(store["hidden"]).detach()}
            if "rank" in captured:
                model_output["teacher_rank"] = captured["rank"]
            return torch.zeros((), device=store["hidden"].device), {
                "model_output": model_output,
                "loss": 0.0,
                "metrics": {},
            }

        sft_hidden = self._opsd_sft_hidden(micro_batch, autocast_ctx)  # opsd.objective.sft_weight > 0 only
        # Student: the loss is computed INSIDE the model's forward, in place of its lm_head, so that
        # FSDP2 sees it as the forward output (its backward hooks re-gather the lm_head weight).
        # With logits_to_keep=0 the lm_head input is the final hidden state of every position.
        # The model then multiplies its head's output by `scale` (Falcon-H1, Granite, Cohere), so the
        # head hands it loss / scale: the output, its gradients and actor/grad_norm are the loss's.
        def loss_head(hidden):
            with torch.autocast(device_type=get_device_name(), enabled=False):
                weight, bias = head_params()
                model_output = {"student_hidden": response_hidden(hidden), "student_weight": weight, "student_bias": bias}
                if sft_hidden is not None:
                    model_output["sft_hidden"] = sft_hidden
                loss, captured["metrics"] = loss_function(
                    model_output=model_output, data=micro_batch, dp_group=self.get_data_parallel_group()
                )
            captured["loss"] = loss.detach()
            return (loss / scale).reshape(1, 1, 1)

        head.forward = loss_head
        try:
            with autocast_ctx:
                output = self.module(**model_inputs, use_cache=False, logits_to_keep=0)
        finally:
            del head.forward
        loss = output.logits.reshape(())
        _check_head_output(loss.detach(), captured["loss"], self.model_config.hf_config)
        return loss, {"model_output": {}, "loss": loss.detach().item(), "metrics": captured["metrics"]}


def _check_head_output(output, loss, hf_config) -> None:
    """The model's output must be the loss its head returned: a model that transforms the head's
    output in a way ``output_logit_scale`` does not know would silently train on another loss."""
    # equal_nan: a non-finite loss is the non-finite guard's business (recipe.opsd.nonfinite), not a head mismatch
    if not torch.allclose(output.double(), loss.double(), rtol=1e-4, atol=1e-12, equal_nan=True):
        raise RuntimeError(
            f"{type(hf_config).__name__}: the model transforms its lm_head output beyond the linear scale "
            f"recipe.common.heads.output_logit_scale knows ({output_logit_scale(hf_config)}): the loss returned "
            f"by the head is {float(loss):.6g}, the model output {float(output):.6g}; teach output_logit_scale "
            "this model's head before training it with OPSD"
        )


def opsd_loss_function(
    loss_config, model_config, *, frozen_teacher_head: bool, teacher_model_config=None, head_dtype=None, objective=None
):
    """The actor's verl loss function: ``actor_loss.opsd_loss`` with the teacher's lm_head.

    ``frozen_teacher_head``: a copy of the teacher's lm_head, read once from its checkpoint
    (``teacher_model_config``, default ``model_config``: ``actor_rollout_ref.model.path``; a
    directory or a Hub id), with that model's head scale folded in; False (LoRA, teacher kind live):
    the live lm_head, detached. ``head_dtype``: the copy's dtype (default: the checkpoint's; the EMA
    teacher keeps float32). Soft-capped heads are refused here, at start.
    ``objective``: ``recipe.opsd.objectives.ObjectiveWeights`` (None: the divergence alone).
    """
    output_logit_scale(model_config.hf_config)  # the student's head too: refuse soft-capping now
    head = None
    if frozen_teacher_head:
        head = teacher_head(teacher_model_config or model_config)
        head = head if head_dtype is None else head.to(head_dtype)
    return partial(opsd_loss, loss_config=loss_config, teacher_weight_VH=head, objective=objective)


def teacher_head(model_config) -> torch.Tensor:
    """The lm_head weight [V, H] of ``model_config``'s checkpoint as the model applies it (head scale
    folded in), on this worker's device."""
    scale = output_logit_scale(model_config.hf_config)
    return checkpoint_lm_head(
        model_config.local_path,
        tie_word_embeddings=bool(getattr(model_config.hf_config, "tie_word_embeddings", False)),
    ).to(get_device_id()) * scale


def _response_hidden(hidden, *, micro_batch, packed: bool):
    """[b, R, H] hidden states predicting each response token, zero where there is no token."""
    seq_lens_b = micro_batch["input_ids"].offsets().diff()
    if packed:  # [1, total_nnz (+pad), H]
        starts_b = micro_batch["input_ids"].offsets()[:-1]
    else:  # [b, Lmax, H], right-padded
        starts_b = torch.arange(hidden.shape[0], device=hidden.device) * hidden.shape[1]
    rows_bR, valid_bR = response_rows(
        starts_b=starts_b.to(hidden.device),
        seq_lens_b=seq_lens_b,
        response_lens_b=micro_batch[RESPONSE_LENGTHS_KEY],
        max_response_len=micro_batch["response_mask"].shape[-1],
    )
    hidden_NH = hidden.reshape(-1, hidden.shape[-1])
    return hidden_NH[rows_bR] * valid_bR.unsqueeze(-1).to(hidden_NH.dtype)


_ENGINE_CLASSES: dict[type, type] = {}


def opsd_engine_class(engine_cls: type) -> type:
    """``engine_cls`` with the OPSD forward and the non-finite-loss skip (``recipe.opsd.nonfinite``)
    mixed in (one subclass per engine class)."""
    if engine_cls not in _ENGINE_CLASSES:
        _ENGINE_CLASSES[engine_cls] = type(
            f"OPSD{engine_cls.__name__}", (OPSDEngineMixin, SkipNonFiniteLossMixin, engine_cls), {}
        )
    return _ENGINE_CLASSES[engine_cls]


class OPSDTrainingWorker(TrainingWorker):
    """verl's TrainingWorker whose engine (picked by verl's EngineRegistry) gets the OPSD forward.

    The engine object is created but not yet initialised in ``TrainingWorker.__init__``; we only
    swap its class for the subclass with the mixin, so every engine setting verl chose stays.
    """

    # teacher kind checkpoint (set on the reference slot's class by ``worker_class_for``): the model
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
    """Actor + rollout + frozen teacher (verl's ref) with the OPSD loss and teacher hidden states."""

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
        from recipe.opsd.config import OPSDConfig

        if self.opsd_config is None:
            raise ValueError("OPSDActorRolloutRefWorker needs the opsd config: build it with worker_class_for(opsd)")
        self.opsd = OPSDConfig.from_hydra(self.opsd_config)
        # the teacher head: a copy read from the teacher's checkpoint when the teacher is a second copy
        # (ref slot: frozen_initial, checkpoint, ema); the live lm_head, detached, when the teacher is
        # the actor module (LoRA frozen_initial: the lm_head is not adapted; live: the student's head)
        teacher_config = self.ref.model_config if self.ref is not None else None
        if self.opsd.teacher.kind == "checkpoint":
            self._check_teacher_tokenizer(teacher_config)
        loss_fn = opsd_loss_function(
            self.opsd.loss, self.actor.model_config, frozen_teacher_head=self.ref is not None,
            teacher_model_config=teacher_config, head_dtype=torch.float32 if self.opsd.teacher.kind == "ema" else None,
            objective=self.opsd.objective.weights,
        )
        self.actor.set_loss_fn(loss_fn)
        if self.opsd.teacher.kind == "ema":
            self._teacher_head_VH = loss_fn.keywords["teacher_weight_VH"]
            self.actor.engine.opsd_after_optimizer_step = self._ema_teacher_step

    def _check_teacher_tokenizer(self, teacher_config) -> None:
        """kind checkpoint: the teacher's tokenizer and vocabulary size are the student's (also
        checked before Ray for local models; here for Hub ids, after the download)."""
        from recipe.common.checkpoints import check_same_model
        from recipe.common.heads import local_checkpoint_dir
        from recipe.opsd.teacher_kinds import TEACHER_SAME_KEYS

        # local_path is a Hub id for Hub models: their files are in the local cache by now
        student, teacher = (local_checkpoint_dir(c.local_path) for c in (self.actor.model_config, teacher_config))
        check_same_model(student, teacher, keys=TEACHER_SAME_KEYS)

    def _ema_teacher_step(self, grad_norm) -> None:
        """kind ema, after every optimizer step of the actor: teacher <- d * teacher + (1 - d) * student,
        on the local FSDP shards of the reference copy (same sharding as the actor's) and on the
        teacher head copy the loss reads (the actor's full lm_head, scale folded in). A skipped step
        (non-finite gradient norm: verl leaves the student unchanged) leaves the teacher unchanged too."""
        from recipe.opsd.teacher_kinds import ema_update_, ema_update_all_

        if not math.isfinite(float(grad_norm)):
            return
        decay = self.opsd.teacher.ema_decay
        student = dict(self.actor.engine.module.named_parameters())
        pairs = []
        for name, teacher_param in self.ref.engine.module.named_parameters():
            if name not in student:
                raise RuntimeError(f"EMA teacher: the student has no parameter {name!r}")
            student_param = student[name]
            if isinstance(teacher_param, DTensor) != isinstance(student_param, DTensor) or (
                isinstance(teacher_param, DTensor) and teacher_param.placements != student_param.placements
            ):
                raise RuntimeError(f"EMA teacher: {name!r} is sharded differently in the teacher and the student")
            pairs.append((name, _local(teacher_param).data, _local(student_param).data))
        ema_update_all_(pairs, decay=decay)
        head = _unwrap_causal_lm(self.actor.engine.module).get_output_embeddings().weight
        with torch.no_grad():
            head_VH = head.full_tensor() if isinstance(head, DTensor) else head
            scale = output_logit_scale(self.actor.model_config.hf_config)
            ema_update_(self._teacher_head_VH, head_VH.detach() * scale, decay=decay)

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
        teacher forward: the reference copy (frozen_initial, checkpoint, ema), the actor module (live);
        None for the LoRA frozen teacher (the actor's base weights, adapters disabled: no own copy)."""
        if self.ref is not None:
            return sharded_param_sums(self.ref.engine.module.parameters())
        if self.opsd.teacher.kind == "live":
            return sharded_param_sums(self.actor.engine.module.parameters())
        return None

    def _add_teacher_outputs(self, data) -> None:
        from recipe.opsd.positions import select_positions

        loss = self.opsd.loss
        rank = loss.position_kind == "advt"
        teacher = self._teacher_forward(data, TEACHER_INPUT_PREFIX, rank_chunk=loss.chunk_size if rank else None)
        data["teacher_hidden"] = teacher["teacher_hidden"]
        if rank:  # AdvT: positions where the teacher ranks the sampled token in its top K
            data["loss_mask"] = select_positions(
                loss.positions, response_mask_BT=data["response_mask"].bool(), teacher_rank_BT=teacher["teacher_rank"]
            )
        if loss.variant == "purified":
            data["reference_hidden"] = self._teacher_forward(data, REFERENCE_INPUT_PREFIX)["teacher_hidden"]
        # TEST ONLY (recipe.opsd.nonfinite.TEST_NAN_TEACHER_ENV): a NaN teacher at the steps a test names
        if tu.get_non_tensor_data(data=data, key=TEST_NAN_TEACHER_KEY, default=False):
            data["teacher_hidden"] = data["teacher_hidden"] * float("nan")

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
        else:  # the actor module: live (as it is now) or LoRA frozen_initial (adapters disabled)
            _fsdp2_lazy_init(self.actor.engine.module)
            if self.opsd.teacher.kind != "live":
                tu.assign_non_tensor(teacher, no_lora_adapter=True)
            output = self.actor.infer_batch(teacher)
        keys = ("teacher_hidden", "teacher_rank") if rank_chunk is not None else ("teacher_hidden",)
        return {key: torch.stack(list(tu.get(output, key).unbind())) for key in keys}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_ema_teacher(self, folder: str) -> None:
        """kind ema: this rank's local shards of the EMA teacher and its head copy, to
        ``<folder>/opsd_ema_teacher/rank_<r>.pt`` (the checkpoint's ``global_step_<s>``)."""
        if self.opsd.teacher.kind != "ema":
            return
        state = {name: _local(param).detach().cpu().clone() for name, param in self.ref.engine.module.named_parameters()}
        state[EMA_HEAD_KEY] = self._teacher_head_VH.detach().cpu().clone()
        path = ema_teacher_file(folder, rank=torch.distributed.get_rank())
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_ema_teacher(self, folder: str) -> None:
        """kind ema, on resume: the EMA teacher saved with the checkpoint (verl restores the actor only;
        the reference copy was loaded from the initial model)."""
        path = ema_teacher_file(folder, rank=torch.distributed.get_rank())
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the checkpoint has no EMA teacher state (opsd.teacher.kind=ema)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        with torch.no_grad():
            for name, param in self.ref.engine.module.named_parameters():
                _local(param).copy_(state[name])
            self._teacher_head_VH.copy_(state[EMA_HEAD_KEY])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def param_checksums(self) -> dict:
        """float64 sum and sum of squares of the actor's parameters (``trainer.log_fingerprints``:
        tests and drift checks), ``{"actor": [sum, sqsum]}``, equal on every rank. The teacher's are
        taken at its forward (``update_actor`` with ``opsd_teacher_fingerprint``)."""
        return {"actor": sharded_param_sums(self.actor.engine.module.parameters())}


    # ------------------------------------------------------------------ pre-flight gate, the workers' part
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def preflight_divergence(self, tensors: dict, temperature: float) -> dict:
        """The pre-flight gate's model-level part (``recipe.opsd.preflight``, docs/opsd_recipe.md
        "Pre-flight gate"), at the start of training, on every rank with the same few rows (FSDP needs
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
        _fsdp2_lazy_init(self.actor.engine.module)
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
    from recipe.opsd.preflight import first_position_values

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


# the pre-flight batch's row index [B] (micro-batching may reorder rows)
PREFLIGHT_ROW_KEY = "opsd_preflight_row"

# kind ema: the teacher's state in every checkpoint (global_step_<s>/opsd_ema_teacher/rank_<r>.pt)
EMA_HEAD_KEY = "__opsd_teacher_head__"


def ema_teacher_file(folder, *, rank: int):
    from pathlib import Path

    return Path(folder) / EMA_TEACHER_DIR / f"rank_{rank}.pt"


def _local(param):
    return param.to_local() if isinstance(param, DTensor) else param


def sharded_param_sums(params, *, block: int = 1 << 22) -> list[float]:
    """float64 (sum, sum of squares) over ``params`` without gathering them.

    Each rank sums its local FSDP2 shards, ``block`` elements at a time (no float64 copy of a whole
    parameter: memory O(block)), then the sums are all-reduced over the mesh dimensions a parameter
    is sharded on (replicated dimensions hold copies and are not added). Every rank must call this
    with the same parameters in the same order (FSDP modules do).
    """
    totals: dict[tuple, torch.Tensor] = {}
    with torch.no_grad():
        for param in params:
            local, groups = param, ()
            if isinstance(param, DTensor):
                local = param.to_local()
                mesh = param.device_mesh
                groups = tuple(mesh.get_group(dim) for dim, p in enumerate(param.placements) if p.is_shard())
            acc = totals.setdefault(groups, torch.zeros(2, dtype=torch.float64, device=local.device))
            if acc.device != local.device:
                acc = totals[groups] = acc.to(local.device)
            for part in local.detach().reshape(-1).split(block):
                part = part.double()
                acc += torch.stack([part.sum(), (part * part).sum()])
    total = torch.zeros(2, dtype=torch.float64)
    for groups, acc in totals.items():
        acc = acc.to(get_device_id())
        for group in groups:
            torch.distributed.all_reduce(acc, group=group)
        total += acc.cpu()
    return total.tolist()


def _fsdp2_lazy_init(module) -> None:
    """Run FSDP2's lazy initialisation now, with the LoRA adapters trainable (idempotent).

    FSDP2 fixes each parameter group's gradient reduce dtype at its lazy init (the module's first
    forward) from the parameters that require grad at that moment. With LoRA the actor's first
    forward is the teacher's, under peft's ``disable_adapter`` (adapters' requires_grad False), which
    would leave the adapters' bf16 gradients un-cast at the first backward ("attempting to assign a
    gradient with dtype BFloat16 to a tensor with grad_dtype Float"). ``_lazy_init`` is FSDP2's own
    (private) entry point for this; re-check it on a torch upgrade.
    """
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is not None:
        get_state()._lazy_init()


def worker_class_for(opsd_config: dict) -> type:
    """An ``OPSDActorRolloutRefWorker`` subclass carrying the ``opsd:`` block (pickled to Ray by value);
    teacher kind checkpoint: its reference slot loads ``opsd.teacher.path``."""
    attrs = {"opsd_config": dict(opsd_config)}
    teacher = dict(opsd_config.get("teacher") or {})
    if teacher.get("kind") == "checkpoint":
        attrs["ref_worker_cls"] = type(
            "OPSDTeacherCheckpointWorker", (OPSDTrainingWorker,), {"model_path_override": str(teacher["path"])}
        )
    return type("OPSDWorker", (OPSDActorRolloutRefWorker,), attrs)
