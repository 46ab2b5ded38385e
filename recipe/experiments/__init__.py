"""Experiments over the recipes: preset sweeps, toy-world studies. Nothing in recipe/ imports them."""
