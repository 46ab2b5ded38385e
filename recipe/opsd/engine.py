"""verl glue: the OPSD forward of verl's FSDP engine, on final hidden states.

``OPSDEngineMixin`` is mixed into the FSDP LM engine class of both actor and teacher (``opsd_engine_class``;
the worker swaps the engine's class after verl built it). A micro-batch carrying ``opsd_forward`` runs the
unchanged HF model, captures the FINAL hidden states (the lm_head input) with a forward hook and never forms
[N, V]: ``teacher_hidden`` returns them (teacher, no grad), ``student_loss`` hands them with the live lm_head
weight to ``recipe.opsd.actor_loss.opsd_loss`` inside the forward (details: ``OPSDEngineMixin``). Without
``opsd_forward`` the stock verl forward runs. ``SkipNonFiniteLossMixin`` skips the optimizer step of a
mini-batch whose loss is not finite on any rank (``recipe.opsd.core.nonfinite``). Only FSDP2 without Ulysses
sequence parallelism is supported.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
from torch.distributed.tensor import DTensor

from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id, get_device_name

from recipe.common.heads import output_logit_scale, response_rows
from recipe.opsd.actor_loss import LOSS_SEQUENCES_KEY, RESPONSE_TOKENS_KEY, SFT_INPUT_PREFIX, SFT_TOKENS_KEY
from recipe.opsd.core.nonfinite import is_finite_number
from recipe.opsd.core.signals import sampled_token_rank_from_hidden

OPSD_FORWARD_KEY = "opsd_forward"
RESPONSE_LENGTHS_KEY = "opsd_response_lengths"
# set on a teacher batch (to the chunk size) to also get the teacher rank of each sampled token
TEACHER_RANK_CHUNK_KEY = "opsd_teacher_rank_chunk_size"


def unwrap_causal_lm(module):
    """The HF causal LM inside FSDP / PEFT wrappers (FSDP2 keeps the module object itself)."""
    if hasattr(module, "get_base_model"):  # peft.PeftModel
        module = module.get_base_model()
    return module


@contextlib.contextmanager
def capture_final_hidden(module):
    """Record the decoder's output (post final norm, the lm_head input) during one forward."""
    store = {}
    decoder = unwrap_causal_lm(module).get_decoder()

    def hook(_mod, _inputs, output):
        store["hidden"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]

    handle = decoder.register_forward_hook(hook)
    try:
        yield store
    finally:
        handle.remove()


class OPSDEngineMixin:
    """Mixed into verl's FSDP LM engine class: an OPSD forward that works on final hidden states.

    When a micro-batch carries ``opsd_forward`` it runs the unchanged HF model, captures the FINAL hidden
    states (the decoder's output after its final norm = the lm_head input) with a forward hook, asks HF for
    the logits of one position only (``logits_to_keep=1``, so no [N, V] tensor), and gathers the hidden
    states that predict the response tokens: ``[B, R, H]``.

    - ``opsd_forward="teacher_hidden"``: returns them (teacher, no grad); with
      ``opsd_teacher_rank_chunk_size`` set it also returns ``teacher_rank`` [B, R], the rank of each
      sampled token under the teacher's own lm_head (``signals.sampled_token_rank_from_hidden``, computed
      in place of that lm_head, chunked; for ``positions: advt:K``).
    - ``opsd_forward="student_loss"``: hands them, with the live lm_head weight (an FSDP2 DTensor gathered
      with ``full_tensor()``, which is differentiable), to the loss function
      (``recipe.opsd.actor_loss.opsd_loss``), computed INSIDE the model's forward in place of its lm_head
      so that FSDP2's backward hooks re-gather the weight. With SFT rows in the micro-batch
      (``opsd.loss.sft_weight`` > 0) a first student forward on them gives ``sft_hidden`` (with grad),
      handed to the same loss function: one loss, one backward through both forwards.
    """

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

    # --- the SFT term (opsd.loss.sft_weight): a second student forward on the opsd_sft_* rows
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

        head = unwrap_causal_lm(self.module).get_output_embeddings()
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

        sft_hidden = self._opsd_sft_hidden(micro_batch, autocast_ctx)  # opsd.loss.sft_weight > 0 only
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
    # equal_nan: a non-finite loss is the non-finite guard's business (recipe.opsd.core.nonfinite), not a head mismatch
    if not torch.allclose(output.double(), loss.double(), rtol=1e-4, atol=1e-12, equal_nan=True):
        raise RuntimeError(
            f"{type(hf_config).__name__}: the model transforms its lm_head output beyond the linear scale "
            f"recipe.common.heads.output_logit_scale knows ({output_logit_scale(hf_config)}): the loss returned "
            f"by the head is {float(loss):.6g}, the model output {float(output):.6g}; teach output_logit_scale "
            "this model's head before training it with OPSD"
        )


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
    """``engine_cls`` with the OPSD forward and the non-finite-loss skip (``recipe.opsd.core.nonfinite``)
    mixed in (one subclass per engine class)."""
    if engine_cls not in _ENGINE_CLASSES:
        _ENGINE_CLASSES[engine_cls] = type(
            f"OPSD{engine_cls.__name__}", (OPSDEngineMixin, SkipNonFiniteLossMixin, engine_cls), {}
        )
    return _ENGINE_CLASSES[engine_cls]


class SkipNonFiniteLossMixin:
    """Mixed into verl's FSDP engine: a training mini-batch whose loss is not finite on any dp rank
    gets no optimizer step (verl's own check covers a non-finite gradient norm only)."""

    _skip_nonfinite_update = False

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        output = super().forward_backward_batch(data, loss_function, forward_only=forward_only)
        if not forward_only:
            local_bad = not all(is_finite_number(loss) for loss in output.get("loss", []))
            flag = torch.tensor(float(local_bad), device=_device_of(self))
            group = self.get_data_parallel_group()
            if torch.distributed.is_initialized():
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
            self._skip_nonfinite_update = bool(flag.item())
        return output

    def optimizer_step(self):
        if self._skip_nonfinite_update:
            self._skip_nonfinite_update = False
            print("WARN: the loss is not finite: the optimizer step is skipped")
            self.optimizer.zero_grad()
            return float("nan")
        return super().optimizer_step()


def _device_of(engine):
    return get_device_id()
