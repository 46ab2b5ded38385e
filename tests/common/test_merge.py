"""recipe.common.merge: which shards a checkpoint path designates, partial saves refused, nothing overwritten."""

import json
import shutil

import pytest
import torch

from recipe.common.cli import InputError, human_bytes
from recipe.common.merge import main, merge_checkpoint, merged_bytes, shard_dir
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


def _real_save(path, tiny):
    """A one-rank save holding the tiny model's weights (plain tensors: what verl's merger reads of rank 0)."""
    from transformers import AutoModelForCausalLM

    _save(path, tiny)
    torch.save(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).state_dict(),
               path / "model_world_size_1_rank_0.pt")
    for name in ("generation_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, path / "huggingface" / name)
    return path


def _merge(ckpt, target):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "recipe.common.merge", str(ckpt), str(target)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_a_full_disk_stops_the_merge_with_one_line_and_no_partial_output(tmp_path, tiny, small_fs):
    ckpt = _real_save(tmp_path / "ckpt", tiny)
    fs = small_fs(tmp_path / "fs", size=64 * 1024)
    refused = _merge(ckpt, fs.path / "merged")  # the merged model (~200 KB in bfloat16) cannot fit: before it starts
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"error: {fs.path}: no space left for the merged model merged: needs ~{human_bytes(merged_bytes(ckpt))}, "
        "64.0 KB free (free space there or choose another TARGET_DIR, then run the same command again)")
    assert list(fs.path.iterdir()) == []
    fs.resize(4 * 1024 * 1024, nr_inodes=4)  # bytes enough, but the file system fills (its inode table) part-way
    stopped = _merge(ckpt, fs.path / "merged")
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    line = stopped.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {fs.path}: no space left for the merged model merged: needs ~")
    assert "free and no free inodes (too many files) (the merge stopped after " in line
    assert line.endswith("its partial output was removed; free space there or choose another TARGET_DIR, then run "
                         "the same command again)")
    assert list(fs.path.iterdir()) == []  # no half model
    fs.resize(4 * 1024 * 1024, nr_inodes=64)  # space freed: the same command merges
    assert _merge(ckpt, fs.path / "merged").returncode == 0
    assert sorted(p.name for p in fs.path.iterdir()) == ["merged"]
    from recipe.common.checkpoints import check_model_dir

    check_model_dir(fs.path / "merged")


def test_help_exits_0_and_a_wrong_argument_count_exits_2(capsys):
    assert main(["runs/a", "runs/b", "--help"]) == 0 and capsys.readouterr().out.startswith("usage: ")
    assert main(["runs/a"]) == 2 and capsys.readouterr().err.startswith("usage: ")
