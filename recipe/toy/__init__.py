"""The toy world: one task generator, its data files and the SFT-trained toy student (docs/toy_world.md)."""
