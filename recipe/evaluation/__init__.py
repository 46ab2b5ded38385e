"""The evaluation harness: decoding presets, sampling backends, metrics, reports (scripts/evaluate.py)."""
