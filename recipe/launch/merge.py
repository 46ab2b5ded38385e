"""Merge a verl FSDP checkpoint into a Hugging Face model directory (verl.model_merger).

    python -m recipe.launch.merge CKPT TARGET_DIR        # scripts/merge_checkpoint.sh runs this

CKPT may be a run directory (``trainer.default_local_dir``: its latest checkpoint, from
``latest_checkpointed_iteration.txt``), a ``global_step_N`` directory of an RL run (its ``actor/``
shards) or of an SFT run (shards at its top level), or the shard directory itself. TARGET_DIR must
not exist (nothing is overwritten). Works with or without the CPU plugin.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def shard_dir(ckpt: str | Path) -> Path:
    """The directory holding ``model_world_size_*_rank_0.pt`` that ``ckpt`` designates."""
    path = Path(ckpt)
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        path = path / f"global_step_{latest.read_text().strip()}"
    if (path / "actor").is_dir():
        path = path / "actor"
    if not any(path.glob("model_world_size_*_rank_0.pt")):
        raise FileNotFoundError(f"no FSDP shards (model_world_size_*_rank_0.pt) in {path}")
    return path


def merge_checkpoint(ckpt: str | Path, target: str | Path, *, log: Path | None = None,
                     python: str = sys.executable) -> Path:
    """Merge the shards ``ckpt`` designates into ``target`` (HF format); return ``target``."""
    shards, target = shard_dir(ckpt), Path(target)
    if target.exists():
        raise FileExistsError(f"{target} exists; refusing to overwrite it")
    command = [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(shards),
               "--target_dir", str(target)]
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
    print(f"[merge] done in {time.time() - start:.0f} s", flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m recipe.launch.merge CKPT TARGET_DIR", file=sys.stderr)
        return 2
    try:
        merge_checkpoint(args[0], args[1])
    except (FileNotFoundError, FileExistsError, RuntimeError) as err:
        print(f"merge: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
