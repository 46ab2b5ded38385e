"""verl rollout extensions for every device (GPU and CPU): the guarded vLLM weight push (docs/vllm_cpu.md)."""
