"""The compatibility probe: frozen signals and K monitored OPSD steps per cell, with indicators and a verdict per cell.

Not shown to predict a full run's regime (docs/opsd_recipe.md, "Compatibility probe"; docs/results/probe.md). For
one model and training parquet (the launcher's ``MODEL_PATH`` / ``TRAIN_FILES``, or a CPU demo) and a grid of cells
it measures the frozen signals on the training problems (``frozen_signals``), runs each cell for K monitored steps
through the launcher (``run_cells_steps``; cells that share student prompts share one launch), classifies each cell
(``recipe.probe.verdicts``) and recommends one or says that none is compatible: ``run_probe``, which writes
probe.json, probe.md and probe.png. The full runs of ``--validate`` / ``--control``: ``recipe.probe.validation``.

    CPU_DEMO=toy python scripts/probe.py --out-dir probe_toy --contexts full_solution unrelated --clip-taus none 0.05
    CPU_DEMO=real python scripts/probe.py --out-dir probe_real --clip-taus 0.05 none --temperatures 1.1 0.7
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipe.probe import verdicts as compatibility
from recipe.probe.cells import Cell, cells_override, launch_groups
from recipe.probe.report import plot, reasons_text, table


def accuracy(rollouts, items, rows, tokenizer) -> float:
    """Share of ``rollouts`` the shared grader's reward mode (``recipe.common.reward``) scores correct against their
    row's ``extra_info.answer``."""
    from recipe.common.grader import REWARD, grade

    correct = 0
    for rollout in rollouts:
        text = tokenizer.decode(rollout.response_ids, skip_special_tokens=True)
        correct += grade(text, rows[items[rollout.prompt].row]["extra_info"]["answer"], mode=REWARD).acc
    return correct / len(rollouts)

def eos_probabilities(token_signals, rollouts, eos_ids: Sequence[int]) -> dict[str, float | None]:
    """Mean student and teacher probability of the end-of-turn token where the student ended its turn (the
    last position of each rollout that finished with an eos id), and their ratio."""
    import torch

    last = {}
    for row, (rollout, position) in enumerate(zip(token_signals["rollout"].tolist(), token_signals["position"].tolist())):
        last[rollout] = (row, position)
    rows = [row for r, (row, pos) in last.items()
            if rollouts[r].finish_reason == "stop" and int(token_signals["sampled_id"][row]) in set(eos_ids)]
    if not rows:
        return {"eos_student": None, "eos_teacher": None, "eos_ratio": None, "eos_rollouts": 0}
    index = torch.as_tensor(rows)
    student = float(token_signals["student_logp"][index].double().exp().mean())
    teacher = float(token_signals["teacher_logp"][index].double().exp().mean())
    return {"eos_student": student, "eos_teacher": teacher, "eos_ratio": teacher / student if student > 0 else None,
            "eos_rollouts": len(rows)}

def frozen_signals(model_path: str, train_file: str, cells: Sequence[Cell], *, cap: int, top_p: float, top_k: int,
                   num_prompts: int, seed: int = 42, log=print) -> dict[str, dict[str, Any]]:
    """``{cell name: frozen summary}``; rollouts sampled once per (student mode, temperature), scored per teacher
    condition (and per clip tau for the clip diagnostics).

    The frozen signals the paper ties to outcomes, on the training problems (``recipe.analysis.signal_analysis``:
    the same rollouts rescored per teacher condition): initial forward KL, D > .05, the highest-entropy 20%'s KL
    share, the decay of the KL over response positions (last / first quarter of the rollout cap), the teacher's
    probability of the student's end-of-turn token where the student ended its turn, and the teacher mass the
    clip removes; and two mechanisms: the accuracy of the teacher's own samples (its prompt) against the
    student's on the same problems (the shared grader's reward), and the share of decisive positions at which
    the clip turns the loss's push on the teacher's top token around (``recipe.opsd.core.signals.top_push_summary``).
    """
    from recipe.analysis import signal_analysis as sa
    from recipe.analysis.signal_rollouts import load_model, load_rows, load_tokenizer
    from recipe.common.prompts import student_style
    from recipe.opsd.core import signals

    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path)
    rows = load_rows(train_file)
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])
    quarter = max(1, cap // 4)
    windows = ((0, quarter), (quarter, 2 * quarter), (2 * quarter, 3 * quarter), (3 * quarter, cap))  # absolute, shown
    out: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, float], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.student_mode, cell.temperature), []).append(cell)
    for (student_mode, temperature), members in groups.items():
        start = time.time()
        scorable = [c for c in members if student_style(c.context) is None]
        for cell in set(members) - set(scorable):
            out[cell.name] = {"skipped": f"context {cell.context} changes the student prompt: no shared rollouts"}
        if not scorable:
            continue
        conditions = sorted({f"{c.context}:{c.teacher_mode}" for c in scorable})
        taus = sorted({c.clip_tau for c in scorable if c.clip_tau is not None}) or [signals.HIGH_KL_THRESHOLD]
        base = sa.SignalAnalysisConfig(num_prompts=num_prompts, rollouts_per_prompt=2, temperature=temperature,
                                       top_p=top_p, top_k=top_k, max_new_tokens=cap, seed=seed, student_mode=student_mode,
                                       conditions=tuple(conditions), windows=windows, clip_tau=taus[0])
        items, _ = sa.build_prompt_items(rows, tokenizer, config=base)
        rollouts = sa.sample_rollouts(model, tokenizer, items, config=base)
        scored = {tau: sa.score_rollouts(model, items, rollouts, config=dataclasses.replace(base, clip_tau=tau),
                                         top_push=True) for tau in taus}
        student_acc = accuracy(rollouts, items, rows, tokenizer)
        teacher_acc = {}
        for condition in conditions:  # the teacher's own samples: its prompt in place of the student's
            as_teacher = [dataclasses.replace(item, student_ids=item.teacher_ids[condition]) for item in items]
            teacher_acc[condition] = accuracy(sa.sample_rollouts(model, tokenizer, as_teacher, config=base), items, rows,
                                              tokenizer)
        lengths = [len(r.response_ids) for r in rollouts]
        for cell in scorable:
            condition = f"{cell.context}:{cell.teacher_mode}"
            token_signals = scored[cell.clip_tau if cell.clip_tau is not None else taus[0]][condition]
            report = sa.condition_report(token_signals, tokenizer, config=base, num_rollouts=len(rollouts))
            summary = report["summary"]
            relative = (100 * token_signals["position"] // token_signals["rollout"].bincount()[token_signals["rollout"]])
            quarters = signals.position_windows(token_signals["fwd_kl"], relative, windows=((0, 25), (75, 100)))
            push = signals.top_push_summary(token_signals)
            n = len(rollouts)
            out[cell.name] = {
                "fwd_kl": summary["fwd_kl"], "d_gt_005": summary["d_gt_005"], "he20_kl": summary["he20_kl"],
                "agree": summary["agree"], "student_entropy": summary["student_entropy"],
                "kl_decay": quarters[1]["mean"] / quarters[0]["mean"] if quarters[0]["mean"] > 0 else None,
                "position_windows": [{k: w[k] for k in ("lo", "hi", "mean", "count")} for w in report["position_windows"]],
                "clipped_teacher_mass": summary["clipped_teacher_mass"] if cell.clip_tau is not None else 0.0,
                "clip_frac": summary["clip_frac"] if cell.clip_tau is not None else 0.0,
                "decisive": push["decisive"], "clip_reversal": push["clip_reversal"] if cell.clip_tau is not None else 0.0,
                "student_acc": student_acc, "teacher_acc": teacher_acc[condition],
                "teacher_lift_z": compatibility.proportion_z(student_acc, n, teacher_acc[condition], n),
                **eos_probabilities(token_signals, rollouts, eos_ids),
                "rollouts": n, "mean_length": sum(lengths) / len(lengths),
                "capped": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
            }
        seconds = time.time() - start
        for cell in scorable:
            out[cell.name]["seconds_shared"] = seconds / len(scorable)
        log(f"[probe] frozen signals: {len(items)} prompts x 2 rollouts, {student_mode}, T {temperature:g}, "
            f"{len(conditions)} teacher condition(s): {seconds:.0f} s")
    return out

def probe_overrides(config, *, steps: int, batch: int | None, cells: int = 1) -> list[str]:
    """The launch of K steps of each of ``cells`` cells whose full run is ``config``: its batch, data order and peak
    learning rate from the first step (no warmup: in the warmup of a full run the first K steps barely move the
    student; a cosine schedule over K steps would decay to 0), no checkpoint, the collapse monitor's windows scaled
    to K, no pre-flight gate (a one-time check the full run makes)."""
    early, late = compatibility.windows(steps)
    out = [f"trainer.total_training_steps={steps * cells}", "trainer.save_freq=-1", "trainer.resume_mode=disable",
           "trainer.test_freq=-1", "trainer.val_before_train=false",
           "actor_rollout_ref.actor.optim.lr_warmup_steps=0", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
           "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
           "opsd.diagnostics.monitor.early_start=1", f"opsd.diagnostics.monitor.early_end={early}",
           f"opsd.diagnostics.monitor.recent_window={late}", "opsd.diagnostics.preflight=false"]
    if batch is not None:
        out.append(f"data.train_batch_size={batch}")
    return out

def cells_recipe(recipe):
    """``recipe`` (the launcher's OPSD recipe) started by the cells' entry point, which checks ``probe.cells`` too."""
    return dataclasses.replace(recipe, module="recipe.probe.main_cells",
                               startup_checks="recipe.probe.main_cells:startup_checks")

def run_cells_steps(cells: Sequence[Cell], *, recipe, settings, demo_inputs, extra: Sequence[str], steps: int,
                    batch: int | None, run_dir: Path, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Plan the first cell's full run (for its schedule), then launch K steps of every cell in one launch
    (``probe.cells`` on the cells' entry point, ``cells_recipe``: each from the initial student on the same batches);
    per cell its rows (steps 1..K) and its share of the launch."""
    from recipe.analysis.run_logs import read_jsonl_metrics
    from recipe.launch.run import execute, plan

    argv = [*extra, *cells[0].overrides()]
    cfg = plan(recipe, settings, argv, demo=demo_inputs).config
    launch = plan(cells_recipe(recipe), dataclasses.replace(settings, ckpt_dir=str(run_dir), steps=None),
                  [*argv, *probe_overrides(cfg, steps=steps, batch=batch, cells=len(cells)), cells_override(cells)],
                  demo=demo_inputs)
    record = execute(launch, log=run_dir / "train.log", timeout_s=timeout_s)
    if record["exit_code"] != 0:
        raise RuntimeError(f"the probe launch of {', '.join(c.name for c in cells)} failed (exit {record['exit_code']}); "
                           f"log {run_dir / 'train.log'}:\n" + (run_dir / "train.log").read_text()[-3000:])
    rows = read_jsonl_metrics(record["metrics"])
    pcfg = launch.config
    out = []
    for index, cell in enumerate(cells):
        own = [{**row, "step": row["step"] - index * steps} for row in rows
               if index * steps < row["step"] <= (index + 1) * steps]
        out.append({"rows": own, "launch_dir": str(run_dir), "launch_s": record["wall_time_s"], "launch_cells": len(cells),
                    "step_times_s": [r["timing_s/step"] for r in own if "timing_s/step" in r],
                    "rollouts_per_step": int(pcfg.data.train_batch_size) * int(pcfg.actor_rollout_ref.rollout.n),
                    "full_steps": int(cfg.trainer.total_training_steps), "cap": int(cfg.data.max_response_length),
                    "top_p": float(cfg.actor_rollout_ref.rollout.top_p), "top_k": int(cfg.actor_rollout_ref.rollout.top_k),
                    "model": str(launch.overrides.get(recipe.model_key)),
                    "train_file": str(launch.overrides.get(recipe.train_key))})
    return out

def launch_shares(results: Sequence[dict[str, Any]]) -> list[float]:
    """Each cell's share of its launch's wall time: its own steps (``step_times_s``) plus an equal share of what the
    launch spent outside steps (start-up, the resets between cells, shutdown)."""
    steps_s: dict[str, float] = {}
    for result in results:
        steps_s[result["launch_dir"]] = steps_s.get(result["launch_dir"], 0.0) + sum(result["step_times_s"])
    return [sum(r["step_times_s"]) + max(r["launch_s"] - steps_s[r["launch_dir"]], 0.0) / r["launch_cells"]
            for r in results]

def run_probe(cells: Sequence[Cell], *, recipe, settings, demo_inputs, extra: Sequence[str], steps: int,
              batch: int | None, out_dir: Path, signal_prompts: int, frozen: bool = True, log=print) -> dict[str, Any]:
    """The probe over ``cells``; writes probe.json / probe.md / probe.png and returns the result.

    1. the frozen signals of every cell (``frozen_signals``);
    2. K monitored OPSD steps of each cell through the launcher (``recipe.launch.run.plan`` / ``execute``): the
       cell's own config, batch and data order at the full run's peak learning rate from the first step
       (``probe_overrides``), no checkpoint; the cells that share student prompts share one launch
       (``launch_groups``; ``probe.cells`` on ``recipe.probe.main_cells``: each cell from the initial student on
       the same batches);
    3. each cell's verdict (``recipe.probe.verdicts``: gain / ineffective length growth / stable degradation /
       collapse / no measurable effect, every indicator with its threshold and its source) and the
       recommendation of a cell, or that none is compatible.

    ``probe.json`` holds everything, with each cell's cost; ``probe.md`` the console table, the thresholds and
    the recommendation; ``probe.png`` the K-step traces.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ran = {}
    for number, group in enumerate(launch_groups(cells), start=1):
        log(f"[probe] launch {number}: {steps} monitored steps of each of " + "; ".join(c.name for c in group))
        for cell, result in zip(group, run_cells_steps(group, recipe=recipe, settings=settings, demo_inputs=demo_inputs,
                                                       extra=extra, steps=steps, batch=batch,
                                                       run_dir=out_dir / "launches" / str(number))):
            ran[cell] = result
    results = []
    for cell in cells:
        indicators = compatibility.step_indicators(ran[cell]["rows"], rollouts_per_step=ran[cell]["rollouts_per_step"])
        results.append({"name": cell.name, "cell": dataclasses.asdict(cell), "overrides": cell.overrides(), **ran[cell],
                        "indicators": indicators})
    first = results[0]
    signals = {}
    if frozen:
        signals = frozen_signals(first["model"], first["train_file"], cells, cap=first["cap"], top_p=first["top_p"],
                                 top_k=first["top_k"], num_prompts=signal_prompts, log=log)
    for result, launch_share in zip(results, launch_shares(results)):
        result["frozen"] = signals.get(result["name"])
        result["verdict"] = compatibility.classify(result["indicators"], result["frozen"]).as_dict()
        per_step = sum(result["step_times_s"]) / max(len(result["step_times_s"]), 1)
        frozen_s = (result["frozen"] or {}).get("seconds_shared", 0.0)
        result["cost"] = {"launch_s": round(launch_share, 1), "frozen_s": round(frozen_s, 1),
                          "cell_s": round(launch_share + frozen_s, 1), "step_s": round(per_step, 2),
                          "probe_steps": steps, "full_steps": result["full_steps"]}
    recommendation = compatibility.recommend(results)
    summary = {"steps": steps, "batch": batch, "extra_overrides": list(extra), "signal_prompts": signal_prompts,
               "thresholds": {k: dataclasses.asdict(v) for k, v in compatibility.THRESHOLDS.items()},
               "recommendation": recommendation, "cells": results}
    text = "\n\n".join([table(results), reasons_text(results),
                        f"recommendation: {recommendation['cell'] or 'none'} ({recommendation['why']})",
                        "thresholds:\n" + compatibility.thresholds_table()])
    (out_dir / "probe.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out_dir / "probe.md").write_text(text + "\n")
    plot(results, out_dir / "probe.png")
    log(text)
    log(f"[probe] wrote {out_dir / 'probe.json'}, {out_dir / 'probe.md'}, {out_dir / 'probe.png'}")
    return summary
