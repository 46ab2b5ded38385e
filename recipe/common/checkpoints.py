"""Checks of model and checkpoint directories before anything loads them (pure stdlib).

Reads only file names, sizes, JSON files and safetensors headers (no tensor data, no torch), so a CLI or
a launcher refuses a bad directory in well under a second, before Ray starts: ``check_model_dir`` (an HF
directory), ``check_fsdp_checkpoint`` (a verl save), ``check_same_model``, ``choose_resume_dir`` (the save a
run resumes from), ``check_model_source`` (a directory or a Hub id), ``parameter_count`` / ``tree_bytes``
(what a save or a merge will write). Every failure is a :class:`recipe.common.cli.InputError` naming the
file and how to fix it (docs/errors_and_outputs.md). CLI (used by ``scripts/merge_checkpoint.sh``)::

    python -m recipe.common.checkpoints DIR [--same-as BASE_MODEL_DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from recipe.common import cli

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
# Any one of these makes a tokenizer loadable by AutoTokenizer (with config.json's model_type).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.tiktoken")
# config.json keys two directories of the same model must agree on (when both have them).
ARCHITECTURE_KEYS = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim")
_RANK_FILE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MAX_HEADER = 100 * 2**20  # safetensors caps its JSON header at 100 MB
_RECOPY = "the copy or download is incomplete: copy the model directory again"


def _dir(path: str | Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise cli.MissingInputError(f"no such {what}", file=path, hint="check the path")
    if not path.is_dir():
        raise cli.InputError(f"is not a directory, expected a {what}", file=path)
    return path


def read_config(model_dir: str | Path) -> dict:
    """``config.json`` of a model directory as a dict (missing or malformed: an InputError)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise cli.MissingInputError(
            "no config.json: not a Hugging Face model directory", file=model_dir,
            hint="pass the model folder; merge an FSDP checkpoint first (scripts/merge_checkpoint.sh)")
    config = cli.read_json(path, what="model config")
    if not isinstance(config, dict):
        raise cli.InputError("expected a JSON object", file=path)
    return config


# --------------------------------------------------------------------------- weights
def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header; the file must be as long as the header says."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise cli.InputError(f"truncated: {size} bytes, not even a safetensors header", file=path, hint=_RECOPY)
        (header_len,) = struct.unpack("<Q", head)
        if header_len > _MAX_HEADER or 8 + header_len > size:
            raise cli.InputError(f"truncated or not safetensors: {size} bytes, header claims {header_len}", file=path,
                                 hint=_RECOPY)
        try:
            header = json.loads(handle.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise cli.InputError("not a safetensors file (its header is not JSON)", file=path, hint=_RECOPY) from None
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    end = max((int(info["data_offsets"][1]) for info in tensors.values()), default=0)
    if size < 8 + header_len + end:
        raise cli.InputError(f"truncated: {size} bytes, its header needs {8 + header_len + end}", file=path,
                             hint=_RECOPY)
    return {name: list(info.get("shape", [])) for name, info in tensors.items()}


def _check_torch_zip(path: Path) -> None:
    """A torch.save file (zip format) whose central directory (at its end) is readable."""
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError):
        raise cli.InputError(f"truncated or not a torch file ({path.stat().st_size} bytes)", file=path,
                             hint="the save was interrupted or the copy is incomplete") from None


def _index_map(index_path: Path) -> dict[str, str]:
    index = cli.read_json(index_path, what="weight index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise cli.InputError("no 'weight_map' in the index", file=index_path, hint=_RECOPY)
    return weight_map


def weight_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Tensor name -> shape over all weight files (empty for ``.bin`` weights, checked as whole files only)."""
    index_path = model_dir / SAFETENSORS_INDEX
    if index_path.is_file():
        weight_map = _index_map(index_path)
        shapes: dict[str, list[int]] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = model_dir / shard
            if not shard_path.is_file():
                raise cli.MissingInputError(f"weight shard listed in {SAFETENSORS_INDEX} is missing", file=shard_path,
                                            hint=_RECOPY)
            found = safetensors_shapes(shard_path)
            absent = [name for name, where in weight_map.items() if where == shard and name not in found]
            if absent:
                raise cli.InputError(
                    f"lacks {len(absent)} tensor(s) {SAFETENSORS_INDEX} puts there, e.g. {absent[0]!r}", file=shard_path,
                    hint="the shard comes from another model or another save: copy the model directory again")
            shapes.update(found)
        return shapes
    single = model_dir / "model.safetensors"
    if single.is_file():
        return safetensors_shapes(single)
    bin_index = model_dir / BIN_INDEX
    bins = sorted(set(_index_map(bin_index).values())) if bin_index.is_file() else (
        ["pytorch_model.bin"] if (model_dir / "pytorch_model.bin").is_file() else [])
    if not bins:
        raise cli.MissingInputError(
            f"no model weights (model.safetensors, {SAFETENSORS_INDEX}, pytorch_model.bin)", file=model_dir,
            hint="pass the model folder; merge an FSDP checkpoint first (scripts/merge_checkpoint.sh)")
    for name in bins:
        if not (model_dir / name).is_file():
            raise cli.MissingInputError(f"weight shard listed in {BIN_INDEX} is missing", file=model_dir / name,
                                        hint=_RECOPY)
        _check_torch_zip(model_dir / name)
    return {}


def _text_config(config: Mapping) -> Mapping:
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def check_weights_match_config(model_dir: Path, config: Mapping, shapes: Mapping[str, list[int]]) -> None:
    """Embedding shape ``[vocab_size, hidden_size]`` and layer count against ``config.json`` (when named so)."""
    text = _text_config(config)
    where = model_dir / "config.json"
    embed = [name for name in shapes if name.endswith("embed_tokens.weight")]
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    if len(embed) == 1 and isinstance(vocab, int) and isinstance(hidden, int):
        shape = shapes[embed[0]]
        if len(shape) == 2 and shape != [vocab, hidden]:
            raise cli.InputError(
                f"vocab_size {vocab} / hidden_size {hidden} disagree with the weights' {embed[0]} of shape {shape}",
                file=where, hint="config and weights come from different models: copy the model directory again")
    layers = {int(match.group(1)) for name in shapes if (match := _LAYER.search(name))}
    n_layers = text.get("num_hidden_layers")
    if layers and isinstance(n_layers, int) and max(layers) + 1 != n_layers:
        raise cli.InputError(
            f"num_hidden_layers {n_layers} disagrees with the weights, which hold {max(layers) + 1} layers", file=where,
            hint="config and weights come from different models: copy the model directory again")


# --------------------------------------------------------------------------- tokenizer
def check_tokenizer_files(model_dir: str | Path) -> None:
    """At least one tokenizer file (``tokenizer.json``, ``tokenizer.model``, ``vocab.json``, ...)."""
    model_dir = _dir(model_dir, "tokenizer directory")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise cli.MissingInputError(
            f"no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...)", file=model_dir,
            hint="copy the tokenizer files of the base model into it (verl checkpoints keep them in "
                 "global_step_N/actor/huggingface/)")


def _tokenizer_json(model_dir: Path) -> dict | None:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    data = cli.read_json(path, what="tokenizer file")
    return data if isinstance(data, dict) else None


def tokenizer_max_id(model_dir: Path) -> int | None:
    """Largest token id of ``tokenizer.json`` (vocabulary and added tokens), or None without one."""
    data = _tokenizer_json(model_dir)
    if data is None:
        return None
    vocab = (data.get("model") or {}).get("vocab")
    ids = []
    if isinstance(vocab, dict):
        ids.extend(v for v in vocab.values() if isinstance(v, int))
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        ids.append(len(vocab) - 1)
    ids.extend(t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int))
    return max(ids) if ids else None


def tokenizer_fingerprint(model_dir: Path) -> str | None:
    """Hash of ``tokenizer.json``'s vocabulary and added tokens (None without the file)."""
    data = _tokenizer_json(model_dir)
    if data is None:
        return None
    core = {"vocab": (data.get("model") or {}).get("vocab"),
            "added": sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or [] if isinstance(t, dict))}
    return hashlib.sha256(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------- the checks
def check_model_dir(path: str | Path, *, tokenizer: bool = True) -> None:
    """Raise an InputError if the Hugging Face model directory ``path`` is incomplete or inconsistent."""
    model_dir = _dir(path, "model directory")
    if not (model_dir / "config.json").is_file() and (_rank_files(model_dir) or (model_dir / "actor").is_dir()):
        raise cli.InputError("is an FSDP checkpoint, not a Hugging Face model directory", file=model_dir,
                             hint="merge it first: bash scripts/merge_checkpoint.sh CKPT TARGET_DIR")
    config = read_config(model_dir)
    check_weights_match_config(model_dir, config, weight_shapes(model_dir))
    if tokenizer:
        check_tokenizer_files(model_dir)
        max_id = tokenizer_max_id(model_dir)
        vocab = _text_config(config).get("vocab_size")
        if max_id is not None and isinstance(vocab, int) and max_id >= vocab:
            raise cli.InputError(
                f"has token id {max_id}, beyond the model's vocab_size {vocab}", file=model_dir / "tokenizer.json",
                hint="the tokenizer comes from another model: copy the base model's tokenizer files")


def _rank_files(directory: Path) -> dict[int, set[int]]:
    """World size -> ranks of the ``model_world_size_W_rank_R.pt`` files in ``directory``."""
    found: dict[int, set[int]] = {}
    for entry in directory.glob("model_world_size_*_rank_*.pt"):
        match = _RANK_FILE.search(entry.name)
        if match:
            found.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    return found


def check_fsdp_checkpoint(path: str | Path) -> Path:
    """Raise an InputError unless ``path`` (``global_step_N`` or its ``actor/``) is a complete verl save.

    Returns the shard directory (``.../actor`` when given ``global_step_N``).
    """
    actor = _dir(path, "checkpoint directory")
    if (actor / "actor").is_dir():
        actor = actor / "actor"
    ranks = _rank_files(actor)
    if not ranks:
        raise cli.MissingInputError("no FSDP model shards (model_world_size_W_rank_R.pt)", file=actor,
                                    hint="pass a global_step_N directory of a verl run, or its actor/ directory")
    if len(ranks) > 1:
        raise cli.InputError(f"model shards of several world sizes {sorted(ranks)}", file=actor,
                             hint="two saves were mixed in one directory; keep the shards of one")
    (world_size, present), = ranks.items()
    missing = sorted(set(range(world_size)) - present)
    if missing:
        raise cli.InputError(f"missing model shard(s) of rank {missing} (world size {world_size})", file=actor,
                             hint="the save was interrupted; resume from an earlier global_step_N")
    for rank in range(world_size):
        _check_torch_zip(actor / f"model_world_size_{world_size}_rank_{rank}.pt")
    if not (actor / "fsdp_config.json").is_file():
        raise cli.InputError("no fsdp_config.json (verl writes it last)", file=actor,
                             hint="the save was interrupted; resume from an earlier global_step_N")
    hf_dir = actor / "huggingface"
    read_config(_dir(hf_dir, "huggingface/ directory of the checkpoint"))
    check_tokenizer_files(hf_dir)
    return actor


def check_same_model(reference: str | Path, other: str | Path, *, keys: Sequence[str] = ARCHITECTURE_KEYS) -> None:
    """Raise an InputError if ``other`` is not the same architecture and tokenizer as ``reference``.

    Either may be a model directory or a checkpoint (its ``[actor/]huggingface/`` is compared).
    ``keys``: the ``config.json`` keys that must agree (``("vocab_size",)``: same tokenizer and
    vocabulary, any architecture: an OPSD teacher from another model).
    """
    ref_dir, other_dir = (_config_dir(Path(p).expanduser()) for p in (reference, other))
    ref_config, other_config = _text_config(read_config(ref_dir)), _text_config(read_config(other_dir))
    for key in keys:
        if key in ref_config and key in other_config and ref_config[key] != other_config[key]:
            raise cli.InputError(
                f"{key} is {other_config[key]!r} but {ref_config[key]!r} in {ref_dir / 'config.json'}",
                file=other_dir / "config.json", hint="the two directories are different models; pass matching ones")
    ref_tok, other_tok = tokenizer_fingerprint(ref_dir), tokenizer_fingerprint(other_dir)
    if ref_tok is not None and other_tok is not None and ref_tok != other_tok:
        raise cli.InputError(f"vocabulary differs from {ref_dir / 'tokenizer.json'}", file=other_dir / "tokenizer.json",
                             hint="the two directories use different tokenizers; pass matching ones")


def _config_dir(path: Path) -> Path:
    for candidate in (path, path / "huggingface", path / "actor" / "huggingface"):
        if (candidate / "config.json").is_file():
            return candidate
    return path  # read_config names what is missing


def check_path(path: str | Path) -> str:
    """Check a model directory or an FSDP checkpoint, whichever ``path`` is; return which it was."""
    directory = _dir(path, "model or checkpoint directory")
    if _rank_files(directory) or (directory / "actor").is_dir():
        check_fsdp_checkpoint(directory)
        return "fsdp checkpoint"
    check_model_dir(directory)
    return "model directory"


def verl_resume_dir(*, resume_mode: str, default_local_dir: str | Path | None,
                    resume_from_path: str | Path | None = None) -> Path | None:
    """The ``global_step_N`` directory verl 0.9.1 will resume from (``RayPPOTrainer._load_checkpoint``), or None.

    ``disable``: None; ``auto``: the step in ``<default_local_dir>/latest_checkpointed_iteration.txt``
    when that directory exists; ``resume_path``: ``resume_from_path``. Relative paths are taken
    from the working directory, as verl does.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path or "global_step_" not in str(resume_from_path):
            raise cli.InputError(f"trainer.resume_from_path={resume_from_path!r} must name a global_step_N directory",
                                 hint="or set trainer.resume_mode=auto")
        return Path(resume_from_path).absolute()
    if default_local_dir is None:
        return None
    tracker = Path(default_local_dir).absolute() / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        return None
    step = tracker.read_text().strip()
    if not step.isdigit():
        raise cli.InputError(f"holds {step!r}, not a step number", file=tracker, hint="fix or delete the file")
    folder = tracker.parent / f"global_step_{step}"
    return folder if folder.is_dir() else None  # verl then trains from scratch


# The dataloader state verl writes after the model shards, right before the tracker file: ``data.pt``
# (RL trainers), ``data_0.pt`` (the SFT trainer, one per data-parallel rank).
DATALOADER_STATES = ("data.pt", "data_0.pt")


def dataloader_state(folder: str | Path) -> Path | None:
    """The dataloader state file of a ``global_step_N`` folder, or None (an interrupted save)."""
    return next((Path(folder) / name for name in DATALOADER_STATES if (Path(folder) / name).is_file()), None)


def check_resumable(folder: str | Path) -> Path:
    """Raise an InputError unless ``folder`` (``global_step_N``) is a whole trainer save: the FSDP
    checkpoint (``check_fsdp_checkpoint``) and the dataloader state (``data.pt``; the SFT trainer's
    ``data_0.pt``), which verl writes after the shards and right before ``latest_checkpointed_iteration.txt``
    (without it verl would resume with the data order restarted from the first batch)."""
    folder = Path(folder)
    check_fsdp_checkpoint(folder)
    data = dataloader_state(folder)
    if data is None:
        raise cli.InputError("no data.pt (the dataloader state verl writes after the model shards)", file=folder,
                             hint="the save was interrupted; resume from an earlier global_step_N")
    _check_torch_zip(data)
    return folder


def step_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """``(N, root/global_step_N)`` newest first."""
    found = []
    for entry in Path(root).glob("global_step_*"):
        suffix = entry.name[len("global_step_"):]
        if entry.is_dir() and suffix.isdigit():
            found.append((int(suffix), entry))
    return sorted(found, reverse=True)


def choose_resume_dir(*, resume_mode: str, default_local_dir: str | Path | None,
                      resume_from_path: str | Path | None = None) -> tuple[Path | None, str | None]:
    """The ``global_step_N`` a run should resume from, and a note when it is not the one verl would pick.

    ``disable`` / ``resume_path``: verl's choice (``verl_resume_dir``; a ``resume_path`` the user named
    is checked as is, never replaced). ``auto``: the save ``latest_checkpointed_iteration.txt`` names
    when it is whole (``check_resumable``); when that save is not whole (a run killed while saving,
    a damaged copy) or the tracker is missing or unreadable (killed while writing it), the newest
    whole ``global_step_K`` (below the tracker's step when it has one), with a note naming the skipped
    save; nothing is deleted. A tracker naming a broken save with no whole one below it raises the
    InputError of that save (training from scratch would silently discard the run); no tracker and
    no whole save: None (from scratch, as verl).
    """
    if resume_mode != "auto" or default_local_dir is None:
        return verl_resume_dir(resume_mode=resume_mode, default_local_dir=default_local_dir,
                               resume_from_path=resume_from_path), None
    root = Path(default_local_dir).absolute()
    tracker = root / "latest_checkpointed_iteration.txt"
    text = tracker.read_text().strip() if tracker.is_file() else None
    named = int(text) if text is not None and text.isdigit() else None
    problem = None
    if named is not None:
        try:
            return check_resumable(root / f"global_step_{named}"), None
        except cli.InputError as err:
            problem = err
    elif text is not None:
        problem = cli.InputError(f"holds {text!r}, not a step number", file=tracker)
    for step, folder in step_dirs(root):
        if named is not None and step >= named:
            continue
        try:
            check_resumable(folder)
        except cli.InputError:
            continue
        skipped = f"not resuming from {problem}" if problem else f"{tracker} is missing"
        return folder, f"{skipped}; resuming from the last whole save {folder} instead (nothing deleted)"
    if problem is not None:
        raise problem
    return None, None


def check_training_inputs(*, model_path: str | Path, resume_dir: str | Path | None) -> None:
    """Before Ray starts: the (local) model directory, and the checkpoint a run resumes from (complete, same model)."""
    local_model = Path(model_path).expanduser().exists()
    if local_model:
        check_model_dir(model_path)
    if resume_dir is not None:
        check_fsdp_checkpoint(resume_dir)
        if local_model:
            check_same_model(model_path, resume_dir)


# --------------------------------------------------------------------------- model sources
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\")
_TRUE = ("1", "on", "yes", "true")


def hub_offline(environ: Mapping[str, str]) -> bool:
    """Whether a process with ``environ`` may not reach the Hub (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hugging Face cache a process with ``environ`` reads (HF_HUB_CACHE, else HF_HOME/hub, else
    XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub)."""
    if environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(environ.get("HF_HUB_CACHE") or environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "huggingface" / "hub"


def cached_snapshot(repo_id: str, *, hub_cache: str | Path) -> Path | None:
    """The cached snapshot directory of Hub model ``repo_id`` (its ``config.json`` is there), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(hub_cache))
    return Path(found).parent if isinstance(found, str) else None


def probe_hub(repo_id: str, *, timeout_s: float = 10.0) -> None:
    """Ask the Hub whether it has model ``repo_id`` (one request); an InputError when not, or unreachable."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=timeout_s)
    except GatedRepoError:
        raise cli.InputError("is a gated model on the Hugging Face Hub", file=repo_id,
                             hint="request access on its Hub page, then log in (hf auth login, or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise cli.MissingInputError("no such model on the Hugging Face Hub (or a private one)", file=repo_id,
                                    hint="check the id (org/name), or log in (hf auth login) for a private model") from None
    except Exception as err:  # a network error of any kind (DNS, proxy, timeout, 5xx)
        reason = " ".join(str(err).split())[:160]
        raise cli.MissingInputError(
            f"is not in the local Hugging Face cache and the Hub is unreachable ({type(err).__name__}: {reason})",
            file=repo_id, hint=f"download it where there is network (hf download {repo_id}) or pass a model directory",
        ) from None


def check_model_source(value: str | Path, *, offline: bool, hub_cache: str | Path | None = None,
                       probe=probe_hub) -> str:
    """Raise an InputError unless ``value`` names a model a run can load; return how it is found.

    - a directory (or a path-like value: ``/``, ``./``, ``../``, ``~``): a whole Hugging Face model
      directory (``check_model_dir``) -> ``"directory"``; a path that does not exist is an error;
    - a Hub id (``org/name``) in the local cache (``hub_cache``) -> ``"cache"``;
    - a Hub id not in the cache: with ``offline`` an error (nothing can download it), otherwise
      ``probe(repo_id)`` asks the Hub (a typo, a gated model, no network: an error) -> ``"hub"``.
    """
    text = str(value).strip()
    path = Path(text).expanduser()
    if path.exists() or text.startswith(_PATH_PREFIXES):
        check_model_dir(path)
        return "directory"
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        raise cli.MissingInputError("neither a model directory nor a Hub id (org/name)", file=text,
                                    hint="check the path") from None
    cache = hub_cache_dir(os.environ) if hub_cache is None else Path(hub_cache)
    if cached_snapshot(text, hub_cache=cache) is not None:
        return "cache"
    if offline:
        raise cli.MissingInputError(
            f"is not a model directory, nor a Hub id in the local Hugging Face cache ({cache}), and the run is "
            "offline (HF_HUB_OFFLINE=1)", file=text,
            hint=f"download it first (hf download {text}), or pass a model directory")
    probe(text)
    return "hub"


def parameter_count(model_dir: str | Path) -> int | None:
    """Parameters of the model in ``model_dir`` from its safetensors headers (None: no safetensors weights)."""
    try:
        shapes = weight_shapes(Path(model_dir))
    except cli.InputError:
        return None
    total = 0
    for shape in shapes.values():
        count = 1
        for size in shape:
            count *= int(size)
        total += count
    return total or None


def tree_bytes(path: str | Path) -> int:
    """Bytes of the files under ``path`` (0 if it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.common.checkpoints", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="Hugging Face model directory, or a verl global_step_N (or its actor/)")
    parser.add_argument("--same-as", default=None, help="also require the same architecture and tokenizer as this directory")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    kind = check_path(args.path)
    if args.same_as:
        check_same_model(args.same_as, args.path)
    print(f"ok: {args.path} ({kind})")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
