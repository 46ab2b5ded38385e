"""The launcher library behind every run script: one environment contract (docs/launch.md)."""
