"""Merge a verl FSDP checkpoint into a Hugging Face model directory (verl.model_merger).

    python -m recipe.launch.merge CKPT TARGET_DIR        # scripts/merge_checkpoint.sh runs this

CKPT may be a run directory (``trainer.default_local_dir``: its latest checkpoint, from
``latest_checkpointed_iteration.txt``), a ``global_step_N`` directory of an RL run (its ``actor/``
shards) or of an SFT run (shards at its top level), or the shard directory itself. TARGET_DIR must
not exist (nothing is overwritten). Works with or without the CPU plugin.

Input errors (a partial save: missing / truncated rank shards, no ``fsdp_config.json``, no
``huggingface/`` config and tokenizer; an existing TARGET_DIR) are one ``error: ...`` line and exit
code 2, checked before the merger loads anything (``recipe.common.checkpoints``). The merger writes
next to TARGET_DIR and the directory is renamed when complete: a killed merge never leaves a half
model under TARGET_DIR.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import check_fsdp_checkpoint


def shard_dir(ckpt: str | Path) -> Path:
    """The directory holding ``model_world_size_*_rank_0.pt`` that ``ckpt`` designates."""
    path = Path(ckpt)
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        path = path / f"global_step_{latest.read_text().strip()}"
    return check_fsdp_checkpoint(path)


def merge_checkpoint(ckpt: str | Path, target: str | Path, *, log: Path | None = None,
                     python: str = sys.executable) -> Path:
    """Merge the shards ``ckpt`` designates into ``target`` (HF format); return ``target``."""
    target = Path(str(target).rstrip("/"))
    cli.refuse_overwrite([target], overwrite=False, other="another TARGET_DIR; the merge never overwrites")
    shards = shard_dir(ckpt)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    command = [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(shards),
               "--target_dir", str(partial)]
    print(f"[merge] {shards} -> {target}" + (f" (log {log})" if log else ""), flush=True)
    start = time.time()
    if log is None:
        completed = subprocess.run(command, check=False)
    else:
        with open(log, "w") as sink:
            completed = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        tail = log.read_text()[-3000:] if log else ""
        raise RuntimeError(f"verl.model_merger failed (exit {completed.returncode})" + (f"; log {log}:\n{tail}" if log else ""))
    partial.rename(target)
    print(f"[merge] done in {time.time() - start:.0f} s", flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m recipe.launch.merge CKPT TARGET_DIR", file=sys.stderr)
        return cli.EXIT_INPUT_ERROR
    merge_checkpoint(args[0], args[1])
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
