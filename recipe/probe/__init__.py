"""The compatibility probe: its cells, frozen signals and K monitored steps, verdicts, the check against full runs
and the pre-registered test (docs/opsd_recipe.md "Compatibility probe"); nothing in the recipes imports it."""
