"""Model builders: the tiny random Qwen3 of the tests and CPU demos (no download)."""
