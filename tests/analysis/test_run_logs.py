"""Parsing verl console logs and JSONL file logs into step rows."""

import json
import math

import pytest

from recipe.analysis.run_logs import (
    metric_series,
    parse_console_line,
    parse_value,
    read_console_log,
    read_jsonl_metrics,
    read_run_metrics,
)

# Shaped like verl 0.9.1 console output (LocalLogger + pprint of numpy scalars), including a
# Ray actor prefix, ANSI colour codes, unrelated lines, and step 2 logged twice.
CONSOLE_LOG = """\
Creating file logger at /tmp/x.jsonl
(TaskRunner pid=4242) step:1 - actor/grad_norm:np.float64(0.35) - opsd/student_entropy:0.41 - response_length/mean:512.0
(TaskRunner pid=4242) Training Progress:  50%|#####     | 1/2
\x1b[36m(TaskRunner pid=4242)\x1b[0m step:2 - actor/grad_norm:np.float64(0.5) - opsd/loss:-1.5e-03 - flag:True - bad:nan
step:2 - val-core/openai/gsm8k/acc/mean@1:np.float32(0.25) - actor/grad_norm:0.55
some other line with step:3 inside text that is not a metric line - x
step:3 - opsd/fwd_kl:0.047 - count:np.int64(7)
"""


def test_parse_value_forms():
    assert parse_value("0.5") == 0.5
    assert parse_value("np.float64(0.73)") == 0.73
    assert parse_value("np.int64(3)") == 3.0
    assert parse_value("-1.5e-03") == -0.0015
    assert parse_value("True") == 1.0
    assert math.isnan(parse_value("nan"))
    assert parse_value("hello") is None


def test_parse_console_line_fields():
    row = parse_console_line("(TaskRunner pid=1) step:12 - actor/grad_norm:np.float64(0.86) - opsd/loss:-0.029")
    assert row == {"step": 12, "actor/grad_norm": 0.86, "opsd/loss": -0.029}
    assert parse_console_line("Training Progress: step 3") is None


def test_parse_console_line_after_a_progress_bar():
    """verl's SFT trainer prints the step line right after its tqdm bar (same line)."""
    line = "Epoch 2/100000:  17%|#7        | 16/93 [00:46<05:13,  4.07s/it]step:110 - train/loss:0.151 - train/lr:0.00196"
    assert parse_console_line(line) == {"step": 110, "train/loss": 0.151, "train/lr": 0.00196}
    # keys that end in "step" are values, not the step
    assert parse_console_line("training/global_step:3 - timing_s/step:2.5") is None


def test_read_console_log_merges_and_sorts(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(CONSOLE_LOG)
    rows = read_console_log(path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0] == {"step": 1, "actor/grad_norm": 0.35, "opsd/student_entropy": 0.41, "response_length/mean": 512.0}
    # Step 2: later line wins for grad_norm, keys of both lines kept.
    assert rows[1]["actor/grad_norm"] == 0.55
    assert rows[1]["opsd/loss"] == -0.0015
    assert rows[1]["val-core/openai/gsm8k/acc/mean@1"] == 0.25
    assert rows[2] == {"step": 3, "opsd/fwd_kl": 0.047, "count": 7.0}
    assert metric_series(rows, "actor/grad_norm") == ([1, 2], [0.35, 0.55])


def test_read_jsonl_file_logger_format(tmp_path):
    path = tmp_path / "exp.jsonl"
    lines = [
        {"step": 2, "data": {"actor/grad_norm": 0.5, "note": "text", "opsd/fwd_kl": 0.1}},
        {"step": 1, "data": {"actor/grad_norm": 0.25}},
        {"step": 2, "data": {"val/acc": 1}},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    rows = read_run_metrics(path)
    assert rows == [
        {"step": 1, "actor/grad_norm": 0.25},
        {"step": 2, "actor/grad_norm": 0.5, "opsd/fwd_kl": 0.1, "val/acc": 1.0},
    ]


def test_bad_inputs_name_the_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "data": {}}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_jsonl_metrics(bad)
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    with pytest.raises(ValueError, match="empty.log"):
        read_run_metrics(empty)
    with pytest.raises(FileNotFoundError):
        read_run_metrics(tmp_path / "missing.log")


def test_monitor_run_cli_on_a_fixture_log(tmp_path):
    """The offline tool prints the window table and the collapse warning of a collapsing run."""
    import subprocess
    import sys
    from pathlib import Path

    lines = []
    for s in range(1, 31):
        ent, grad = (0.4, 0.35) if s <= 10 else (1.2, 0.9)
        lines.append(f"(TaskRunner pid=7) step:{s} - opsd/student_entropy:{ent} - actor/grad_norm:np.float64({grad}) "
                     f"- opsd/fwd_kl:0.05 - opsd/loss:-0.01")
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n")
    script = Path(__file__).resolve().parents[2] / "scripts" / "monitor_run.py"
    proc = subprocess.run([sys.executable, str(script), str(log), "--window", "1:10", "--window", "21:30", "--strict"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "| run | 1-10 (n=10) | 0.4 | 0.05 | 0.35 | -0.01 |" in proc.stdout
    assert "| run | 21-30 (n=10) | 1.2 | 0.05 | 0.9 | -0.01 |" in proc.stdout
    assert "step 20 [collapse]" in proc.stdout
