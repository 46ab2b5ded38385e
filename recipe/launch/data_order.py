"""The rows an RL launch trains on, in order, computed before Ray starts and recorded with the run.

``plan_data_order(cfg)`` (``recipe.launch.run``, the sweep) replays verl 0.9.1's dataset and sampler on
the training files and refuses a prompt verl would cut (file and row); ``write_record`` writes
``data_order.json`` to the checkpoint directory: the row count and ``order_sha256``, a hash of the
prompts in training order, so two runs on different parquets compare equal exactly when they train on
the same prompts in the same order (``recipe.analysis.compute_cost.check_same_data``;
docs/cost.md#same-rows-same-order).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from recipe.common.cli import InputError

DATA_ORDER_FILE = "data_order.json"
FORMAT = 1


@dataclass(frozen=True)
class DataOrder:
    """What a launch will train on: ``rows`` = steps x batch size rows, in the order ``order_sha256`` hashes."""

    train_files: tuple[str, ...]
    rows_in_files: int
    rows_in_dataset: int  # after train_max_samples and the prompt-length filter
    filter_overlong_prompts: bool
    max_prompt_length: int
    shuffle: bool
    seed: int | None
    batch_size: int
    steps: int
    rows: int
    order_sha256: str
    prompt_lengths_checked: bool  # False: the tokenizer could not be loaded here (see the launch note)

    def record(self) -> dict:
        return {"format": FORMAT, **asdict(self), "train_files": list(self.train_files)}


# --------------------------------------------------------------------------- verl's order (pure)
def subset_indices(total: int, *, max_samples: int, shuffle: bool, seed: int | None) -> list[int]:
    """The rows ``RLHFDataset`` keeps for ``train_max_samples`` (all when it is <= 0 or >= total)."""
    if max_samples is None or max_samples <= 0 or max_samples >= total:
        return list(range(total))
    if not shuffle:
        return list(range(max_samples))
    import numpy as np

    rng = np.random.default_rng(*((seed,) if seed is not None else ()))
    return [int(i) for i in rng.choice(total, size=max_samples, replace=False)]


def sampler_indices(n_rows: int, *, shuffle: bool, seed: int | None, batch_size: int, steps: int) -> list[int]:
    """Dataset indices of the ``steps`` x ``batch_size`` rows verl's dataloader yields, in order."""
    import torch
    from torchdata.stateful_dataloader.sampler import RandomSampler

    per_epoch = n_rows // batch_size
    if per_epoch < 1:
        raise ValueError(f"the training data has {n_rows} rows, fewer than one batch of {batch_size} "
                         "(verl drops the incomplete batch: no step would run)")
    sampler = range(n_rows)
    if shuffle:
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        sampler = RandomSampler(data_source=range(n_rows), generator=generator)
    order: list[int] = []
    while len(order) < steps * batch_size:  # one epoch: a new permutation, the incomplete batch dropped
        epoch = iter(sampler)
        take = min(per_epoch * batch_size, steps * batch_size - len(order))
        order.extend(int(next(epoch)) for _ in range(take))
    return order


def row_digest(prompt) -> str:
    """sha256 of a row's ``prompt`` value (chat messages) as canonical JSON."""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def order_sha256(digests: Sequence[str]) -> str:
    """One hash of the rows in training order."""
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def prompt_lengths(prompts: Sequence, *, tokenizer, chat_kwargs: Mapping) -> list[int]:
    """Tokens of each prompt as verl measures them: the chat template with the generation prompt, no
    special tokens added (``RLHFDataset.maybe_filter_out_long_prompts``, the agent loop's prompt ids)."""
    texts = [tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True, **dict(chat_kwargs))
             for p in prompts]
    counts = []
    for start in range(0, len(texts), 512):
        counts += [len(ids) for ids in tokenizer(texts[start:start + 512], add_special_tokens=False)["input_ids"]]
    return counts


# --------------------------------------------------------------------------- the launch's order
def load_tokenizer(model, *, local_files_only: bool = False) -> object:
    """The launch's tokenizer (``local_files_only``: a dry run, which never asks the Hub)."""
    from transformers import AutoTokenizer

    path = model.get("tokenizer_path") or model.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model.get("trust_remote_code", False)),
                                                  local_files_only=local_files_only)
    except OSError:
        if not local_files_only:
            raise
        raise OSError(f"{path} is not in the local Hugging Face cache and a dry run does not download it") from None
    if model.get("custom_chat_template"):
        tokenizer.chat_template = model.custom_chat_template
    return tokenizer


def _read_prompts(files: Sequence[str], key: str) -> tuple[list, list[tuple[str, int]]]:
    import pyarrow.parquet as pq

    prompts, where = [], []
    for path in files:
        column = pq.read_table(path, columns=[key]).column(key).to_pylist()
        prompts += column
        where += [(path, row) for row in range(len(column))]
    return prompts, where


def plan_data_order(cfg, *, load_tokenizer: Callable = load_tokenizer) -> tuple[DataOrder | None, str | None]:
    """The order of the resolved launch config ``cfg`` and a note (why it is not known, or what was not checked).

    verl 0.9.1 builds the training stream so (``RayPPOTrainer._create_dataloader``, ``create_rl_dataset`` /
    ``create_rl_sampler`` of ``verl.trainer.ppo.utils``, ``RLHFDataset``): (1) the ``data.train_files``
    parquets concatenated in order; (2) ``data.train_max_samples`` > 0 keeps a subset (with ``data.shuffle``
    ``numpy.random.default_rng(data.seed).choice(total, size, replace=False)``, else the first rows);
    (3) ``data.filter_overlong_prompts`` drops the rows whose prompt renders (chat template with the
    generation prompt and ``data.apply_chat_template_kwargs``) to more than ``data.max_prompt_length``
    tokens; (4) ``data.shuffle``: torchdata's ``RandomSampler`` with a ``torch.Generator()`` seeded by
    ``data.seed`` (unseeded: torch's fixed default seed), one permutation per epoch from the same
    generator, else the rows in order; (5) ``StatefulDataLoader(batch_size=data.gen_batch_size or
    data.train_batch_size, drop_last=True)``: one batch per training step.

    Without the filter verl's agent loop left-truncates an over-long prompt (a log warning only): raises
    ``InputError`` naming file and row for such a prompt among the rows the run will read, so no recipe
    trains on a prompt it cut or on rows a filter silently dropped.
    """
    data = cfg.data
    files = [str(data.train_files)] if isinstance(data.train_files, str) else [str(f) for f in data.train_files]
    if (data.get("custom_cls") or {}).get("path"):
        return None, f"data order not recorded: data.custom_cls={data.custom_cls.path} is not verl's RLHFDataset"
    key = data.get("prompt_key", "prompt")
    try:
        prompts, where = _read_prompts(files, key)
    except (OSError, KeyError, ValueError) as err:  # a remote path verl copies itself, a missing column, ...
        return None, f"data order not recorded: cannot read column {key!r} of {files} here ({' '.join(str(err).split())[:200]})"
    shuffle, seed = bool(data.get("shuffle", True)), data.get("seed")
    cap, filtered = int(data.max_prompt_length), bool(data.get("filter_overlong_prompts", False))
    chat_kwargs = data.get("apply_chat_template_kwargs") or {}
    kept = subset_indices(len(prompts), max_samples=data.get("train_max_samples", -1), shuffle=shuffle, seed=seed)
    for index, prompt in enumerate(prompts):  # verl's dataset renders each prompt as a list of chat messages
        if not (isinstance(prompt, (list, tuple)) and all(isinstance(m, Mapping) and "role" in m for m in prompt)):
            path, row = where[index]
            raise InputError(f"row {row} (0-based) of the training data: column {key!r} is not a list of chat "
                             f"messages ({{role, content}}), got {type(prompt).__name__}", file=path,
                             hint="build the parquet with python -m data_prep.<builder> (docs/prompts.md)")
    tokenizer, reason, note = None, None, None
    try:
        tokenizer = load_tokenizer(cfg.actor_rollout_ref.model)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())[:200]
    if filtered:
        if tokenizer is None:
            return None, f"data order not recorded: data.filter_overlong_prompts needs the tokenizer ({reason})"
        lengths = prompt_lengths([prompts[index] for index in kept], tokenizer=tokenizer, chat_kwargs=chat_kwargs)
        dropped = sum(n > cap for n in lengths)
        kept = [index for index, n in zip(kept, lengths) if n <= cap]
        if dropped:
            note = f"data.filter_overlong_prompts drops {dropped} of {len(lengths)} rows over data.max_prompt_length={cap}"
    batch = int(data.get("gen_batch_size") or data.train_batch_size)
    steps = cfg.trainer.get("total_training_steps")
    steps = int(steps) if steps is not None else (len(kept) // batch) * int(cfg.trainer.total_epochs)
    try:
        order = [kept[i] for i in sampler_indices(len(kept), shuffle=shuffle, seed=seed, batch_size=batch, steps=steps)]
    except ValueError as err:
        raise InputError(str(err), file=", ".join(files), hint="more rows, or a smaller data.train_batch_size") from None
    if not filtered and tokenizer is not None:
        read = sorted(set(order))
        lengths = prompt_lengths([prompts[index] for index in read], tokenizer=tokenizer, chat_kwargs=chat_kwargs)
        for index, n in zip(read, lengths):
            if n > cap:
                path, row = where[index]
                raise InputError(
                    f"row {row} (0-based) of the training data: its prompt renders to {n} tokens > data.max_prompt_length={cap}, "
                    "and with data.filter_overlong_prompts=false verl would cut it", file=path,
                    hint=f"filter the file to the cap first (python -m data_prep.length_filter --input {path} ...) "
                         "or raise data.max_prompt_length")
    elif not filtered:
        note = f"prompt lengths not checked: cannot load the tokenizer here ({reason})"
    digests = [row_digest(prompts[index]) for index in order]
    return DataOrder(train_files=tuple(files), rows_in_files=len(prompts), rows_in_dataset=len(kept),
                     filter_overlong_prompts=filtered, max_prompt_length=cap, shuffle=shuffle, seed=seed,
                     batch_size=batch, steps=steps, rows=len(order), order_sha256=order_sha256(digests),
                     prompt_lengths_checked=tokenizer is not None), note


def write_record(order: DataOrder | None, note: str | None, ckpt_dir: Path) -> Path:
    """``<ckpt_dir>/data_order.json``: the order's record, or why there is none."""
    path = Path(ckpt_dir) / DATA_ORDER_FILE
    record = order.record() if order is not None else {"format": FORMAT, "order_sha256": None, "why": note}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path
