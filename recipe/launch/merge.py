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

Disk: the merged model is written in bfloat16 (verl's merger), about half the checkpoint's fp32
model shards (``merged_bytes``); a merge that cannot fit is refused before it starts, and one that fills the disk part-way
removes its partial directory: either way one ``error: ...`` line names the directory, the space
needed and the space free (exit code 2).
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from recipe.common import cli
from recipe.common.checkpoints import check_fsdp_checkpoint, tree_bytes


def shard_dir(ckpt: str | Path) -> Path:
    """The directory holding ``model_world_size_*_rank_0.pt`` that ``ckpt`` designates."""
    path = Path(ckpt)
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        path = path / f"global_step_{latest.read_text().strip()}"
    return check_fsdp_checkpoint(path)


def merged_bytes(shards: Path) -> int:
    """About the size of the merged model of the shard directory ``shards``: its model shards in bfloat16 (verl's
    merger writes bfloat16; the shards hold verl's fp32 weights: half their size) and the HF files."""
    fp32 = sum(tree_bytes(f) for f in shards.glob("model_world_size_*_rank_*.pt"))
    return fp32 // 2 + tree_bytes(shards / "huggingface")


def _run(command: list[str], *, log: Path | None) -> tuple[int, str, str]:
    """Run ``command``, its output to ``log`` (else to this console, up to a traceback); return the exit code, the
    output's end and the traceback not shown on the console (the caller shows it unless the disk was full)."""
    from recipe.launch.disk import TolerantLog

    tail: collections.deque[str] = collections.deque(maxlen=200)
    held: list[str] = []
    if log is not None:
        log.unlink(missing_ok=True)
    sink = TolerantLog(log) if log is not None else sys.stdout
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            for line in process.stdout:
                tail.append(line)
                if log is None and (held or line.startswith("Traceback (most recent call last)")):
                    held.append(line)
                    continue
                sink.write(line)
                sink.flush()
        return process.returncode, "".join(tail), "".join(held)
    finally:
        if log is not None:
            sink.close()


def merge_checkpoint(ckpt: str | Path, target: str | Path, *, log: Path | None = None,
                     python: str = sys.executable) -> Path:
    """Merge the shards ``ckpt`` designates into ``target`` (HF format); return ``target``."""
    target = Path(str(target).rstrip("/"))
    cli.refuse_overwrite([target], overwrite=False, other="another TARGET_DIR; the merge never overwrites")
    shards = shard_dir(ckpt)
    needed = merged_bytes(shards)
    cli.require_space(target.parent, needed, what=f"the merged model {target.name}",
                      hint="free space there or choose another TARGET_DIR, then run the same command again")
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    command = [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(shards),
               "--target_dir", str(partial)]
    print(f"[merge] {shards} -> {target}" + (f" (log {log})" if log else ""), flush=True)
    start = time.time()
    returncode, tail, traceback = _run(command, log=log)
    if returncode != 0:
        full = None  # the error of a full disk, measured before the partial output is removed
        if any(text in tail for text in cli.FULL_DISK_TEXTS) or cli.free_bytes(target.parent) < needed:
            full = cli.no_space(target.parent, needed=needed, what=f"the merged model {target.name}",
                                hint=f"the merge stopped after {cli.human_bytes(tree_bytes(partial))}; its partial "
                                     "output was removed; free space there or choose another TARGET_DIR, then run the "
                                     "same command again")
        shutil.rmtree(partial, ignore_errors=True)  # never a half model next to TARGET_DIR
        if full is not None:
            raise full
        print(traceback, end="", file=sys.stderr, flush=True)
        raise RuntimeError(f"verl.model_merger failed (exit {returncode})" + (f"; log {log}:\n{tail[-3000:]}" if log else ""))
    partial.rename(target)
    print(f"[merge] done in {time.time() - start:.0f} s", flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m recipe.launch.merge CKPT TARGET_DIR (scripts/merge_checkpoint.sh says what each is)"
    if "-h" in args or "--help" in args:
        print(usage)
        return 0
    if len(args) != 2:
        print(usage, file=sys.stderr)
        return cli.EXIT_INPUT_ERROR
    merge_checkpoint(args[0], args[1])
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
