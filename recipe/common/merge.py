"""The one FSDP -> Hugging Face merge (verl.model_merger), with its disk checks: the tool's and the evaluation's.

    python -m recipe.common.merge CKPT TARGET_DIR        # scripts/merge_checkpoint.sh runs this

CKPT: a run directory (its latest save), a ``global_step_N`` directory (RL: its ``actor/`` shards; SFT: at its
top level) or the shard directory. TARGET_DIR must not exist. The save is checked whole and the merged model's
size against the free space before the merger starts; it writes next to TARGET_DIR, which is renamed when
complete: a killed or failed merge, or a full disk, never leaves a half model. Input errors and a full disk are
one ``error: ...`` line, exit code 2 (docs/launch.md#merging-a-checkpoint).
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

RETRY_HINT = "free space there or choose another TARGET_DIR, then run the same command again"


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


def is_hf_model_dir(path: Path) -> bool:
    """``config.json`` and weights: a Hugging Face model directory (a merge's complete output)."""
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    return (path / "config.json").is_file() and bool(weights)


def _run_merger(shards: Path, target: Path, *, log: Path | None, python: str) -> tuple[int, str, str]:
    """Run verl's merger of ``shards`` into ``target``, its output to ``log`` (else to this console, up to a
    traceback); return the exit code, the output's end and the traceback not shown on the console (the caller
    shows it unless the disk was full)."""
    command = [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(shards),
               "--target_dir", str(target)]
    tail: collections.deque[str] = collections.deque(maxlen=200)
    held: list[str] = []
    if log is not None:
        log.unlink(missing_ok=True)
    sink = cli.TolerantLog(log) if log is not None else sys.stdout
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


def merge_checkpoint(ckpt: str | Path, target: str | Path, *, log: Path | None = None, python: str = sys.executable,
                     what: str | None = None, retry_hint: str = RETRY_HINT) -> Path:
    """Merge the shards ``ckpt`` designates into ``target`` (HF format); return ``target``.

    ``what`` / ``retry_hint``: how a full disk's error line names the output (default: ``the merged model
    <name>``) and the way out (default: another TARGET_DIR)."""
    target = Path(str(target).rstrip("/"))
    what = what or f"the merged model {target.name}"
    cli.refuse_overwrite([target], overwrite=False, other="another TARGET_DIR; the merge never overwrites")
    shards = shard_dir(ckpt)
    needed = merged_bytes(shards)
    cli.require_space(target.parent, needed, what=what, hint=retry_hint)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    print(f"[merge] {shards} -> {target}" + (f" (log {log})" if log else ""), flush=True)
    start = time.time()
    returncode, tail, traceback = _run_merger(shards, partial, log=log, python=python)
    if returncode != 0:
        full = None  # the error of a full disk, measured before the partial output is removed
        if any(text in tail for text in cli.FULL_DISK_TEXTS) or cli.free_bytes(target.parent) < needed:
            full = cli.no_space(target.parent, needed=needed, what=what,
                                hint=f"the merge stopped after {cli.human_bytes(tree_bytes(partial))}; its partial "
                                     f"output was removed; {retry_hint}")
        shutil.rmtree(partial, ignore_errors=True)  # never a half model next to TARGET_DIR
        if full is not None:
            raise full
        print(traceback, end="", file=sys.stderr, flush=True)
        raise RuntimeError(f"verl.model_merger failed (exit {returncode})" + (f"; log {log}:\n{tail[-3000:]}" if log else ""))
    if not is_hf_model_dir(partial):
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"model merge of {shards} produced no model weights in {partial}")
    partial.rename(target)
    print(f"[merge] done in {time.time() - start:.0f} s", flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m recipe.common.merge CKPT TARGET_DIR (scripts/merge_checkpoint.sh says what each is)"
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
