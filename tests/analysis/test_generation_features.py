"""Stylistic and length rates of generations (Table 1(b), tab:sft_output_degen) by hand, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.analysis import generation_features as gf

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text,flags", [
    ("Wait, let me check.", {"wait": True, "self_correction": False, "think_tag": False}),
    ("we wait for x", {"wait": True, "self_correction": False, "think_tag": False}),
    ("awaiting the result; waiter", {"wait": False, "self_correction": False, "think_tag": False}),
    ("Hmm, that is odd.", {"wait": False, "self_correction": True, "think_tag": False}),
    ("Hm. Hmmm.", {"wait": False, "self_correction": True, "think_tag": False}),
    ("Actually the sum is 5.", {"wait": False, "self_correction": True, "think_tag": False}),
    ("No, that is wrong. But then", {"wait": False, "self_correction": True, "think_tag": False}),
    ("but there is no answer; Nothing; Butter", {"wait": False, "self_correction": False, "think_tag": False}),
    ("<think>\nok</think> 5", {"wait": False, "self_correction": False, "think_tag": True}),
    ("</think> only closes", {"wait": False, "self_correction": False, "think_tag": False}),
])
def test_style_flags(text, flags):
    assert gf.style_flags(text) == flags


def test_feature_rates_pooled_by_hand():
    records = [
        {"text": "Wait. But x", "num_tokens": 40_000, "has_boxed": False, "acc": False},
        {"text": "fine \\boxed{1}", "num_tokens": 100, "has_boxed": True, "acc": True},
        {"text": "<think>Hmm", "num_tokens": 32_768, "has_boxed": False, "acc": False},
        {"text": "plain", "num_tokens": 38_911, "has_boxed": True, "acc": False},
    ]
    rates = gf.feature_rates(records)
    assert rates == {
        "n": 4.0, "mean_tokens": (40_000 + 100 + 32_768 + 38_911) / 4,
        "ge_32768": 75.0, "ge_38912": 25.0,  # 32,768 counts (>=), 38,911 is below 38k = 38,912
        "wait": 25.0, "self_correction": 50.0, "think_tag": 25.0, "boxed": 50.0, "accuracy": 25.0,
    }
    assert set(gf.feature_rates([{"text": "x", "num_tokens": 1}], thresholds=(1,))) == {
        "n", "mean_tokens", "ge_1", "wait", "self_correction", "think_tag"}
    with pytest.raises(ValueError, match="no generation records"):
        gf.feature_rates([])
    with pytest.raises(ValueError, match="lack 'text' or 'num_tokens'"):
        gf.feature_rates([{"text": "x"}])


def test_cli_table(tmp_path):
    run_dir = tmp_path / "opsd_run"
    run_dir.mkdir()
    rows = [{"text": "Wait", "num_tokens": 33_000, "has_boxed": False, "acc": False},
            {"text": "ok", "num_tokens": 10, "has_boxed": True, "acc": True}]
    (run_dir / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = ["-m", "recipe.analysis.generation_features"]
    out = subprocess.run([sys.executable, *script, f"OPSD={run_dir}", str(run_dir / "generations.jsonl")],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| OPSD | 2 | 16505 | 50.0 | 0.0 | 50.0 | 50.0 | 50.0 | 0.0 | 0.0 |" in out.stdout
    assert "| opsd_run | 2 |" in out.stdout
    bad = subprocess.run([sys.executable, *script, str(tmp_path / "nope")], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("error:") and bad.stderr.count("\n") == 1
