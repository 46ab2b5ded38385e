"""The CPU platform of verl 0.9.1: platform plugin, HF-generate rollout server, batched sampling (docs/cpu_path.md)."""
