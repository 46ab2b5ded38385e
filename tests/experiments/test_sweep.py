"""Sweep runner pieces without training: run expansion, data steps, evaluation choice, tables, Ray commands."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
from omegaconf import OmegaConf

from recipe.experiments import sweep, sweep_data


def test_expand_runs_combines_and_validates():
    runs = sweep.expand_runs(["default", "context_answer_only+rollout_256"], model="qwen3_1p7b", overrides=["a=1"])
    assert [r.name for r in runs] == ["default", "context_answer_only+rollout_256"]
    assert runs[1].experiments == ("context_answer_only", "rollout_256") and runs[1].overrides == ("a=1",)
    with pytest.raises(ValueError, match="unknown experiment preset"):
        sweep.expand_runs(["rollout_999"], model="qwen3_1p7b")
    with pytest.raises(ValueError, match="unknown model preset"):
        sweep.expand_runs(["default"], model="qwen9")
    with pytest.raises(ValueError, match="listed twice"):
        sweep.expand_runs(["default", "default"], model="qwen3_1p7b")


def test_decile_mask_hand_values():
    # 10 rows, lengths 10..1 (row 9 shortest): deciles are the ranks
    lengths = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert sweep_data.decile_keep_mask(lengths, lo=0, hi=4) == [False] * 5 + [True] * 5
    assert sweep_data.decile_keep_mask(lengths, lo=7, hi=9) == [True] * 3 + [False] * 7
    # ties keep row order: rows 0 and 1 tie, row 0 ranks first
    assert sweep_data.decile_keep_mask([5, 5, 1, 9, 9, 9, 9, 9, 9, 9], lo=1, hi=1) == [True] + [False] * 9
    with pytest.raises(ValueError, match="deciles"):
        sweep_data.decile_keep_mask(lengths, lo=5, hi=3)


def test_filter_gold_trace_deciles_keeps_order_and_names_bad_rows(tmp_path):
    frame = pd.DataFrame({"extra_info": [{"solution": "x" * n} for n in (30, 10, 20, 40, 50, 60, 70, 80, 90, 100)]})
    out = sweep_data.filter_gold_trace_deciles(frame, deciles=[0, 1], length_fn=len)
    assert [len(e["solution"]) for e in out["extra_info"]] == [10, 20]
    bad = pd.DataFrame({"extra_info": [{"solution": "a"}, {"answer": "2"}]})
    with pytest.raises(ValueError, match="row 1 has no string extra_info.solution"):
        sweep_data.filter_gold_trace_deciles(bad, deciles=[0, 9], length_fn=len)


def test_sampler_order_equals_verl_sampler():
    from verl.trainer.ppo.utils import create_rl_sampler

    dataset = list(range(37))
    config = OmegaConf.create({"shuffle": True, "seed": 1})
    verl_sampler = create_rl_sampler(config, dataset)
    want = list(verl_sampler) + list(verl_sampler)  # two epochs of verl's own sampler
    assert sweep_data.sampler_order(37, seed=1, num_rows=60) == [int(i) for i in want[:60]]
    assert sweep_data.sampler_order(37, seed=2, num_rows=10) != sweep_data.sampler_order(37, seed=1, num_rows=10)


def test_prepare_grpo_order_writes_sidecar_and_refuses_foreign_output(tmp_path):
    source = tmp_path / "src.parquet"
    pd.DataFrame({"x": list(range(20))}).to_parquet(source)
    spec = {"kind": "grpo_order", "seed": 1, "num_rows": 8}
    out = sweep_data.prepare(spec, source=source, output=tmp_path / "o" / "train.parquet")
    assert pd.read_parquet(out)["x"].tolist() == sweep_data.sampler_order(20, seed=1, num_rows=8)
    assert sweep_data.prepare(spec, source=source, output=out) == out  # same step: reused
    with pytest.raises(ValueError, match="was not made by this data step"):
        sweep_data.prepare(dict(spec, num_rows=9), source=source, output=out)
    with pytest.raises(ValueError, match="kind must be one of"):
        sweep_data.prepare({"kind": "shuffle"}, source=source, output=tmp_path / "z.parquet")


def test_eval_choice_and_steps():
    cfg = OmegaConf.create({
        "model_preset": {"name": "m", "eval_presets": {"think": "qwen3_think", "no_think": "qwen3_no_think"}},
        "opsd": {"student_mode": "no_think"},
        "sweep": {"eval_mode": "think", "eval_every": 50},
        "trainer": {"total_training_steps": 300, "save_freq": 50},
    })
    assert sweep.eval_choice(cfg) == ("think", "qwen3_think", "think")
    assert sweep.eval_steps(cfg) == [50, 100, 150, 200, 250, 300]
    cfg.sweep.eval_mode = None
    assert sweep.eval_choice(cfg)[:2] == ("no_think", "qwen3_no_think")
    cfg.trainer.save_freq = 25
    cfg.sweep.eval_every = 40
    with pytest.raises(ValueError, match="not checkpoint steps"):
        sweep.eval_steps(cfg)
    cfg.opsd.student_mode = "native"
    with pytest.raises(ValueError, match="no evaluation preset for mode 'native'"):
        sweep.eval_choice(cfg)
    assert sweep.decoding_for("qwen35_4b", "no_think").mode == "no_think"


def test_eval_choice_of_a_model_without_thinking_switch():
    """SmolLM2's preset: native modes on both sides, evaluated natively with its CPU decoding preset."""
    cfg = sweep.compose(["+model=smollm2_135m", "+experiment=[default]", "actor_rollout_ref.model.path=/m/smollm2"])
    assert (cfg.opsd.student_mode, cfg.opsd.teacher_mode) == ("native", "native")
    assert sweep.eval_choice(cfg) == ("native", "smollm2_cpu", "native")
    assert sweep.decoding_for("smollm2_cpu", "native").mode == "native"


def _results(n, avg, pas, length):
    return {"n": n, "macro": {f"avg@{n}": avg, f"pass@{n}": pas, "mean_length": length}}


def test_comparison_table_deltas(tmp_path):
    base_dir, run_dir = tmp_path / "base" / "k", tmp_path / "runs" / "r"
    (run_dir / "eval" / "step_100").mkdir(parents=True)
    base_dir.mkdir(parents=True)
    (base_dir / "results.json").write_text(json.dumps(_results(8, 0.34, 0.592, 18600.0)))
    (run_dir / "eval" / "step_100" / "results.json").write_text(json.dumps(_results(8, 0.353, 0.608, 22400.0)))
    plan = {"name": "r", "label": "OPSD-1024", "model_preset": "qwen3_1p7b", "run_dir": str(run_dir), "base": "k",
            "eval": {"preset": "qwen3_think", "mode_key": "think", "checkpoints": {"100": "x"}, "init_model": None}}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    (run_dir / "status.json").write_text(json.dumps({"train": "ok"}))
    text = sweep.collect(tmp_path)
    row = [line for line in text.splitlines() if line.startswith("| OPSD-1024")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["OPSD-1024", "100", "qwen3_think/think", "34.0", "35.3", "+1.3", "59.2", "60.8", "+1.6",
                     "18,600", "22,400", "+20.4%"]
    assert "Avg@8 Base" in text
    assert json.loads((tmp_path / "comparison.json").read_text())[0]["opsd"]["avg"] == pytest.approx(35.3)


def test_ray_submit_command():
    cmd = sweep.ray_submit_command(["python", "scripts/sweep.py", "run-one", "/s/runs/a"], address="http://h:8265",
                                   submission_id="sweep-a", env={"X": "1"})
    assert cmd[:8] == ["ray", "job", "submit", "--address", "http://h:8265", "--submission-id", "sweep-a", "--no-wait"]
    assert json.loads(cmd[cmd.index("--runtime-env-json") + 1]) == {"env_vars": {"X": "1"}}
    assert cmd[cmd.index("--") + 1:] == ["python", "scripts/sweep.py", "run-one", "/s/runs/a"]


def test_collect_orders_rows_and_draws_the_cap_figure(tmp_path):
    (tmp_path / "base" / "k").mkdir(parents=True)
    (tmp_path / "base" / "k" / "results.json").write_text(json.dumps(_results(8, 0.30, 0.50, 1000.0)))
    (tmp_path / "sweep.json").write_text(json.dumps({"presets": ["rollout_256", "rollout_128"]}))
    for cap, avg in ((128, 0.32), (256, 0.35)):
        run_dir = tmp_path / "runs" / f"rollout_{cap}"
        (run_dir / "eval" / "step_10").mkdir(parents=True)
        (run_dir / "eval" / "step_10" / "results.json").write_text(json.dumps(_results(8, avg, 0.55, 1100.0)))
        plan = {"name": f"rollout_{cap}", "label": f"OPSD-{cap}", "model_preset": "m", "run_dir": str(run_dir),
                "base": "k", "eval": {"preset": "p", "mode_key": "think", "checkpoints": {"10": "x"}, "init_model": None}}
        (run_dir / "plan.json").write_text(json.dumps(plan))
    text = sweep.collect(tmp_path)
    assert text.index("| OPSD-256") < text.index("| OPSD-128")  # the sweep's order
    figure = tmp_path / "figures" / "metric_vs_cap.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
    assert "| OPSD-128 | 10 | p/think | 30.0 | 32.0 | +2.0 |" in text


def test_init_stage_commands_sft_then_merge(tmp_path):
    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"path": "/m/base"}}, "data": {"train_files": "/d/ot.parquet"},
                            "trainer": {"n_gpus_per_node": 2}})
    cmds, merged = sweep.init_stage_commands({"kind": "sft", "total_steps": 10, "train_files": None}, cfg=cfg,
                                             run_dir=tmp_path, device="gpu")
    assert [c["name"] for c in cmds] == ["sft_data", "sft_train", "sft_merge"]
    assert cmds[0]["cmd"][1:] == ["-m", "data_prep.sft", "--input", "/d/ot.parquet", "--tokenizer", "/m/base",
                                  "--out", str(tmp_path / "sft" / "train.parquet")]
    assert "trainer.total_training_steps=10" in cmds[1]["cmd"] and cmds[1]["env"]["MODEL_PATH"] == "/m/base"
    assert cmds[1]["env"]["NGPUS"] == "2" and cmds[1]["env"]["TRAIN_FILES"] == str(tmp_path / "sft" / "train.parquet")
    assert cmds[2]["cmd"][1:] == ["-m", "recipe.common.merge", str(tmp_path / "sft" / "checkpoints" / "global_step_10"),
                                  str(merged)]
    given, _ = sweep.init_stage_commands({"kind": "sft", "total_steps": 10, "train_files": "/d/omr_sft.parquet"},
                                         cfg=cfg, run_dir=tmp_path, device="gpu")
    assert [c["name"] for c in given] == ["sft_train", "sft_merge"] and given[0]["env"]["TRAIN_FILES"] == "/d/omr_sft.parquet"
    with pytest.raises(ValueError, match="init_stage.kind"):
        sweep.init_stage_commands({"kind": "grpo", "total_steps": 1}, cfg=cfg, run_dir=tmp_path, device="gpu")


def test_a_run_step_logs_its_command_and_output_and_its_timeout_kills_it(tmp_path):
    """The sweep runs its stages through the launcher's runner (recipe.launch.processes.run_marked)."""
    log = tmp_path / "train.log"
    assert sweep._run_logged([sys.executable, "-c", "print('step 1')"], env={}, log=log, timeout_s=None) == 0
    assert log.read_text().startswith(f"$ {sys.executable} -c ") and log.read_text().endswith("step 1\n")
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert sweep._run_logged(slow, env={}, log=log, timeout_s=1) == -9
    assert log.read_text().count("$ ") == 2  # appended
