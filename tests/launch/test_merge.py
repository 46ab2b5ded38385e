"""recipe.launch.merge: which shards a checkpoint path designates, and nothing overwritten."""

import pytest

from recipe.launch.merge import main, merge_checkpoint, shard_dir


def _shards(path):
    path.mkdir(parents=True)
    (path / "model_world_size_1_rank_0.pt").write_bytes(b"")
    return path


def test_run_directory_resolves_to_the_latest_actor_shards(tmp_path):
    _shards(tmp_path / "run" / "global_step_2" / "actor")
    latest = _shards(tmp_path / "run" / "global_step_4" / "actor")
    (tmp_path / "run" / "latest_checkpointed_iteration.txt").write_text("4\n")
    assert shard_dir(tmp_path / "run") == latest
    assert shard_dir(tmp_path / "run" / "global_step_2") == tmp_path / "run" / "global_step_2" / "actor"
    sft = _shards(tmp_path / "sft" / "global_step_3")  # SFT: shards at the step's top level
    assert shard_dir(sft) == sft


def test_missing_shards_and_existing_targets_are_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no FSDP shards"):
        shard_dir(tmp_path / "empty")
    shards = _shards(tmp_path / "ckpt")
    (tmp_path / "target").mkdir()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        merge_checkpoint(shards, tmp_path / "target")
    assert main([str(shards), str(tmp_path / "target")]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["only-one"]) == 2
