"""recipe.common.heads: the frozen teacher head read from a checkpoint given by directory or Hub id.

A Hub id (``MODEL_PATH=Qwen/Qwen3-1.7B``, every GPU preset) is resolved the way transformers
resolves it, offline: the ``main`` snapshot of the local Hugging Face cache. Here a tiny model is
laid out in a temporary cache under a fake id, sharded with a ``model.safetensors.index.json``
(large checkpoints) and single-file.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM

from recipe.common.heads import checkpoint_lm_head, local_checkpoint_dir
from recipe.models.tiny import tiny_qwen3_config

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _model(*, tied: bool):
    config = tiny_qwen3_config(vocab_size=97)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def _cache(root, repo_id: str, model, *, shard: bool):
    """``root`` as a Hugging Face hub cache holding ``model`` under ``repo_id``."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    model.save_pretrained(snapshot, max_shard_size="20KB" if shard else "1GB")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


@pytest.mark.parametrize("shard", [True, False])
def test_hub_id_resolves_to_the_cached_snapshot_and_its_lm_head(hub_cache, shard):
    model = _model(tied=False)
    snapshot = _cache(hub_cache, "org/tiny", model, shard=shard)
    assert (snapshot / "model.safetensors.index.json").is_file() == shard
    assert (len(list(snapshot.glob("*.safetensors"))) > 1) == shard
    assert local_checkpoint_dir("org/tiny") == str(snapshot)
    weight = checkpoint_lm_head("org/tiny", tie_word_embeddings=False)
    assert torch.equal(weight, model.lm_head.weight.detach())
    # a directory is read as is
    assert torch.equal(checkpoint_lm_head(str(snapshot), tie_word_embeddings=False), weight)


def test_tied_embeddings_give_the_input_embedding(hub_cache):
    model = _model(tied=True)
    _cache(hub_cache, "org/tied", model, shard=True)
    weight = checkpoint_lm_head("org/tied", tie_word_embeddings=True)
    assert torch.equal(weight, model.get_input_embeddings().weight.detach())
    with pytest.raises(KeyError, match="lm_head.weight"):
        checkpoint_lm_head("org/tied", tie_word_embeddings=False)


def test_unknown_id_names_the_path_and_the_cache(hub_cache):
    with pytest.raises(FileNotFoundError, match=r"'org/absent' is neither a local directory nor a Hub id.*hub"):
        local_checkpoint_dir("org/absent")
