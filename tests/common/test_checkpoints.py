"""recipe.common.checkpoints: truncated, foreign or tokenizer-less model / checkpoint directories fail clearly."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipe.common.checkpoints import check_fsdp_checkpoint, check_model_dir, check_path, check_same_model
from recipe.common.cli import InputError
from recipe.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def sharded(tiny, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("sharded") / "model"
    AutoModelForCausalLM.from_pretrained(tiny).save_pretrained(out, max_shard_size="100KB")
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return out


def copy(src, tmp_path, name="m"):
    return Path(shutil.copytree(src, tmp_path / name))


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_good_directories_pass(tiny, sharded):
    check_model_dir(tiny)
    check_model_dir(sharded)
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    check_same_model(tiny, sharded)


def test_truncated_single_file(tiny, tmp_path):
    model = copy(tiny, tmp_path)
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(size - 10)
    with pytest.raises(InputError, match=rf"model.safetensors: truncated: {size - 10} bytes, its header needs {size} "
                                         r"\(the copy or download is incomplete"):
        check_model_dir(model)
    weights.write_bytes(b"\x01")
    with pytest.raises(InputError, match="not even a safetensors header"):
        check_model_dir(model)


def test_sharded_missing_short_or_foreign_shard(sharded, tmp_path):
    model = copy(sharded, tmp_path)
    shards = sorted(model.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(InputError, match=rf"{shards[-1].name}: weight shard listed in model.safetensors.index.json is missing"):
        check_model_dir(model)
    model = copy(sharded, tmp_path, "short")
    last = sorted(model.glob("model-*.safetensors"))[-1]
    last.write_bytes(last.read_bytes()[:-1])
    with pytest.raises(InputError, match=rf"{last.name}: truncated"):
        check_model_dir(model)
    model = copy(sharded, tmp_path, "swapped")
    first, second = sorted(model.glob("model-*.safetensors"))[:2]
    first.write_bytes(second.read_bytes())  # a shard of the right name with the wrong tensors
    with pytest.raises(InputError, match=rf"{first.name}: lacks \d+ tensor\(s\) model.safetensors.index.json puts there"):
        check_model_dir(model)


def test_config_from_another_model(tiny, tmp_path):
    model = copy(tiny, tmp_path)
    edit_json(model / "config.json", hidden_size=128)
    with pytest.raises(InputError, match=r"config.json: vocab_size \d+ / hidden_size 128 disagree with the weights' "
                                         r"model.embed_tokens.weight of shape \[\d+, 64\]"):
        check_model_dir(model)
    edit_json(model / "config.json", hidden_size=64, num_hidden_layers=4)
    with pytest.raises(InputError, match="num_hidden_layers 4 disagrees with the weights, which hold 2 layers"):
        check_model_dir(model)
    (model / "config.json").write_text('{"model_type": "qwen3",\n "vocab_size": }')
    with pytest.raises(InputError, match=r"config.json:2: not valid JSON"):
        check_model_dir(model)


def test_missing_or_foreign_tokenizer(tiny, tmp_path):
    model = copy(tiny, tmp_path)
    (model / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        check_model_dir(model)
    check_model_dir(model, tokenizer=False)
    model = copy(tiny, tmp_path, "small_vocab")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    edit_json(model / "config.json", vocab_size=vocab - 5)  # weights agree, tokenizer does not
    from safetensors.torch import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    tensors = {k: (v[: vocab - 5].clone() if k in ("model.embed_tokens.weight", "lm_head.weight") else v) for k, v in tensors.items()}
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=rf"tokenizer.json: has token id {vocab - 1}, beyond the model's vocab_size {vocab - 5}"):
        check_model_dir(model)


def test_missing_directory_and_fsdp_instead_of_hf(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        check_model_dir(tmp_path / "nope")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model_world_size_1_rank_0.pt").write_bytes(b"")
    with pytest.raises(InputError, match="is an FSDP checkpoint, not a Hugging Face model directory.*merge_checkpoint"):
        check_model_dir(tmp_path / "ckpt")


def fake_fsdp_checkpoint(root: Path, tiny: Path, *, world_size: int = 2) -> Path:
    actor = root / "global_step_5" / "actor"
    actor.mkdir(parents=True)
    for rank in range(world_size):
        torch.save({"w": torch.zeros(4)}, actor / f"model_world_size_{world_size}_rank_{rank}.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    (actor / "huggingface").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, actor / "huggingface" / name)
    return root / "global_step_5"


def test_fsdp_checkpoint_complete_partial_or_foreign(tiny, tmp_path):
    step = fake_fsdp_checkpoint(tmp_path / "run", tiny)
    actor = step / "actor"
    assert check_fsdp_checkpoint(step) == actor and check_path(step) == "fsdp checkpoint"
    check_same_model(tiny, step)
    shard = actor / "model_world_size_2_rank_1.pt"
    shard.write_bytes(shard.read_bytes()[:-40])  # killed while writing rank 1
    with pytest.raises(InputError, match=r"rank_1.pt: truncated or not a torch file"):
        check_fsdp_checkpoint(step)
    shard.unlink()
    with pytest.raises(InputError, match=r"actor: missing model shard\(s\) of rank \[1\] \(world size 2\).*earlier global_step"):
        check_fsdp_checkpoint(step)
    step = fake_fsdp_checkpoint(tmp_path / "run2", tiny)
    (step / "actor" / "fsdp_config.json").unlink()
    with pytest.raises(InputError, match=r"no fsdp_config.json \(verl writes it last\)"):
        check_fsdp_checkpoint(step)
    step = fake_fsdp_checkpoint(tmp_path / "run3", tiny)
    (step / "actor" / "huggingface" / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="huggingface: no tokenizer files"):
        check_fsdp_checkpoint(step)
    step = fake_fsdp_checkpoint(tmp_path / "run4", tiny)
    edit_json(step / "actor" / "huggingface" / "config.json", hidden_size=128)
    with pytest.raises(InputError, match=r"huggingface/config.json: hidden_size is 128 but 64 in .*different models"):
        check_same_model(tiny, step)


def test_checkpoints_cli_one_line(tiny, tmp_path):
    step = fake_fsdp_checkpoint(tmp_path / "run", tiny, world_size=1)
    (step / "actor" / "fsdp_config.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "recipe.common.checkpoints", str(step)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {step / 'actor'}: no fsdp_config.json")
    ok = subprocess.run([sys.executable, "-m", "recipe.common.checkpoints", str(tiny)], capture_output=True, text=True,
                        cwd=REPO, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == f"ok: {tiny} (model directory)"


def test_resume_dir_as_verl_finds_it_and_the_training_check(tiny, tmp_path, monkeypatch):
    from recipe.common.checkpoints import check_training_inputs, verl_resume_dir

    run_dir = tmp_path / "run"
    assert verl_resume_dir(resume_mode="auto", default_local_dir=run_dir) is None  # nothing saved yet
    assert verl_resume_dir(resume_mode="disable", default_local_dir=run_dir) is None
    step = fake_fsdp_checkpoint(run_dir, tiny)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("5")
    monkeypatch.chdir(tmp_path)
    assert verl_resume_dir(resume_mode="auto", default_local_dir="run") == step
    assert verl_resume_dir(resume_mode="resume_path", default_local_dir=None, resume_from_path="run/global_step_5") == step
    with pytest.raises(InputError, match="must name a global_step_N directory"):
        verl_resume_dir(resume_mode="resume_path", default_local_dir=None, resume_from_path="run")
    check_training_inputs(model_path=tiny, resume_dir=step)
    check_training_inputs(model_path="Qwen/Qwen3-1.7B", resume_dir=step)  # a hub id: only the checkpoint is checked
    other = copy(tiny, tmp_path, "other")
    edit_json(other / "config.json", num_attention_heads=1)
    with pytest.raises(InputError, match="num_attention_heads is 2 but 1 in"):
        check_training_inputs(model_path=other, resume_dir=step)
    (step / "actor" / "fsdp_config.json").unlink()
    with pytest.raises(InputError, match="no fsdp_config.json"):
        check_training_inputs(model_path=tiny, resume_dir=step)


def _whole_save(root: Path, tiny: Path, step: int) -> Path:
    """A fake verl save global_step_<step> with its shards and data.pt (a whole trainer save)."""
    folder = fake_fsdp_checkpoint(root / f"tmp{step}", tiny, world_size=1).rename(root / f"global_step_{step}")
    (root / f"tmp{step}").rmdir()
    torch.save({"sampler": step}, folder / "data.pt")
    return folder


def test_resume_falls_back_to_the_last_whole_save(tiny, tmp_path):
    from recipe.common.checkpoints import check_resumable, choose_resume_dir

    run = tmp_path / "run"
    run.mkdir()
    tracker = run / "latest_checkpointed_iteration.txt"

    def choose():
        return choose_resume_dir(resume_mode="auto", default_local_dir=run)

    assert choose() == (None, None)  # nothing saved: from scratch
    two, four = _whole_save(run, tiny, 2), _whole_save(run, tiny, 4)
    tracker.write_text("4")
    assert choose() == (four, None)  # the tracker's save is whole: verl's choice
    # killed while saving step 4 after the shards, before data.pt (and the tracker already said 4:
    # a damaged save): the last whole save below it, with a note; nothing deleted
    (four / "data.pt").unlink()
    with pytest.raises(InputError, match="no data.pt"):
        check_resumable(four)
    folder, note = choose()
    assert folder == two and note.startswith(f"not resuming from {four}: no data.pt")
    assert note.endswith(f"resuming from the last whole save {two} instead (nothing deleted)") and four.is_dir()
    # the tracker torn while being written (empty) or gone: the newest whole save
    six = _whole_save(run, tiny, 6)
    tracker.write_text("")
    folder, note = choose()
    assert folder == six and note.startswith(f"not resuming from {tracker}: holds '', not a step number")
    tracker.unlink()
    assert choose() == (six, f"{tracker} is missing; resuming from the last whole save {six} instead (nothing deleted)")
    # a save above the tracker's step is never taken (not from this run's history)
    tracker.write_text("4")
    assert choose()[0] == two
    # a truncated shard below the tracker is skipped too
    shard = two / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[:-40])
    with pytest.raises(InputError, match=r"global_step_4: no data.pt"):  # nothing whole below 4: the tracker's error
        choose()
    # resume_path: the user's choice is checked as is, never replaced
    assert choose_resume_dir(resume_mode="resume_path", default_local_dir=run,
                             resume_from_path=str(four)) == (four, None)
    assert choose_resume_dir(resume_mode="disable", default_local_dir=run) == (None, None)


def test_no_tracker_and_only_a_partial_save_trains_from_scratch(tiny, tmp_path):
    from recipe.common.checkpoints import choose_resume_dir

    run = tmp_path / "run"
    (run / "global_step_2" / "actor").mkdir(parents=True)  # killed during the first save
    assert choose_resume_dir(resume_mode="auto", default_local_dir=run) == (None, None)
