"""Rollout backend ``hf`` for the CPU path: a batched Hugging Face ``generate`` server for verl 0.9.1.

verl's agent loop calls a rollout as a token-in/token-out server (``server.generate.remote(prompt_ids=...,
sampling_params=..., request_id=...)``) that receives the trainer's weights after every step; its vLLM,
SGLang and TRT-LLM servers need a GPU. The three pieces of a backend (as ``verl/workers/rollout/vllm_rollout/``):
``HFRolloutServer`` (a Ray actor serving concurrent requests as one left-padded batch,
``recipe.cpu.hf_generate``), ``HFReplica`` (one server per replica) and ``HFServerAdapter`` (in each
trainer worker: loads the trainer's full tensors into the server). Registered by ``recipe.cpu.plugin``;
docs/cpu_path.md.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any, Generator, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
import torch

from recipe.cpu.hf_generate import SampleParams, sample_batch
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

# Concurrent requests arriving within this window join the same generate() batch.
BATCH_WINDOW_S = 0.02


def server_actor_name(rollout_name: str, replica_rank: int, node_rank: int, suffix: str = "") -> str:
    """Ray actor name of a server; the adapter in the trainer worker looks it up by this name."""
    return f"{rollout_name}_server_{replica_rank}_{node_rank}{suffix}"


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SampleParams
    want_logprobs: bool
    future: asyncio.Future = field(repr=False)


class HFRolloutServer:
    """Ray actor: batched HF sampling with weights pushed from the trainer."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int, max_batch_size: int):
        from transformers import AutoModelForCausalLM

        from verl.utils.config import omega_conf_to_dataclass

        config = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.config = config
        self.replica_rank = replica_rank
        self.max_batch_size = max(1, int(max_batch_size))
        self.global_steps: Optional[int] = None
        self.num_batches = 0
        self.num_weight_updates = 0
        tokenizer = model_config.tokenizer
        generation_config = model_config.generation_config
        eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_token_ids = [int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos])]
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])
        # float32: on CPU there is no speed reason for bf16, and fp32 keeps the rollout
        # log-probs within ~1e-5 of the trainer's recomputation.
        self.model = AutoModelForCausalLM.from_pretrained(
            model_config.local_path,
            dtype=torch.float32,
            attn_implementation="sdpa",
            trust_remote_code=model_config.trust_remote_code,
        ).eval()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Request] | None = None
        self._batcher: asyncio.Task | None = None
        # Held while a batch generates or weights load, so the two never interleave.
        self._model_lock: asyncio.Lock | None = None

    def _ensure_batcher(self) -> None:
        """Start the batching loop on the running event loop (Ray's actor loop; a new one in tests)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._queue = asyncio.Queue()
            self._model_lock = asyncio.Lock()
            self._batcher = loop.create_task(self._serve_batches())

    def ready(self) -> bool:
        return True

    def _max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        # Same rule as verl's vLLM server (vllm_async_server.py:601-615).
        if "max_tokens" in sampling_params:
            max_tokens = int(sampling_params["max_tokens"])
        elif "max_new_tokens" in sampling_params:
            max_tokens = int(sampling_params["max_new_tokens"])
        else:
            max_tokens = min(
                self.config.response_length, self.config.prompt_length + self.config.response_length - prompt_len
            )
        return max(1, max_tokens)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise NotImplementedError("the hf CPU rollout is text-only")
        self._ensure_batcher()
        prompt_ids = [int(t) for t in prompt_ids]
        temperature = float(sampling_params.get("temperature", self.config.temperature))
        params = SampleParams(
            max_new_tokens=self._max_tokens(len(prompt_ids), sampling_params),
            temperature=temperature,
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1)),
            # verl's vLLM server: the request's ignore_eos, else the rollout config's
            ignore_eos=bool(sampling_params.get("ignore_eos", getattr(self.config, "ignore_eos", False))),
        )
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(prompt_ids, params, bool(sampling_params.get("logprobs", False)), future))
        return await future

    async def _serve_batches(self):
        while True:
            first = await self._queue.get()
            await asyncio.sleep(BATCH_WINDOW_S)
            pending = [first]
            while not self._queue.empty() and len(pending) < self.max_batch_size:
                pending.append(self._queue.get_nowait())
            groups: dict[tuple, list[_Request]] = {}
            for request in pending:
                params = request.params
                groups.setdefault((params.max_new_tokens, params.temperature, params.top_p, params.top_k,
                                   params.ignore_eos), []).append(request)
            for requests in groups.values():
                await self._run_batch(requests)

    async def _run_batch(self, requests: list[_Request]):
        seed = self.config.seed + 7919 * self.replica_rank + self.num_batches
        self.num_batches += 1
        try:
            async with self._model_lock:
                sampled = await asyncio.to_thread(
                    sample_batch,
                    self.model,
                    [r.prompt_ids for r in requests],
                    params=requests[0].params,
                    eos_token_ids=self.eos_token_ids,
                    pad_token_id=self.pad_token_id,
                    seed=seed,
                )
        except Exception as error:  # hand the failure to every waiting agent loop
            for request in requests:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        for row, request in enumerate(requests):
            request.future.set_result(
                TokenOutput(
                    token_ids=sampled.response_ids[row],
                    log_probs=sampled.logprobs[row] if request.want_logprobs else None,
                    stop_reason="completed",
                    extra_fields={"global_steps": self.global_steps, "finish_reason": sampled.finish_reasons[row]},
                )
            )

    async def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps: Optional[int] = None):
        """Load the trainer's full weights (HF names) into the served model."""
        self._ensure_batcher()
        async with self._model_lock:
            own = self.model.state_dict()
            unknown = sorted(set(state_dict) - set(own))
            missing = sorted(set(own) - set(state_dict))
            if unknown or missing:
                raise KeyError(f"weight sync: unknown keys {unknown[:5]}, missing keys {missing[:5]}")
            with torch.no_grad():
                for name, tensor in state_dict.items():
                    own[name].copy_(tensor.to(own[name].dtype))
            self.num_weight_updates += 1
        if global_steps is not None:
            self.global_steps = global_steps

    # Life-cycle calls verl makes on every server; nothing to free on CPU.
    async def wake_up(self, tags: Optional[list[str]] = None):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def abort_all_requests(self, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class HFReplica(RolloutReplica):
    """One ``server_class`` server per replica (tensor/pipeline parallel size must be 1).

    ``server_class`` names the server class a replica starts: a subclass can extend the server (the
    tests' rollout hooks do: ``tests/hooks/opsd_test_hooks``)."""

    server_class = HFRolloutServer

    async def launch_servers(self):
        if self.world_size != 1:
            raise ValueError(
                "the hf rollout runs one process per replica: set "
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline parallel 1), "
                f"got world size {self.world_size}"
            )
        name = server_actor_name(self.config.name, self.replica_rank, 0, self.name_suffix)
        max_batch = self.config.max_num_seqs
        placement = {}
        if getattr(self, "workers", None):  # on its FSDP worker's node, as verl's vLLM servers: one per node
            node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
            placement["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        server = (
            ray.remote(self.server_class)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency, **placement)
            .remote(self.config, self.model_config, self.replica_rank, max_batch)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


class HFServerAdapter(BaseRollout):
    """Trainer-side handle of the replica's server (one per FSDP rank; rank 0 of each replica sends)."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.is_sender = rank % rollout_world_size == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.config.name, self.replica_rank, 0))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        global_steps: Optional[int] = None,
        peft_config: Any = None,
        **kwargs,
    ):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout supports wire_format='named_tensors' only, got {wire_format!r}")
        if peft_config is not None:
            raise NotImplementedError("hf rollout: LoRA adapter sync is not supported; set model.lora.merge=True")
        # Every rank must drain the generator: FSDP full_tensor() is a collective.
        state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if not self.is_sender:
            return
        await self._server_handle().load_weights.remote(state_dict, global_steps)
