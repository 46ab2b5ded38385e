"""User tools over the launcher: the first-hour GPU check and the SFT -> GRPO -> OPSD pipeline (scripts/)."""
