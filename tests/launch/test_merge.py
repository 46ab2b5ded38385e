"""recipe.launch.merge: which shards a checkpoint path designates, partial saves refused, nothing overwritten."""

import json
import shutil

import pytest
import torch

from recipe.common.cli import InputError
from recipe.launch.merge import main, merge_checkpoint, shard_dir
from recipe.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _save(path, tiny):
    """A complete one-rank verl save at ``path``: shard, fsdp_config.json, huggingface/ config + tokenizer."""
    path.mkdir(parents=True)
    torch.save({"w": torch.zeros(2)}, path / "model_world_size_1_rank_0.pt")
    (path / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    (path / "huggingface").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, path / "huggingface" / name)
    return path


def test_run_directory_resolves_to_the_latest_actor_shards(tmp_path, tiny):
    _save(tmp_path / "run" / "global_step_2" / "actor", tiny)
    latest = _save(tmp_path / "run" / "global_step_4" / "actor", tiny)
    (tmp_path / "run" / "latest_checkpointed_iteration.txt").write_text("4\n")
    assert shard_dir(tmp_path / "run") == latest
    assert shard_dir(tmp_path / "run" / "global_step_2") == tmp_path / "run" / "global_step_2" / "actor"
    sft = _save(tmp_path / "sft" / "global_step_3", tiny)  # SFT: shards at the step's top level
    assert shard_dir(sft) == sft


def test_partial_saves_and_existing_targets_are_refused(tmp_path, tiny, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no FSDP model shards"):
        shard_dir(tmp_path / "empty")
    partial = _save(tmp_path / "partial", tiny)
    (partial / "fsdp_config.json").unlink()  # verl writes it last: the save was interrupted
    with pytest.raises(InputError, match="no fsdp_config.json"):
        merge_checkpoint(partial, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    shards = _save(tmp_path / "ckpt", tiny)
    (tmp_path / "target").mkdir()
    with pytest.raises(InputError, match="exists"):
        merge_checkpoint(shards, tmp_path / "target")
    assert main(["only-one"]) == 2
