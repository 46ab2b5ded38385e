"""The OPSD loss kernels and the memory model on one GPU: time, peak memory, error vs float64.

    python scripts/bench.py gpu --out gpu_out       # a bare GPU machine, from the repository root
    python scripts/bench.py gpu --smoke             # the same code on the CPU at tiny shapes (seconds)

Loss rows: the trainer's fused loss, the naive [N, V] loss and Liger-Kernel's fused linear JSD (if
importable; its ``jsd_beta`` is our beta, one temperature for both sides, the sum over entries / N =
our row weights 1/N) at Qwen3-1.7B's lm_head in bf16. Memory rows: ``recipe.analysis.memory_model``'s
prediction against one measured teacher forward and student forward+backward of Qwen3-0.6B / 1.7B
built from their configs. Imports only torch, transformers, liger-kernel (optional) and the project's
pure modules. What each column means: docs/results/gpu.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from recipe.analysis.memory_model import GiB, ModelShape, UpdateSetting, memory_terms
from recipe.common import cli
from recipe.opsd.core.losses import fused_linear_weighted_divergence, token_divergence
from recipe.opsd.core.signals import weighted_divergence_and_signals

LIGER_VERSION = "0.8.5"  # torch>=2.1.2, triton>=2.3.1 (its metadata); imports packaging, a transformers dependency
TEMPERATURE, CLIP_TAU = 1.1, 0.05
BETAS, CLIPS = (0.0, 0.5, 1.0), (CLIP_TAU, None)
IMPLS = ("fused", "naive", "liger")

# config.json of the released checkpoints (Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B): both tie lm_head to the embedding
QWEN3_CONFIGS = {
    "Qwen3-0.6B": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True),
    "Qwen3-1.7B": dict(model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True),
}
TINY_QWEN3 = dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True)


@dataclass(frozen=True)
class Scale:
    """One run's shapes: the loss rows' (H, V, N, dtype, repeats) and the memory rows' (models, micro-batch)."""

    device: str
    dtype: torch.dtype
    hidden: int
    vocab: int
    token_counts: tuple[int, ...]
    chunk_size: int
    warmup: int
    repeats: int
    ref_rows: int
    models: dict
    micro_batch: int
    seq_tokens: int


PAPER_MODEL = QWEN3_CONFIGS["Qwen3-1.7B"]
GPU = Scale("cuda", torch.bfloat16, PAPER_MODEL["hidden_size"], PAPER_MODEL["vocab_size"], (4096, 16384, 65536),
            chunk_size=1024, warmup=2, repeats=5, ref_rows=64, models=QWEN3_CONFIGS, micro_batch=4, seq_tokens=2048)
SMOKE = Scale("cpu", torch.float32, 64, 512, (128, 256), chunk_size=64, warmup=1, repeats=2, ref_rows=64,
              models={"tiny Qwen3 (2 layers)": TINY_QWEN3}, micro_batch=2, seq_tokens=32)


def _liger():
    """(LigerFusedLinearJSD or None, why not)."""
    try:
        from liger_kernel.transformers import LigerFusedLinearJSD
    except Exception as err:  # absent, or not loadable with this torch / triton
        return None, f"skipped: liger-kernel not importable ({type(err).__name__})"
    return LigerFusedLinearJSD, ""


def _free(device: str) -> None:
    """Return the GPU memory of the tensors just dropped (an OOM's traceback frames included) to the device."""
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _failed(err: Exception) -> str:
    first_line = (str(err).splitlines() or [""])[0]
    return f"failed: {type(err).__name__}: {first_line}"


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).abs().max() / ref.abs().max())


# --------------------------------------------------------------------------- 1. loss rows
@dataclass
class LossInputs:
    student_hidden_NH: torch.Tensor  # requires grad
    student_weight_VH: torch.Tensor  # requires grad
    teacher_hidden_NH: torch.Tensor
    teacher_weight_VH: torch.Tensor


def make_weights(scale: Scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher lm_head [V, H]: the teacher a frozen copy (self-distillation), logits of std ~3."""
    gen = torch.Generator(scale.device).manual_seed(0)
    weight_VH = torch.randn(scale.vocab, scale.hidden, generator=gen, device=scale.device).mul_(3.0 / scale.hidden**0.5)
    weight_VH = weight_VH.to(scale.dtype)
    return weight_VH.clone().requires_grad_(True), weight_VH


def make_inputs(n: int, scale: Scale, student_weight_VH, teacher_weight_VH) -> LossInputs:
    """The teacher sees a perturbed context: its hidden states are the student's plus noise (KL ~0.1-1)."""
    gen = torch.Generator(scale.device).manual_seed(n)
    hidden_NH = torch.randn(n, scale.hidden, generator=gen, device=scale.device)
    teacher_NH = torch.randn(n, scale.hidden, generator=gen, device=scale.device).mul_(0.5).add_(hidden_NH)
    return LossInputs(hidden_NH.to(scale.dtype).requires_grad_(True), student_weight_VH, teacher_NH.to(scale.dtype),
                      teacher_weight_VH)


def reference(inp: LossInputs, rows: int, beta: float, clip: float | None, logits_dtype: torch.dtype | None):
    """float64 per-position values [rows] and d mean-loss / d hidden [rows, H] of the first ``rows`` rows.

    ``logits_dtype``: the logits are first rounded to it (as a bf16 lm_head does; straight-through in backward),
    else they are the exact products of the inputs."""
    n = inp.student_hidden_NH.shape[0]
    hidden_RH = inp.student_hidden_NH.detach()[:rows].double().requires_grad_(True)
    student_RV = hidden_RH @ inp.student_weight_VH.detach().double().T
    with torch.no_grad():
        teacher_RV = inp.teacher_hidden_NH[:rows].double() @ inp.teacher_weight_VH.double().T
    if logits_dtype is not None:
        student_RV = student_RV + (student_RV.detach().to(logits_dtype).double() - student_RV.detach())
        teacher_RV = teacher_RV.to(logits_dtype).double()
    values_R = token_divergence(student_RV, teacher_RV, beta=beta, clip_tau=clip, student_temperature=TEMPERATURE)
    (grad_RH,) = torch.autograd.grad(values_R.sum() / n, hidden_RH)
    return values_R.detach(), grad_RH


def _loss_fn(impl: str, inp: LossInputs, beta: float, clip: float | None, scale: Scale, liger_cls):
    """A callable returning (mean loss, per-position values [N] or None) with autograd to the student."""
    n = inp.student_hidden_NH.shape[0]
    if impl == "fused":
        weights_N = torch.full((n,), 1.0 / n, device=scale.device)
        return lambda: fused_linear_weighted_divergence(
            inp.student_hidden_NH, inp.student_weight_VH, inp.teacher_hidden_NH, inp.teacher_weight_VH,
            row_weights_N=weights_N, beta=beta, clip_tau=clip, student_temperature=TEMPERATURE,
            chunk_size=scale.chunk_size)
    if impl == "naive":
        def naive():
            student_logits_NV = inp.student_hidden_NH @ inp.student_weight_VH.T
            with torch.no_grad():
                teacher_logits_NV = inp.teacher_hidden_NH @ inp.teacher_weight_VH.T
            values_N = token_divergence(student_logits_NV, teacher_logits_NV, beta=beta, clip_tau=clip,
                                        student_temperature=TEMPERATURE)
            return values_N.mean(), values_N.detach()
        return naive
    liger_loss = liger_cls(jsd_beta=beta, temperature=TEMPERATURE)  # clip off: the caller runs clip None only
    return lambda: (liger_loss(inp.student_hidden_NH, inp.student_weight_VH, inp.teacher_hidden_NH,
                               inp.teacher_weight_VH, None), None)


def measure(fn, inp: LossInputs, scale: Scale) -> dict:
    """Median forward+backward time and peak memory of ``fn``; its last loss, values and hidden gradient."""
    cuda = scale.device == "cuda"
    times_ms, result, base = [], None, 0
    for i in range(scale.warmup + scale.repeats):
        inp.student_hidden_NH.grad = inp.student_weight_VH.grad = None
        result = None
        if cuda and i == scale.warmup:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        result = fn()
        result[0].backward()
        if cuda:
            stop.record()
            torch.cuda.synchronize()
            elapsed_ms = start.elapsed_time(stop)
        else:
            elapsed_ms = (time.perf_counter() - t0) * 1e3
        if i >= scale.warmup:
            times_ms.append(elapsed_ms)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return {"ms": statistics.median(times_ms), "peak_gb": None if peak is None else peak / GiB,
            "extra_gb": None if peak is None else (peak - base) / GiB, "loss": float(result[0].detach()),
            "values": result[1], "grad_h": inp.student_hidden_NH.grad}


def _loss_row(impl: str, inp: LossInputs, beta: float, clip: float | None, scale: Scale, liger_cls,
              references: dict, fused_loss: float | None) -> dict:
    """One row's measurements and errors vs each float64 reference; an OOM or an error is the row's status."""
    n, out = inp.student_hidden_NH.shape[0], None
    ref_rows = min(scale.ref_rows, n)
    try:
        out = measure(_loss_fn(impl, inp, beta, clip, scale, liger_cls), inp, scale)
        row = {"status": "ok", "ms": out["ms"], "tflops": 8 * n * scale.hidden * scale.vocab / (out["ms"] * 1e9),
               "peak_gb": out["peak_gb"], "extra_gb": out["extra_gb"], "loss": out["loss"],
               "loss_vs_fused": None if fused_loss is None else abs(out["loss"] - fused_loss) / abs(fused_loss)}
        if impl == "liger":  # no per-position values: its loss on the reference rows vs their float64 mean
            head = LossInputs(inp.student_hidden_NH.detach()[:ref_rows], inp.student_weight_VH,
                              inp.teacher_hidden_NH[:ref_rows], inp.teacher_weight_VH)
            with torch.no_grad():
                head_mean_1 = _loss_fn(impl, head, beta, clip, scale, liger_cls)()[0].reshape(1)
        for suffix, (ref_values_R, ref_grad_RH) in references.items():
            if impl == "liger":
                row["err_values" + suffix] = _rel_err(head_mean_1, ref_values_R.mean().reshape(1))
            else:
                row["err_values" + suffix] = _rel_err(out["values"][:ref_rows], ref_values_R)
            row["err_grad_h" + suffix] = _rel_err(out["grad_h"][:ref_rows], ref_grad_RH)
        return row
    except torch.cuda.OutOfMemoryError:
        return {"status": "OOM"}
    except Exception as err:  # reported, and the run fails; the other rows still run
        return {"status": _failed(err)}
    finally:
        out = inp.student_hidden_NH.grad = inp.student_weight_VH.grad = None
        _free(scale.device)


def loss_rows(scale: Scale, deadline: float) -> list[dict]:
    liger_cls, liger_why = _liger()
    if liger_cls is not None and scale.device != "cuda":
        liger_cls, liger_why = None, "skipped: liger-kernel needs a CUDA device (Triton)"
    student_weight_VH, teacher_weight_VH = make_weights(scale)
    rows = []
    for n in scale.token_counts:
        inp = make_inputs(n, scale, student_weight_VH, teacher_weight_VH)
        for beta in BETAS:
            for clip in CLIPS:
                references = {suffix: reference(inp, min(scale.ref_rows, n), beta, clip, logits_dtype)
                              for suffix, logits_dtype in (("", None), ("_rounded", scale.dtype))}
                fused_loss = None
                for impl in IMPLS if clip is None else IMPLS[:2]:  # Liger has no clip
                    row = {"n": n, "beta": beta, "clip_tau": clip, "impl": impl}
                    if impl == "liger" and liger_cls is None:
                        row["status"] = liger_why
                    elif time.monotonic() > deadline:
                        row["status"] = "skipped: time budget spent (--budget-s)"
                    else:
                        row.update(_loss_row(impl, inp, beta, clip, scale, liger_cls, references, fused_loss))
                    fused_loss = row.get("loss") if impl == "fused" else fused_loss
                    rows.append(row)
        del inp
        _free(scale.device)
    return rows


# --------------------------------------------------------------------------- 2. memory model rows
def _build_qwen3(config: dict, scale: Scale):
    from transformers import AutoModelForCausalLM, Qwen3Config

    hf_config = Qwen3Config(**{k: v for k, v in config.items() if k != "model_type"}, use_cache=False)
    with torch.device(scale.device):
        return AutoModelForCausalLM.from_config(hf_config, dtype=scale.dtype, attn_implementation="sdpa")


def _update(student, teacher, ids_BT: torch.Tensor, scale: Scale) -> None:
    """One teacher forward (no grad) and one student forward+backward with the trainer's loss."""
    n = ids_BT.numel()
    with torch.no_grad():
        teacher_hidden_NH = teacher.model(input_ids=ids_BT).last_hidden_state.reshape(n, -1)
    student_hidden_NH = student.model(input_ids=ids_BT).last_hidden_state.reshape(n, -1)
    loss, _, _ = weighted_divergence_and_signals(
        student_hidden_NH, student.lm_head.weight, teacher_hidden_NH, teacher.lm_head.weight, ids_BT.reshape(n),
        row_weights_N=torch.full((n,), 1.0 / n, device=ids_BT.device), clip_tau=CLIP_TAU,
        student_temperature=TEMPERATURE, chunk_size=scale.chunk_size)
    loss.backward()


def memory_rows(scale: Scale, deadline: float) -> list[dict]:
    cuda, nbytes = scale.device == "cuda", scale.dtype.itemsize
    rows = []
    for name, config in scale.models.items():
        shape = ModelShape.from_hf_config(config, name=name)
        settings = [UpdateSetting(n_gpus=1, micro_batch=scale.micro_batch, seq_tokens=scale.seq_tokens,
                                  chunk_size=scale.chunk_size, gradient_checkpointing=gc_on, fsdp=False,
                                  teacher_offload=False, param_bytes=nbytes, grad_bytes=nbytes, optimizer_bytes=0,
                                  compute_bytes=nbytes, teacher_bytes=nbytes) for gc_on in (True, False)]
        if time.monotonic() > deadline:
            rows += [{"model": name, "gradient_checkpointing": setting.gradient_checkpointing,
                      "status": "skipped: time budget spent (--budget-s)"} for setting in settings]
            continue
        _free(scale.device)
        before = torch.cuda.memory_allocated() if cuda else 0
        torch.manual_seed(0)
        student, teacher = _build_qwen3(config, scale), _build_qwen3(config, scale).requires_grad_(False).eval()
        student.train()
        gen = torch.Generator(scale.device).manual_seed(1)
        ids_BT = torch.randint(0, shape.vocab, (scale.micro_batch, scale.seq_tokens), generator=gen,
                               device=scale.device)
        _update(student, teacher, ids_BT[:1, :8], scale)  # warm-up: kernels, cuBLAS workspace
        for setting in settings:
            terms = memory_terms(shape=shape, setting=setting)
            row = {"model": name, "params": shape.params, "micro_batch": setting.micro_batch,
                   "seq_tokens": setting.seq_tokens, "gradient_checkpointing": setting.gradient_checkpointing,
                   "terms_gb": {k: v / GiB for k, v in terms.items()}, "predicted_gb": terms["peak"] / GiB,
                   "measured_gb": None, "reserved_gb": None, "predicted_over_measured": None, "status": "ok"}
            rows.append(row)
            if setting.gradient_checkpointing:
                student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                student.gradient_checkpointing_disable()
            student.zero_grad(set_to_none=True)
            _free(scale.device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            try:
                _update(student, teacher, ids_BT, scale)
            except torch.cuda.OutOfMemoryError:
                row["status"] = "OOM"
            except Exception as err:  # reported, fails the run; the other rows still run
                row["status"] = _failed(err)
            if cuda and row["status"] == "ok":
                row["measured_gb"] = (torch.cuda.max_memory_allocated() - before) / GiB
                row["reserved_gb"] = torch.cuda.max_memory_reserved() / GiB
                row["predicted_over_measured"] = row["predicted_gb"] / row["measured_gb"]
        del student, teacher
        _free(scale.device)
    return rows


# --------------------------------------------------------------------------- report
def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def machine(scale: Scale) -> dict:
    return {"device": torch.cuda.get_device_name() if scale.device == "cuda" else f"CPU ({platform.machine()})",
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": _version("triton"),
            "transformers": _version("transformers"), "liger_kernel": _version("liger-kernel"),
            "python": platform.python_version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _num(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _gb(value) -> str:
    return _num(value, ".3g")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _term_cells(terms_gb: dict | None) -> list[str]:
    """The memory model's terms (GB) shown: student params + grads, teacher, activations, loss, recompute."""
    if terms_gb is None:
        return ["n/a"] * 5
    return [_gb(terms_gb["student_params"] + terms_gb["student_grads"]),
            _gb(terms_gb["teacher_resident"] + terms_gb["teacher_hidden"]),
            *(_gb(terms_gb[key]) for key in ("activations", "loss_workspace", "layer_recompute"))]


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    loss_table = _table(
        ["N", "beta", "clip", "impl", "ms", "TFLOP/s", "peak GB", "extra GB", "loss vs fused", "err values",
         "err grad_h", "err values (rounded)", "err grad_h (rounded)", "status"],
        [[str(r["n"]), str(r["beta"]), "off" if r["clip_tau"] is None else str(r["clip_tau"]), r["impl"],
          _num(r.get("ms"), ".2f"), _num(r.get("tflops"), ".3g"), _gb(r.get("peak_gb")), _gb(r.get("extra_gb")),
          *(_num(r.get(key), ".1e") for key in ("loss_vs_fused", "err_values", "err_grad_h", "err_values_rounded",
                                                "err_grad_h_rounded")), r["status"]] for r in report["loss_rows"]])
    memory_table = _table(
        ["model", "GC", "params+grads GB", "teacher GB", "activations GB", "loss GB", "recompute GB", "predicted GB",
         "measured GB", "reserved GB", "predicted / measured", "status"],
        [[r["model"], "on" if r["gradient_checkpointing"] else "off", *_term_cells(r.get("terms_gb")),
          _gb(r.get("predicted_gb")), _gb(r.get("measured_gb")), _gb(r.get("reserved_gb")),
          _num(r.get("predicted_over_measured"), ".3f"), r["status"]] for r in report["memory_rows"]])
    smoke = " (smoke: CPU, float32, tiny shapes)" if report["smoke"] else ""
    return "\n".join([
        f"# OPSD loss kernels and memory model{smoke}", "",
        f"{m['device']}; torch {m['torch']} (CUDA {m['cuda']}), triton {m['triton']}, "
        f"transformers {m['transformers']}, liger-kernel {m['liger_kernel']}; {m['date']}", "",
        "## Loss: forward + backward of the mean per-position divergence", "",
        f"H {s['hidden']}, V {s['vocab']}, {s['dtype']} inputs, temperatures {TEMPERATURE}, fused chunk "
        f"{s['chunk_size']} rows; median of {s['repeats']} calls after {s['warmup']} warm-up; TFLOP/s = 8 N H V / "
        f"time. Errors: max |x - ref| / max |ref| on the first {s['ref_rows']} rows vs float64 of the exact logits "
        f"h W^T, and (rounded) of the logits rounded to {s['dtype']} as the {s['dtype']} lm_head matmul of fused and "
        "naive forms them (Liger's GEMM returns float32 logits).", "",
        *loss_table, "",
        "Liger has no per-entry clip: its rows are at clip off only; its err values compares its loss on the reference "
        "rows with their float64 mean (it returns no per-position values). Without liger-kernel its rows are skipped: "
        f"carry the wheel (`pip download liger-kernel=={LIGER_VERSION} --no-deps -d wheels`) and start with "
        f"`pip install --no-deps wheels/liger_kernel-{LIGER_VERSION}-py3-none-any.whl`.", "",
        "## Memory model: predicted vs measured peak of one teacher forward + student forward/backward", "",
        f"{s['dtype']} models from their config (random weights), micro-batch {s['micro_batch']} x {s['seq_tokens']} "
        "tokens, no FSDP, teacher resident, no optimizer; measured = max_memory_allocated minus the memory allocated "
        "before the models existed.", "", *memory_table]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, float32, tiny shapes (seconds): the same code path")
    ap.add_argument("--out", help="directory for gpu_bench.md and gpu_bench.json (created)")
    ap.add_argument("--overwrite", action="store_true", help="replace the files of an earlier run in --out")
    ap.add_argument("--repeats", type=int, help="timed calls per loss row (default: 5 on the GPU, 2 with --smoke)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="rows that would start later are skipped")
    cli.add_debug_argument(ap)
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        raise cli.InputError(f"must be >= 1, got {args.repeats}", file="--repeats")
    if not args.budget_s > 0:
        raise cli.InputError(f"must be > 0, got {args.budget_s}", file="--budget-s")
    if args.out is not None:
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise cli.InputError("is not a directory", file=args.out, hint="pass a directory as --out")
        paths = [Path(args.out) / "gpu_bench.md", Path(args.out) / "gpu_bench.json"]
        cli.refuse_overwrite(paths, overwrite=args.overwrite, other="another --out")
    scale = SMOKE if args.smoke else GPU
    if scale.device == "cuda" and not torch.cuda.is_available():
        raise cli.InputError("no CUDA device visible to torch", file="gpu",
                             hint="run on a GPU machine, or pass --smoke for the CPU run at tiny shapes")
    if args.repeats is not None:
        scale = replace(scale, repeats=args.repeats)
    deadline = time.monotonic() + args.budget_s
    report = {"smoke": args.smoke, "machine": machine(scale),
              "settings": {"hidden": scale.hidden, "vocab": scale.vocab,
                           "dtype": str(scale.dtype).removeprefix("torch."),
                           "token_counts": list(scale.token_counts), "chunk_size": scale.chunk_size,
                           "warmup": scale.warmup, "repeats": scale.repeats, "ref_rows": scale.ref_rows,
                           "temperature": TEMPERATURE, "micro_batch": scale.micro_batch,
                           "seq_tokens": scale.seq_tokens, "budget_s": args.budget_s}}
    report["memory_rows"] = memory_rows(scale, deadline)  # first: bounded and cheap; the loss rows get the rest
    report["loss_rows"] = loss_rows(scale, deadline)
    text = markdown(report)
    print(text, end="")
    if args.out is not None:
        out = Path(args.out)
        with cli.on_full_disk(out, what="the benchmark report"):
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpu_bench.md").write_text(text)
            (out / "gpu_bench.json").write_text(json.dumps(report, indent=1) + "\n")
    failed = [r for r in report["loss_rows"] + report["memory_rows"] if r["status"].startswith("failed")]
    return 1 if failed else 0
