"""Evaluation: presets, backend parameters, resumable runs, tables, model resolution, CPU end to end."""

import json
import os
from pathlib import Path

import pytest

from recipe.common.cli import InputError
from recipe.evaluation import harness as evaluation
from recipe.evaluation.decoding_presets import PRESETS, get_preset
from recipe.evaluation.backends import Generation, request_seed, sglang_sampling_params, vllm_sampling_kwargs
from recipe.evaluation.report import compare_table, results_table
from recipe.evaluation.harness import EvalConfig, evaluate, resolve_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LOOP = "Let me check that again.\n" * 30

# ---------------------------------------------------------------- presets (paper tab:evaluation_config)

PAPER_TABLE = {
    # name: (max_new, context, temperature, top_p, top_k, presence)
    "qwen3_think": (38_912, 40_960, 0.6, 0.95, 20, 0.0),
    "qwen3_no_think": (32_768, 40_960, 0.7, 0.80, 20, 0.0),
    "qwen3_4b_instruct": (32_768, 40_960, 0.7, 0.80, 20, 0.0),
    "qwen3_4b_thinking": (81_920, 90_112, 0.6, 0.95, 20, 0.0),
    "qwen35_4b": (81_920, 131_072, 1.0, 0.95, 20, 1.5),
    "deepseek_r1_distill": (32_768, 40_960, 0.6, 0.95, None, 0.0),
    "olmo3_think": (32_768, 40_960, 0.6, 0.95, None, 0.0),
    "olmo3_instruct": (32_768, 40_960, 0.6, 0.95, None, 0.0),
    "falcon_h1r": (65_536, 73_728, 0.6, 0.95, None, 0.0),
    "mimo_7b_rl": (32_768, 32_768, 0.6, 0.95, None, 0.0),
}


@pytest.mark.parametrize("name", sorted(PAPER_TABLE))
def test_presets_match_paper_inference_table(name):
    p = get_preset(name)
    assert (p.max_new_tokens, p.context, p.temperature, p.top_p, p.top_k, p.presence_penalty) == PAPER_TABLE[name]


def test_preset_engines_modes_and_mimo_system_message():
    assert {n for n, p in PRESETS.items() if p.engine == "sglang"} == {
        "qwen35_4b", "olmo3_think", "olmo3_instruct", "falcon_h1r", "mimo_7b_rl"
    }
    assert get_preset("qwen3_think").mode == "think" and get_preset("qwen3_no_think").mode == "no_think"
    assert get_preset("mimo_7b_rl").system_message == "" and get_preset("qwen3_think").system_message is None
    # MiMo: effective cap = context - prompt - 1 guard token; others never bind for real prompts
    assert get_preset("mimo_7b_rl").effective_max_new_tokens(500) == 32_768 - 500 - 1
    assert get_preset("qwen3_think").effective_max_new_tokens(1_500) == 38_912
    with pytest.raises(ValueError, match="no room"):
        get_preset("tiny_cpu").effective_max_new_tokens(4_095)


def test_preset_overrides_and_validation():
    p = get_preset("qwen3_think").with_overrides(temperature=1.0, top_k=None, mode="no_think")
    assert (p.temperature, p.top_k, p.mode, p.top_p) == (1.0, None, "no_think", 0.95)
    with pytest.raises(ValueError, match="top_p"):
        get_preset("qwen3_think").with_overrides(top_p=1.5)
    with pytest.raises(ValueError, match="unknown decoding preset field"):
        get_preset("qwen3_think").with_overrides(min_p=0.1)
    with pytest.raises(ValueError, match="known presets"):
        get_preset("qwen4")


def test_backend_sampling_parameters():
    assert vllm_sampling_kwargs(get_preset("qwen3_think"), prompt_tokens=200, count=8) == {
        "n": 8, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "presence_penalty": 0.0, "max_tokens": 38_912
    }
    assert vllm_sampling_kwargs(get_preset("deepseek_r1_distill"), prompt_tokens=200, count=3)["top_k"] == -1
    assert sglang_sampling_params(get_preset("qwen35_4b"), prompt_tokens=200) == {
        "temperature": 1.0, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.5, "max_new_tokens": 81_920
    }
    assert sglang_sampling_params(get_preset("mimo_7b_rl"), prompt_tokens=100)["max_new_tokens"] == 32_667
    assert request_seed(42, "a/1/0") == request_seed(42, "a/1/0") != request_seed(42, "a/2/0")


# ---------------------------------------------------------------- fixture runs with a scripted backend


class ScriptedBackend:
    """Returns fixed texts per problem id; records what it was asked to generate."""

    def __init__(self, script):
        from recipe.models.tiny import build_char_tokenizer

        self.tokenizer = build_char_tokenizer()
        self.script = script
        self.calls = []

    def generate(self, requests):
        outputs = []
        for request in requests:
            problem_id = request.key.split("/")[1]
            first = int(request.key.split("/")[2])
            self.calls.append((problem_id, request.count))
            texts = self.script[problem_id]
            outputs.append([texts[first + i] for i in range(request.count)])
        return outputs


def _write_benchmark(path: Path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def fixture_run(tmp_path):
    bench_a = _write_benchmark(tmp_path / "setA.jsonl", [
        {"id": "a1", "problem": "What is 2+3?", "answer": "5"},
        {"id": "a2", "problem": "What is 1/2+1/4?", "answer": "\\frac{3}{4}"},
    ])
    bench_b = _write_benchmark(tmp_path / "setB.jsonl", [{"id": "b1", "problem": "What is 10*10?", "answer": "100"}])
    stop = "stop"
    script = {
        # a1: 2 of 4 correct; the Answer: line does not count in evaluation (final balanced \boxed{} only)
        "a1": [Generation("so \\boxed{5}", 10, stop), Generation("Answer: 5", 20, stop),
               Generation("\\boxed{05}", 30, stop), Generation("\\boxed{6}", 40, stop)],
        # a2: 1 of 4 correct; two truncated loops without a box
        "a2": [Generation("\\boxed{0.75}", 100, stop), Generation("\\boxed{\\frac{1}{2}}", 100, stop),
               Generation(LOOP, 500, "length"), Generation(LOOP, 500, "length")],
        # b1: 0 of 4
        "b1": [Generation("\\boxed{99}", 50, stop)] * 2 + [Generation("no idea", 70, stop)] * 2,
    }
    config = EvalConfig(model=str(tmp_path), out_dir=str(tmp_path / "out"), preset=get_preset("tiny_cpu"),
                        benchmarks=[str(bench_a), str(bench_b)], n=4, problems_per_call=2, pass_ks=[2])
    return config, script


def test_fixture_run_grades_and_tabulates(fixture_run):
    config, script = fixture_run
    backend = ScriptedBackend(script)
    results = evaluate(config, backend=backend, progress=False)
    out = Path(config.out_dir)
    lines = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    assert {k for k in lines[0]} >= {"dataset", "problem_id", "sample", "text", "num_tokens", "finish_reason",
                                     "pred", "acc", "has_boxed", "prompt_tokens"}
    assert [r["acc"] for r in lines if r["problem_id"] == "a1"] == [True, False, True, False]
    assert [r["pred"] for r in lines if r["problem_id"] == "a1"] == ["5", None, "05", "6"]
    assert [r["pred"] for r in lines if r["problem_id"] == "a2"] == ["0.75", "\\frac{1}{2}", None, None]

    a, b = results["per_dataset"]["setA"], results["per_dataset"]["setB"]
    assert a["avg@4"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert a["pass@4"] == 1.0 and b["pass@4"] == 0.0
    assert a["pass@1"] == pytest.approx(0.375)
    # a1: 1 - C(2,2)/C(4,2) = 5/6; a2: 1 - C(3,2)/C(4,2) = 1/2
    assert a["pass@2"] == pytest.approx((5 / 6 + 0.5) / 2)
    assert a["mean_length"] == pytest.approx((25 + 300) / 2)
    assert a["boxed_rate"] == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert a["truncated_rate"] == pytest.approx((0 + 2 / 4) / 2)
    assert a["repetitive_rate"] == pytest.approx((0 + 2 / 4) / 2)
    assert a["max_line_run"] == 30
    assert b["boxed_rate"] == 0.5 and b["avg@4"] == 0.0
    assert results["macro"]["avg@4"] == pytest.approx((0.375 + 0.0) / 2)
    assert results["macro"]["mean_length"] == pytest.approx((162.5 + 60) / 2)

    saved = json.loads((out / "results.json").read_text())
    assert saved["per_dataset"] == results["per_dataset"]
    table = (out / "results.md").read_text()
    assert table.splitlines()[0].startswith("| Dataset | Problems | Avg@4 | Pass@1 | Pass@4 | Length | Boxed |")
    assert "| setA | 2 | 37.5 | 37.5 | 100.0 | 162 | 62.5 | 25.0 |" in table
    assert "| Macro avg | 3 | 18.8 |" in table


def test_resume_skips_done_generations(fixture_run):
    config, script = fixture_run
    evaluate(config, backend=ScriptedBackend(script), progress=False)
    path = Path(config.out_dir) / "generations.jsonl"
    lines = path.read_text().splitlines()
    # drop the last two samples of a2 and leave a torn partial line, as after a kill
    kept = [line for line in lines if not (json.loads(line)["problem_id"] == "a2" and json.loads(line)["sample"] >= 2)]
    path.write_text("\n".join(kept) + "\n" + kept[0][:20])
    backend = ScriptedBackend(script)
    results = evaluate(config, backend=backend, progress=False)
    assert backend.calls == [("a2", 2)]
    again = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(again) == 12 and {(r["problem_id"], r["sample"]) for r in again} == {
        (p, s) for p in ("a1", "a2", "b1") for s in range(4)
    }
    assert results["per_dataset"]["setA"]["truncated_rate"] == pytest.approx(0.25)
    # a complete rerun generates nothing
    backend = ScriptedBackend(script)
    evaluate(config, backend=backend, progress=False)
    assert backend.calls == []


def test_resume_with_other_settings_names_the_field(fixture_run):
    config, script = fixture_run
    evaluate(config, backend=ScriptedBackend(script), progress=False)
    config.preset = config.preset.with_overrides(temperature=0.5)
    with pytest.raises(ValueError, match=r"'decoding\.temperature': saved 1\.0, now 0\.5"):
        evaluate(config, backend=ScriptedBackend(script), progress=False)
    config.preset = get_preset("tiny_cpu")
    config.n = 2
    with pytest.raises(ValueError, match="field 'n'"):
        evaluate(config, backend=ScriptedBackend(script), progress=False)


def test_run_graded_by_the_older_rule_is_regraded_on_resume(fixture_run, capsys):
    # a directory written before the grader's modes (no `grading` in run_config.json) whose records were
    # graded with the Answer: fallback: resuming regrades the stored texts and keeps the old file
    config, script = fixture_run
    evaluate(config, backend=ScriptedBackend(script), progress=False)
    out = Path(config.out_dir)
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["grading"] == "final_balanced_boxed"
    del saved["grading"]
    (out / "run_config.json").write_text(json.dumps(saved))
    path = out / "generations.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        if line["text"] == "Answer: 5":  # as the old grader recorded it
            line.update(pred="5", acc=True)
    old_text = "".join(json.dumps(line) + "\n" for line in lines)
    path.write_text(old_text)
    backend = ScriptedBackend(script)
    results = evaluate(config, backend=backend, progress=False)
    assert backend.calls == []  # nothing generated again
    assert results["per_problem"]["setA"]["a1"] == 0.5
    regraded = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["pred"], r["acc"]) for r in regraded if r["text"] == "Answer: 5"] == [(None, False)]
    assert [r["text"] for r in regraded] == [r["text"] for r in lines]
    assert (out / "generations.jsonl.graded-before_grader_modes").read_text() == old_text
    assert json.loads((out / "run_config.json").read_text())["grading"] == "final_balanced_boxed"
    assert "regraded 12 stored generations" in capsys.readouterr().err
    # a second old directory would need the backup name again: refused, nothing overwritten
    (out / "run_config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="graded-before_grader_modes: cannot regrade generations.jsonl: the backup exists"):
        evaluate(config, backend=backend, progress=False)


def test_resume_detects_changed_benchmark_file(fixture_run):
    config, script = fixture_run
    evaluate(config, backend=ScriptedBackend(script), progress=False)
    path = config.benchmark_paths["setB"]
    path.write_text(path.read_text().replace("10*10", "10*11"))
    with pytest.raises(ValueError, match=r"benchmarks\.setB\.sha256"):
        evaluate(config, backend=ScriptedBackend(script), progress=False)


def test_bad_benchmark_rows_name_file_and_line(tmp_path):
    path = _write_benchmark(tmp_path / "bad.jsonl", [{"id": "x", "problem": "p", "answer": "1"},
                                                      {"id": "y", "problem": "", "answer": "2"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'problem'"):
        evaluation.load_benchmark(path)
    with pytest.raises(ValueError, match="shipped benchmarks"):
        EvalConfig(model="m", out_dir="o", preset=get_preset("tiny_cpu"), benchmarks=["aime1999"])


def _results(avg, pas, length, boxed, n=8):
    per = {name: {"n_problems": 30, "n": n, f"avg@{n}": a, f"pass@{n}": p, "mean_length": l, "boxed_rate": b}
           for name, a, p, l, b in zip(("d1", "d2"), avg, pas, length, boxed)}
    macro = {key: sum(per[d][key] for d in per) / 2 for key in per["d1"]}
    return {"n": n, "config": {"decoding": {"temperature": 0.6}, "n": n, "seed": 42, "backend": "vllm"},
            "per_dataset": per, "macro": macro}


def test_compare_table_deltas_points_and_relative_length():
    base = _results([0.50, 0.30], [0.70, 0.50], [10_000, 20_000], [0.9, 0.8])
    ckpt = _results([0.475, 0.35], [0.70, 0.60], [12_000, 15_000], [0.95, 0.8])
    table = compare_table(base, ckpt)
    assert table.splitlines()[0].startswith("| Dataset | Avg@8 Base | Avg@8 Ckpt | Δ | Δ 95% CI | Pass@8 Base |")
    assert ("| d1 | 50.0 | 47.5 | -2.5 | - | 70.0 | 70.0 | +0.0 | 10,000 | 12,000 | +20.0% | 90.0 | 95.0 | +5.0 |"
            in table)
    assert "| d2 | 30.0 | 35.0 | +5.0 | - | 50.0 | 60.0 | +10.0 | 20,000 | 15,000 | -25.0% |" in table
    assert "| Macro avg | 40.0 | 41.2 | +1.2 | - | 60.0 | 65.0 | +5.0 | 15,000 | 13,500 | -10.0% |" in table
    assert "no interval where a results.json has no per-problem scores" in table
    assert "WARNING" not in table
    ckpt["config"]["decoding"]["temperature"] = 1.0
    assert "decoding.temperature: base=0.6 checkpoint=1.0" in compare_table(base, ckpt)
    with pytest.raises(ValueError, match="n differs"):
        compare_table(base, _results([0.5, 0.3], [0.7, 0.5], [1, 1], [1, 1], n=4))


def test_compare_table_bootstrap_interval_column():
    from recipe.evaluation.stats import paired_bootstrap

    base = _results([0.5, 0.25], [1, 1], [1, 1], [1, 1])
    ckpt = _results([1.0, 0.25], [1, 1], [1, 1], [1, 1])
    # d1: differences (1, 0): the 95% interval of the mean of 2 resampled differences is [0, 1]
    base["per_problem"] = {"d1": {"p1": 0.0, "p2": 1.0}, "d2": {"q1": 0.25, "q2": 0.5, "q3": 0.0}}
    ckpt["per_problem"] = {"d1": {"p2": 1.0, "p1": 1.0}, "d2": {"q1": 0.125, "q2": 0.5, "q3": 0.125}}
    table = compare_table(base, ckpt)
    assert "| d1 | 50.0 | 100.0 | +50.0 | [+0.0, +100.0] | 100.0 |" in table
    d2 = paired_bootstrap(base_SP=[0.25, 0.5, 0.0], ckpt_SP=[0.125, 0.5, 0.125])
    macro = paired_bootstrap(base_SP=[0.0, 1.0, 0.25, 0.5, 0.0], ckpt_SP=[1.0, 1.0, 0.125, 0.5, 0.125],
                             strata_P=["d1", "d1", "d2", "d2", "d2"])
    assert f"| d2 | 25.0 | 25.0 | +0.0 | {d2.points()} |" in table
    assert f"| Macro avg | 37.5 | 62.5 | +25.0 | {macro.points()} |" in table
    assert "paired percentile bootstrap" in table and "Note:" not in table
    del ckpt["per_problem"]["d2"]["q3"]
    assert "the runs scored different problems" in compare_table(base, ckpt)


def test_results_hold_per_problem_avg(fixture_run):
    config, script = fixture_run
    results = evaluate(config, backend=ScriptedBackend(script), progress=False)
    assert results["per_problem"] == {"setA": {"a1": 0.5, "a2": 0.25}, "setB": {"b1": 0.0}}


# ---------------------------------------------------------------- model resolution (FSDP merge)


def _fake_hf_dir(path: Path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"x")


def test_resolve_model_hf_dir_and_fsdp_merge_cache(tmp_path, monkeypatch):
    hf = tmp_path / "hf"
    _fake_hf_dir(hf)
    assert resolve_model(str(hf), merge_cache=tmp_path / "cache") == str(hf.resolve())
    assert resolve_model("Qwen/Qwen3-1.7B", merge_cache=tmp_path / "cache") == "Qwen/Qwen3-1.7B"
    with pytest.raises(FileNotFoundError, match="not a directory"):
        resolve_model(str(tmp_path / "missing" / "model"), merge_cache=tmp_path / "cache")

    import torch

    from recipe.common import merge

    actor = tmp_path / "ckpt" / "global_step_100" / "actor"
    (actor / "huggingface").mkdir(parents=True)  # a whole save: shard, fsdp_config.json, config and tokenizer
    torch.save({}, actor / "model_world_size_1_rank_0.pt")
    for name in ("fsdp_config.json", "huggingface/config.json", "huggingface/tokenizer.json"):
        (actor / name).write_text("{}")
    calls = []

    def fake_merge(checkpoint, target, **_):
        calls.append((checkpoint, target))
        _fake_hf_dir(target)
        return 0, "", ""

    monkeypatch.setattr(merge, "_run_merger", fake_merge)
    merged = Path(resolve_model(str(actor), merge_cache=tmp_path / "cache"))
    assert merged.parent == tmp_path / "cache" and "global_step_100_actor" in merged.name
    assert (merged / "config.json").is_file() and len(calls) == 1 and ".partial-" in calls[0][1].name
    assert resolve_model(str(actor), merge_cache=tmp_path / "cache") == str(merged)  # reused, not merged again
    assert len(calls) == 1

    (merged / "model.safetensors").unlink()  # an incomplete cache entry is never overwritten
    with pytest.raises(InputError, match="no complete merged model.*remove it"):
        resolve_model(str(actor), merge_cache=tmp_path / "cache")
    with pytest.raises(ValueError, match="neither a Hugging Face model directory"):
        resolve_model(str(tmp_path / "ckpt"), merge_cache=tmp_path / "cache")


def test_a_model_that_cannot_load_is_named_before_anything_is_written(tmp_path, monkeypatch):
    bench = _write_benchmark(tmp_path / "set.jsonl", [{"id": "a", "problem": "1+1?", "answer": "2"}])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for model, what in (("/nonexistent/model", "no such model directory"),
                        ("org/not-downloaded", "nor a Hub id in the local Hugging Face cache")):
        config = EvalConfig(model=model, out_dir=str(tmp_path / "out"), preset=get_preset("tiny_cpu"),
                            benchmarks=[str(bench)], n=1)
        with pytest.raises(InputError, match=what):
            evaluate(config, progress=False)
        assert not (tmp_path / "out").exists()


def test_a_full_disk_stops_the_evaluation_with_one_line_and_the_same_command_resumes(tmp_path, small_fs):
    """A real small file system fills while generations are written: one error naming the directory and the
    space the rest needs; what was written is kept; after space is freed the same command resumes."""
    from recipe.common.cli import NoSpaceError

    rows = [{"id": f"p{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(8)]
    bench = _write_benchmark(tmp_path / "set.jsonl", rows)
    long = "Let me think. " * 60  # ~850 bytes a record: 16 of them do not fit in 12 KB with run_config.json
    script = {row["id"]: [Generation(long + f"\\boxed{{{row['answer']}}}", 200, "stop")] * 2 for row in rows}
    fs = small_fs(tmp_path / "fs", size=12 * 1024)
    config = EvalConfig(model=str(tmp_path), out_dir=str(fs.path / "out"), preset=get_preset("tiny_cpu"),
                        benchmarks=[str(bench)], n=2, problems_per_call=1)
    with pytest.raises(NoSpaceError) as caught:
        evaluate(config, backend=ScriptedBackend(script), progress=False)
    message = str(caught.value)
    assert message.startswith(f"{fs.path / 'out'}: no space left for the rest of the evaluation outputs: needs ~")
    assert message.endswith("free (the generations written so far are kept: free space there and run the same "
                            "command again (it resumes))")
    written = evaluation.load_generations(fs.path / "out" / "generations.jsonl")
    assert 0 < len(written) < 16
    fs.resize(1024 * 1024)  # space freed
    backend = ScriptedBackend(script)
    results = evaluate(config, backend=backend, progress=False)
    assert results["macro"]["n_problems"] == 8 and results["per_dataset"]["set"]["avg@2"] == 1.0
    records = evaluation.load_generations(fs.path / "out" / "generations.jsonl")
    assert len(records) == 16 and len({(r["problem_id"], r["sample"]) for r in records}) == 16
    assert sum(count for _, count in backend.calls) == 16 - len(written)  # only what was missing


# ---------------------------------------------------------------- end to end on CPU with the tiny model


def test_end_to_end_tiny_model_cpu(tmp_path):
    from recipe.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    preset = get_preset("tiny_cpu").with_overrides(max_new_tokens=12)

    def run(out):
        config = EvalConfig(model=str(model), out_dir=str(tmp_path / out), preset=preset,
                            benchmarks=["aime2024", "hmmt_feb_2025"], n=2, limit=1, backend="hf")
        return evaluate(config, progress=False)

    results = run("e1")
    assert sorted(results["per_dataset"]) == ["aime2024", "hmmt_feb_2025"]
    records = [json.loads(x) for x in (tmp_path / "e1" / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert all(1 <= r["num_tokens"] <= 12 and r["finish_reason"] in ("stop", "length") for r in records)
    assert all((r["finish_reason"] == "length") == (r["num_tokens"] == 12) for r in records)
    assert results["macro"]["n_problems"] == 2
    assert "| Macro avg | 2 |" in results_table(results)
    # seeded: a second run in a fresh directory (through the CLI) samples the same texts
    assert _load_cli().main(["run", "--model", str(model), "--out-dir", str(tmp_path / "e2"), "--preset", "tiny_cpu",
                             "--max-new-tokens", "12", "--n", "2", "--limit", "1", "--backend", "hf",
                             "--benchmarks", "aime2024", "hmmt_feb_2025", "--no-progress"]) == 0
    again = [json.loads(x) for x in (tmp_path / "e2" / "generations.jsonl").read_text().splitlines()]
    assert [r["text"] for r in again] == [r["text"] for r in records]


def test_hf_backend_refuses_presence_penalty(tmp_path):
    from recipe.evaluation.backends import HFBackend

    with pytest.raises(ValueError, match="presence_penalty"):
        HFBackend(str(tmp_path), preset=get_preset("qwen35_4b"), seed=42)


def _load_cli():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "evaluate_cli", Path(__file__).resolve().parents[2] / "scripts" / "evaluate.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def test_cli_parsing_and_compare(tmp_path, capsys):
    cli = _load_cli()
    args = cli.build_parser().parse_args(["run", "--model", "m", "--out-dir", "o", "--top-k", "off",
                                          "--mode", "native", "--temperature", "0.9"])
    assert (args.top_k, args.mode, args.temperature) == ("off", "native", 0.9)
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_results([0.5, 0.3], [0.7, 0.5], [100, 200], [1, 1])))
    assert cli.main(["compare", str(base), str(base)]) == 0
    assert "| Macro avg | 40.0 | 40.0 | +0.0 |" in capsys.readouterr().out
