"""Per-model, per-template prompt-length filtering of a built verl parquet (never truncates).

Paper (appendix "OPSD Data"): student and teacher prompts are rendered independently with the model's chat template
in their reasoning modes; rows whose rendered prompts exceed 1,024 tokens (the CoT+Solution teacher: 8,192) are
dropped, each model--mode configuration and each teacher-context control (its own template) filtered separately.
Which prompts are checked, the caps, the rewritten ``prompt`` column: docs/prompts.md (data pipeline).

    python -m data_prep.length_filter --input data/parquet/openthoughts/train.parquet \\
        --tokenizer Qwen/Qwen3-1.7B --student-mode no_think --teacher-mode think \\
        --teacher-context full_solution --out data/parquet/openthoughts/qwen3-1.7b_no_think-think_full.parquet
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from data_prep.common import Counts, add_output_args, check_writable, print_summary, read_parquet_rows, sidecar_path, write_json, write_parquet
from recipe.common import cli
from recipe.common.chat import MODES as MODE_CHOICES  # native = the template's own default
from recipe.common.chat import render
from recipe.common.prompts import TEACHER_CONTEXTS, build_prompt_pair, student_style

DEFAULT_PROMPT_CAP = 1024
DEFAULT_TEACHER_CAPS = {"cot_solution": 8192}


def parse_context_spec(spec: str) -> tuple[str, int]:
    """``"full_solution"`` -> (full_solution, 1024); ``"cot_solution:12288"`` -> (cot_solution, 12288)."""
    name, _, cap = spec.partition(":")
    if name not in TEACHER_CONTEXTS:
        raise cli.InputError(f"--teacher-context {spec!r}: {name!r} is not one of {list(TEACHER_CONTEXTS)}")
    if not cap:
        return name, DEFAULT_TEACHER_CAPS.get(name, DEFAULT_PROMPT_CAP)
    if not cap.isdigit() or int(cap) < 1:
        raise cli.InputError(f"--teacher-context {spec!r}: cap {cap!r} must be a positive integer")
    return name, int(cap)


def token_counts(tokenizer, texts: Sequence[str], *, batch_size: int = 512) -> list[int]:
    """Token count of each text, no special tokens added (as the chat-template ids)."""
    counts = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(list(texts[start : start + batch_size]), add_special_tokens=False)["input_ids"]
        counts.extend(len(ids) for ids in encoded)
    return counts


def filter_rows(
    rows: Sequence[Mapping],
    tokenizer,
    *,
    student_mode: str | None,
    teacher_mode: str | None,
    teacher_contexts: Sequence[tuple[str, int]],
    max_prompt_length: int = DEFAULT_PROMPT_CAP,
    counts: Counts,
    strict: bool = False,
    source: str | None = None,
) -> list[dict]:
    """Rows whose rendered prompts all fit their caps (see the module docstring).

    ``strict``: a row missing a field its teacher context needs is an ``InputError`` naming
    ``source`` (the input path) and the row id, instead of a counted drop.
    """
    if max_prompt_length < 1:
        raise cli.InputError(f"--max-prompt-length {max_prompt_length}: must be >= 1")
    styles = {student_style(name) for name, _ in teacher_contexts}
    if len(styles) > 1:
        raise cli.InputError(
            f"teacher contexts {[n for n, _ in teacher_contexts]} imply different student messages "
            f"(styles {sorted(map(str, styles))}); filter them in separate runs"
        )
    student_texts, teacher_texts, candidates = [], {name: [] for name, _ in teacher_contexts}, []
    for row in rows:
        extra = row["extra_info"]
        row_id = str(extra.get("id"))
        student = [dict(m) for m in row["prompt"]]
        teachers = {}
        try:
            for name, _ in teacher_contexts:
                student, teachers[name] = build_prompt_pair(name, extra)
        except ValueError as err:
            if strict:
                raise cli.InputError(str(err), file=source, row=row_id,
                                     hint="fix the row, or leave out --strict to count and skip such rows") from None
            counts.drop(f"teacher_{name}_missing_field", row_id)
            continue
        candidates.append({**row, "prompt": student})
        student_texts.append(render(student, tokenizer, student_mode))
        for name in teachers:
            teacher_texts[name].append(render(teachers[name], tokenizer, teacher_mode))
    student_lengths = token_counts(tokenizer, student_texts)
    teacher_lengths = {name: token_counts(tokenizer, texts) for name, texts in teacher_texts.items()}
    kept, kept_lengths = [], {"student": [], **{name: [] for name in teacher_lengths}}
    for i, row in enumerate(candidates):
        row_id = str(row["extra_info"].get("id"))
        if student_lengths[i] > max_prompt_length:
            counts.drop(f"student_prompt_over_{max_prompt_length}", row_id)
            continue
        over = [(name, cap) for name, cap in teacher_contexts if teacher_lengths[name][i] > cap]
        if over:
            name, cap = over[0]
            counts.drop(f"teacher_{name}_prompt_over_{cap}", row_id)
            continue
        kept.append(row)
        kept_lengths["student"].append(student_lengths[i])
        for name in teacher_lengths:
            kept_lengths[name].append(teacher_lengths[name][i])
    counts.notes["kept_prompt_tokens"] = {
        name: {"max": max(v), "mean": round(sum(v) / len(v), 1)} for name, v in kept_lengths.items() if v
    }
    return kept


def load_tokenizer(path: str, chat_template: Path | None):
    """The tokenizer of a local folder (checked first) or a hub name; a failure names the path."""
    from transformers import AutoTokenizer

    from recipe.common.checkpoints import check_tokenizer_files

    if Path(path).expanduser().exists() or str(path).startswith((".", "/", "~")):
        check_tokenizer_files(Path(path).expanduser())
    template = cli.require_file(chat_template, what="chat template") if chat_template is not None else None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:  # transformers: OSError (not found / offline), ValueError (bad repo id)
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise cli.InputError(f"could not load a tokenizer: {type(err).__name__}: {first}", file=path,
                             hint="pass a local model or tokenizer folder; hub names need network") from err
    if template is not None:
        tokenizer.chat_template = template.read_text()
    return tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_prep.length_filter", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", required=True, type=Path, help="a parquet written by a data_prep builder")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder (or hub name when online)")
    p.add_argument("--chat-template", type=Path, default=None, help="jinja file replacing the tokenizer's chat template")
    p.add_argument("--student-mode", required=True, choices=MODE_CHOICES,
                   help="student reasoning mode; 'native' = the template's own default (no enable_thinking passed: "
                        "templates without a thinking switch, e.g. SmolLM2, DeepSeek-R1-Distill)")
    p.add_argument("--teacher-mode", default="think", choices=MODE_CHOICES,
                   help="teacher reasoning mode ('native' for templates without a thinking switch)")
    p.add_argument("--teacher-context", action="append", default=[], metavar="NAME[:CAP]",
                   help=f"teacher context to fit (repeatable); NAME in {list(TEACHER_CONTEXTS)}, CAP default 1024 (8192 for cot_solution)")
    p.add_argument("--max-prompt-length", type=int, default=DEFAULT_PROMPT_CAP, help="student prompt cap (tokens)")
    p.add_argument("--strict", action="store_true", help="a row missing a field its teacher context needs is an error")
    add_output_args(p)
    args = p.parse_args(argv)
    contexts = [parse_context_spec(spec) for spec in args.teacher_context]
    if len({name for name, _ in contexts}) != len(contexts):
        raise cli.InputError("each --teacher-context may be given once")
    out = Path(args.out)
    check_writable([out, sidecar_path(out, "summary")], overwrite=args.overwrite)
    rows = read_parquet_rows(args.input)
    tokenizer = load_tokenizer(args.tokenizer, args.chat_template)
    counts = Counts(notes={"input": str(args.input)})
    counts.stages["input_rows"] = len(rows)
    kept = filter_rows(
        rows, tokenizer, student_mode=args.student_mode, teacher_mode=args.teacher_mode,
        teacher_contexts=contexts, max_prompt_length=args.max_prompt_length, counts=counts, strict=args.strict,
        source=str(args.input),
    )
    counts.stages["written"] = len(kept)
    write_parquet(kept, out, overwrite=args.overwrite, counts=counts)
    summary = {
        "input": str(args.input), "output": str(out), "tokenizer": args.tokenizer,
        "chat_template": str(args.chat_template) if args.chat_template else "tokenizer's own",
        "student_mode": args.student_mode, "teacher_mode": args.teacher_mode,
        "max_prompt_length": args.max_prompt_length, "teacher_contexts": dict(contexts),
        **counts.as_dict(),
    }
    write_json(summary, sidecar_path(out, "summary"), overwrite=args.overwrite)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
