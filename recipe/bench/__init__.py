"""Bench-only code (loss kernels the benchmarks compare with): nothing in production imports it."""
