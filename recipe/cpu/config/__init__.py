"""Hydra configs of the CPU path (group ``platform``), found through ``pkg://recipe.cpu.config``."""
