"""What every launch checks about its inputs before Ray starts (and in ``--dry-run``): docs/launch.md.

``check_launch(...)``, called by ``recipe.launch.run.plan`` before the recipe's own start-up checks, runs
``check_inputs`` (the model and a teacher that loads ``opsd.teacher.path``; the training and validation
files; the save the run resumes from), then the checkpoint directory (``recipe.launch.resume``) and the
disk (``recipe.launch.disk``). A failure is a ``LaunchInputError``: one line naming the setting (hydra key
and the variable or source that set it), the value, what is wrong and the fix; the launcher exits with 2.
Values in ``pending`` (what a CPU demo or an earlier pipeline stage will build) are not checked.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import (check_model_source, check_training_inputs, choose_resume_dir, hub_cache_dir,
                                       hub_offline, verl_resume_dir)
from recipe.launch import config as composer
from recipe.launch.config import OverrideList, Recipe

# Columns of the data files each recipe reads: (config key naming the column, the column when the key is unset).
RL_COLUMNS = (("data.prompt_key", "prompt"), (None, "reward_model"), ("data.reward_fn_key", "data_source"))
DATA_COLUMNS = {
    "opsd": RL_COLUMNS + ((None, "extra_info"),),  # the teacher's privileged context is read from extra_info
    "grpo": RL_COLUMNS,
    "sft": (("data.messages_key", "messages"),),
}
# How each recipe's data is built (the fix of a file without the columns).
DATA_HINTS = {"sft": "a parquet with a `messages` column (python -m data_prep.sft)"}
RL_DATA_HINT = "a verl RL parquet (prompt, reward_model, data_source, extra_info: python -m data_prep.dapo, ...)"
# Model settings besides the recipe's model key: (key, the key naming an OPSD teacher kind, the flag of that kind
# under which ``key`` names a model: ``teacher_kind_flag``).
EXTRA_MODEL_KEYS = {"opsd": (("opsd.teacher.path", "opsd.teacher.kind", "loads_path"),)}
# The OPSD teacher kinds (name -> TeacherKind), named by string: the launcher imports no recipe.
TEACHER_KINDS = "recipe.opsd.core.teacher_kinds:TEACHER_KINDS"
REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "http://", "https://")


def teacher_kind_flag(kind_name, *, flag: str) -> bool:
    """``flag`` of the OPSD teacher kind ``kind_name`` (``TEACHER_KINDS``); False for none or an unknown
    name (the recipe's start-up checks name it)."""
    if kind_name is None:
        return False
    import importlib

    module, attribute = TEACHER_KINDS.split(":")
    kind = getattr(importlib.import_module(module), attribute).get(str(kind_name))
    return kind is not None and bool(getattr(kind, flag))


class LaunchInputError(cli.InputError):
    """A launch input that cannot work, located at its setting ``KEY=VALUE (where it came from)``."""

    def __init__(self, *, key: str, value, source: str | None, what: str, fix: str):
        self.key, self.value, self.source, self.fix = key, value, source, fix
        by = f" ({source})" if source else ""
        super().__init__(what, file=f"{key}={value}{by}", hint=fix)

    def renamed(self, names: Mapping[str, str]) -> LaunchInputError:
        """The same error with the setting's variable renamed (the pipeline's per-stage variables)."""
        rename = lambda text: next((text.replace(old, new) for old, new in names.items() if old in text), text)  # noqa: E731
        return LaunchInputError(key=self.key, value=self.value, source=rename(self.source or "") or None,
                                what=self.what, fix=rename(self.fix))


@dataclass
class Checked:
    """What the checks found: the save the run resumes from (None: from scratch), notes to print, and
    (``check_launch``) the finished-run line (the launch then exits 0 without training) and the disk plan."""

    resume_dir: Path | None
    notes: list[str]
    finished: str | None = None
    disk: object = None  # recipe.launch.disk.DiskPlan


def _source(overrides: OverrideList, key: str) -> str | None:
    source = overrides.source(key)
    return None if source is None or source.startswith("launcher") or source == "derived" else source


def _fix(source: str | None, key: str, wanted: str) -> str:
    if source and source.isupper():
        return f"set {source} to {wanted}"
    return f"pass {key}=<{wanted}>"


def _error(err: cli.InputError, *, key: str, value, source: str | None, fix: str) -> LaunchInputError:
    same = err.file is None or Path(str(err.file)).expanduser() == Path(str(value)).expanduser()
    where = "" if same and err.line_number is None and err.row is None else f"{err.location}: "
    hint = err.hint if err.hint and err.hint != "check the path" else fix
    return LaunchInputError(key=key, value=value, source=source, what=where + err.what, fix=hint)


def check_model(key: str, value, *, source: str | None, environ: Mapping[str, str], probe=None,
                dry_run: bool = False) -> str:
    """``check_model_source`` of one setting; a LaunchInputError naming it. Returns how the model is found.
    ``dry_run``: a Hub id that is not cached is not refused when offline (the dry run asks nobody)."""
    kwargs = {} if probe is None else {"probe": probe}
    offline = hub_offline(environ) and not dry_run
    try:
        return check_model_source(str(value), offline=offline, hub_cache=hub_cache_dir(environ), **kwargs)
    except cli.InputError as err:
        raise _error(err, key=key, value=value, source=source,
                     fix=_fix(source, key, "a Hugging Face model directory or a Hub id such as Qwen/Qwen3-1.7B")) from None


def _files(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]


def check_data(key: str, value, *, columns: Collection[str], source: str | None, hint: str,
               min_rows: int | None = None) -> None:
    """Every file of ``value`` (a path or a list) is a parquet holding ``columns``; together at least ``min_rows`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, local = 0, 0
    where = lambda path: "" if len(_files(value)) == 1 else f"{path}: "  # noqa: E731
    for name in _files(value):
        if name.startswith(REMOTE_PREFIXES):  # verl copies remote files itself
            continue
        path = Path(name).expanduser()
        try:
            cli.require_file(path, what="data file", hint=_fix(source, key, "an existing parquet file"))
        except cli.InputError as err:
            raise _error(err, key=key, value=value, source=source, fix=_fix(source, key, "an existing parquet file")) from None
        try:
            meta = pq.ParquetFile(path).metadata
        except (pa.ArrowException, OSError) as err:
            raise LaunchInputError(key=key, value=value, source=source,
                                   what=f"{where(path)}not a parquet file ({' '.join(str(err).split())[:120]})",
                                   fix=f"pass {hint}") from None
        names = set(meta.schema.to_arrow_schema().names)
        absent = [column for column in columns if column not in names]
        if absent:
            raise LaunchInputError(key=key, value=value, source=source,
                                   what=f"{where(path)}no column {', '.join(map(repr, absent))} (its columns: "
                                        f"{', '.join(sorted(names))})", fix=f"pass {hint}")
        rows, local = rows + meta.num_rows, local + 1
    if min_rows is not None and local and local == len(_files(value)) and rows < min_rows:
        raise LaunchInputError(key=key, value=value, source=source,
                               what=f"{rows} rows, fewer than one batch (data.train_batch_size={min_rows})",
                               fix="use more data or a smaller data.train_batch_size")


def _not_asked(repo_id: str) -> None:
    """A dry run does not ask the Hub (it composes a config, possibly on a machine without network)."""


def check_inputs(recipe: Recipe, cfg, *, overrides: OverrideList, environ: Mapping[str, str],
                 pending: Collection[str] = (), dry_run: bool = False, probe=None) -> Checked:
    """The input checks on the final config ``cfg``; raise LaunchInputError on the first failure.

    - the model (``recipe.model_key``) and, for OPSD with a teacher kind that loads ``opsd.teacher.path``
      (``checkpoint``), the teacher: a whole Hugging Face model directory, a Hub id in the local cache, or
      (online) one the Hub has (``check_model_source``; with ``HF_HUB_OFFLINE=1``, set by the CPU path, it
      must be in the cache);
    - the training and validation files: each exists, is a parquet file and has the columns the recipe
      reads (``DATA_COLUMNS``); the training files hold at least one batch;
    - the save the run resumes from (``choose_resume_dir``) is whole and of the same model
      (``check_training_inputs``).

    ``dry_run``: a Hub id that is not cached is not asked for (a note says so); the rest is checked alike."""
    pending = {str(p) for p in pending}
    probe = _not_asked if dry_run else probe
    select = lambda key, default=None: composer.select(cfg, key, default)  # noqa: E731
    model = select(recipe.model_key)
    notes = []
    if model is not None and str(model) not in pending:
        where = check_model(recipe.model_key, model, source=_source(overrides, recipe.model_key), environ=environ,
                            probe=probe, dry_run=dry_run)
        if where == "hub":
            launch_does = ("a launch here refuses it (HF_HUB_OFFLINE=1)" if hub_offline(environ)
                           else "a launch asks the Hub for it (a dry run does not)")
            notes.append(f"{recipe.model_key}={model} is not in the local Hugging Face cache: " + (
                launch_does if dry_run else "the Hub has it, verl downloads it"))
    for key, kind_key, flag in EXTRA_MODEL_KEYS.get(recipe.name, ()):
        value = select(key)
        if teacher_kind_flag(select(kind_key), flag=flag) and value is not None and str(value) not in pending:
            check_model(key, value, source=_source(overrides, key), environ=environ, probe=probe, dry_run=dry_run)
    columns = [select(column_key, default) if column_key else default
               for column_key, default in DATA_COLUMNS.get(recipe.name, ())]
    hint = DATA_HINTS.get(recipe.name, RL_DATA_HINT)
    for key, min_rows in ((recipe.train_key, select("data.train_batch_size")), (recipe.val_key, None)):
        value = select(key) if key else None
        if value is not None and not set(_files(value)) & pending:
            check_data(key, value, columns=columns, source=_source(overrides, key), hint=hint, min_rows=min_rows)
    trainer = cfg.trainer
    ckpt = trainer.default_local_dir
    try:
        resume_dir, note = choose_resume_dir(resume_mode=trainer.get("resume_mode", "auto"), default_local_dir=ckpt,
                                             resume_from_path=trainer.get("resume_from_path"))
        if model is not None and str(model) not in pending:
            check_training_inputs(model_path=str(model), resume_dir=resume_dir)
    except cli.InputError as err:
        key = "trainer.resume_from_path" if trainer.get("resume_mode") == "resume_path" else "trainer.default_local_dir"
        value = trainer.get("resume_from_path") if key == "trainer.resume_from_path" else ckpt
        raise LaunchInputError(key=key, value=value, source=_source(overrides, key) or "CKPT_DIR",
                               what=err.message.removesuffix(f" ({err.hint})") if err.hint else err.message,
                               fix=err.hint or "set CKPT_DIR to another directory to start a new run") from None
    if note:
        notes.append(note)
    return Checked(resume_dir=resume_dir, notes=notes)


def check_launch(recipe: Recipe, cfg, *, overrides: OverrideList, environ: Mapping[str, str], ckpt_dir: Path,
                 pending: Collection[str] = (), resume_anyway: bool = False, dry_run: bool = False,
                 probe=None) -> Checked:
    """``check_inputs``, then the checkpoint directory (``check_resume``: a finished run, another config) and
    the disk (``plan_disk``: the size of one save against the free space)."""
    from recipe.launch.disk import plan_disk
    from recipe.launch.resume import check_resume

    checked = check_inputs(recipe, cfg, overrides=overrides, environ=environ, pending=pending, dry_run=dry_run,
                           probe=probe)
    resume = check_resume(recipe, cfg, resume_dir=checked.resume_dir, ckpt_dir=Path(ckpt_dir),
                          overrides=overrides.as_list(), anyway=resume_anyway)
    checked.finished = resume.finished
    if resume.finished:  # shown by a dry run; a launch prints it alone and exits 0
        checked.notes.append(resume.finished.removeprefix("[launch] "))
    checked.disk = plan_disk(recipe, cfg, ckpt_dir=Path(ckpt_dir), resume_step=resume.step, environ=environ)
    checked.notes += resume.notes + checked.disk.notes  # the disk line itself: Launch.describe
    return checked


def resume_overrides(cfg, checked: Checked) -> list[str]:
    """When the save to resume from is not the one verl would pick (the tracker names a save that is not whole,
    or there is no tracker: ``choose_resume_dir``'s note), the overrides that make verl resume from it."""
    trainer = cfg.trainer
    if checked.resume_dir is None or trainer.get("resume_mode", "auto") != "auto":
        return []
    try:
        verl_choice = verl_resume_dir(resume_mode="auto", default_local_dir=trainer.default_local_dir)
    except cli.InputError:  # an unreadable tracker: verl would fail on it
        verl_choice = None
    if verl_choice is not None and Path(verl_choice).absolute() == Path(checked.resume_dir).absolute():
        return []
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={checked.resume_dir}"]
