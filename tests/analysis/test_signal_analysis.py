"""Signal analysis on the tiny model reproduces the core signal functions; PCA on hand data."""

import json
import math

import pytest
import torch

from recipe.analysis import signal_analysis as sa
from recipe.analysis import signal_conditions as sc
from recipe.analysis import signal_pca as sp
from recipe.analysis import signal_report as srep
from recipe.analysis import signal_rollouts as sr
from recipe.analysis import signal_scoring as ss
from recipe.common import chat, prompts
from recipe.opsd.core import signals


CONDITIONS = ("full_solution:think", "answer_only:no_think", "none:think")


@pytest.fixture(scope="module")
def analysed(tiny):
    model, tokenizer, rows, _, _ = tiny
    config = sc.SignalAnalysisConfig(
        num_prompts=3, rollouts_per_prompt=2, max_new_tokens=12, conditions=CONDITIONS, chunk_size=7,
        sample_batch_size=4, score_batch_size=4, top_tokens=5, windows=((0, 4), (4, 8), (8, 16)),
    )
    items, skipped = sr.build_prompt_items(rows, tokenizer, config=config)
    rollouts = sr.sample_rollouts(model, tokenizer, items, config=config)
    scored = ss.score_rollouts(model, items, rollouts, config=config)
    result = sa.run_signal_analysis(model, tokenizer, rows, config=config, model_name="tiny", items=items, rollouts=rollouts)
    return config, items, rollouts, scored, result


@pytest.mark.slow
def test_prompts_are_the_shared_builders_and_token_spliced(tiny, analysed):
    _, tokenizer, rows, _, _ = tiny
    config, items, rollouts, _, _ = analysed
    assert len(items) == 3 and len(rollouts) == 6
    assert [r.prompt for r in rollouts] == [0, 0, 1, 1, 2, 2]
    for item in items:
        record = rows[item.row]
        assert item.student_ids == chat.render_ids(record["prompt"], tokenizer, "think")
        _, teacher = prompts.build_prompt_pair("full_solution", record["extra_info"])
        assert item.teacher_ids["full_solution:think"] == chat.render_ids(teacher, tokenizer, "think")
        _, teacher = prompts.build_prompt_pair("answer_only", record["extra_info"])
        assert item.teacher_ids["answer_only:no_think"] == chat.render_ids(teacher, tokenizer, "no_think")
        assert record["extra_info"]["solution"] in tokenizer.decode(item.teacher_ids["full_solution:think"])


@pytest.mark.slow
def test_signals_equal_token_signals_on_plain_full_logits(tiny, analysed):
    """Reference: one unpadded model forward per sequence, full [T, V] logits, token_signals."""
    model, _, _, _, _ = tiny
    config, items, rollouts, scored, _ = analysed
    temperature = config.temperature
    for cond in CONDITIONS:
        got = scored[cond]
        offset = 0
        for k, rollout in enumerate(rollouts):
            item = items[rollout.prompt]
            resp = rollout.response_ids
            n = len(resp)
            with torch.no_grad():
                s_logits = model(torch.tensor([item.student_ids + resp])).logits[0]
                t_logits = model(torch.tensor([item.teacher_ids[cond] + resp])).logits[0]
            ps, pt = len(item.student_ids), len(item.teacher_ids[cond])
            ref = signals.token_signals(
                s_logits[ps - 1 : ps - 1 + n].double(), t_logits[pt - 1 : pt - 1 + n].double(), torch.tensor(resp),
                student_temperature=temperature, clip_tau=config.clip_tau,
            )
            rows = slice(offset, offset + n)
            assert torch.equal(got["rollout"][rows], torch.full((n,), k))
            assert torch.equal(got["position"][rows], torch.arange(n))
            assert torch.equal(got["sampled_id"][rows], torch.tensor(resp))
            for key in ("fwd_kl", "adv", "student_entropy", "teacher_entropy", "student_logp", "teacher_logp"):
                torch.testing.assert_close(got[key][rows].double(), ref[key], atol=2e-5, rtol=1e-4, msg=f"{cond} {key}")
            assert torch.equal(got["top1_agree"][rows].double(), ref["top1_agree"])
            offset += n
        assert offset == got["fwd_kl"].numel()


@pytest.mark.slow
def test_student_logp_matches_the_sampler(analysed):
    """Rescored student log-probs (full forward, right padding) under the sampling distribution
    (T, top-k 20, top-p 0.95) equal the sampler's own (generate, left padding, KV cache): the
    rollouts are rescored exactly as sampled."""
    _, _, rollouts, scored, result = analysed
    sampled = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=torch.float64)
    for cond in CONDITIONS:
        torch.testing.assert_close(scored[cond]["sampler_view_logp"].double(), sampled, atol=1e-4, rtol=0)
    assert result["sampler_logp_max_abs_diff"] < 1e-4


def test_teacher_equal_to_student_gives_zero_signal(analysed):
    _, _, _, _, result = analysed
    summary = result["conditions"]["none:think"]["summary"]
    assert summary["fwd_kl"] == pytest.approx(0.0, abs=1e-6)
    assert summary["agree"] == 100.0 and summary["enc"] == 0.0 and summary["disc"] == 0.0
    assert result["conditions"]["none:think"]["top_tokens"] == []


def test_report_numbers_are_the_shared_summaries(analysed):
    config, _, rollouts, scored, result = analysed
    for cond in CONDITIONS:
        sig = {k: scored[cond][k] for k in signals.SIGNAL_KEYS}
        rep = result["conditions"][cond]
        assert rep["summary"] == signals.summarize_signals(sig) or all(
            (math.isnan(a) and math.isnan(b)) or a == b
            for a, b in zip(rep["summary"].values(), signals.summarize_signals(sig).values())
        )
        # Hand definitions of the paper's columns on the same tokens.
        kl, adv = sig["fwd_kl"].double(), sig["adv"].double()
        assert rep["summary"]["fwd_kl"] == pytest.approx(float(kl.mean()))
        assert rep["summary"]["d_gt_005"] == pytest.approx(100 * float((kl > 0.05).double().mean()))
        assert rep["summary"]["enc"] == pytest.approx(100 * float((adv > 0).double().mean()))
        windows = rep["position_windows"]
        assert [w["window"] for w in windows] == ["[0,4)", "[4,8)", "[8,16)"]
        first = kl[scored[cond]["position"] < 4]
        assert windows[0]["mean"] == pytest.approx(float(first.mean()))
        assert windows[0]["count"] == first.numel()
        # Per-rollout features: plain means over each rollout's tokens.
        feats = torch.tensor(rep["rollout_features"])
        assert feats.shape == (len(rollouts), len(ss.ROLLOUT_FEATURES))
        mask = scored[cond]["rollout"] == 1
        assert feats[1, 0].item() == pytest.approx(float(kl[mask].mean()))
        assert feats[1, 5].item() == pytest.approx(float((adv[mask] < 0).double().mean()))
    # Divergence mass: sum over positions of the per-entry terms = sum of fwd_kl.
    mass = scored["full_solution:think"]["mass_V"]
    assert float(mass.sum()) == pytest.approx(float(scored["full_solution:think"]["fwd_kl"].double().sum()), rel=1e-4)
    top = result["conditions"]["full_solution:think"]["top_tokens"]
    assert 0 < len(top) <= 5 and top[0]["mass"] == pytest.approx(float(mass.max()))
    assert [t["mass"] for t in top] == sorted((t["mass"] for t in top), reverse=True)


def test_outputs_written_and_not_overwritten(analysed, tmp_path):
    _, _, _, _, result = analysed
    paths = srep.write_outputs(result, tmp_path / "out")
    data = json.loads(paths["signals.json"].read_text())  # strict JSON: NaN became null
    assert set(data["conditions"]) == set(CONDITIONS)
    md = paths["signals.md"].read_text()
    assert "| full_solution:think |" in md and "D>.05" in md and "HE20" in md
    for name in ("pca.png", "position_windows.png"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FileExistsError):
        srep.write_outputs(result, tmp_path / "out")


def test_rollouts_round_trip_and_mismatch(tiny, analysed, tmp_path):
    _, tokenizer, rows, _, _ = tiny
    config, items, rollouts, _, _ = analysed
    path = tmp_path / "rollouts.json"
    sr.save_rollouts(path, items, rollouts, meta={"sampling": sc.sampling_settings(config)})
    loaded_items, loaded, _ = sr.load_rollouts(path, rows, tokenizer, config=config)
    assert [r.response_ids for r in loaded] == [r.response_ids for r in rollouts]
    assert [i.teacher_ids for i in loaded_items] == [i.teacher_ids for i in items]
    other = sc.SignalAnalysisConfig(**{**sc.sampling_settings(config), "temperature": 0.7, "conditions": CONDITIONS})
    with pytest.raises(ValueError, match="temperature"):
        sr.load_rollouts(path, rows, tokenizer, config=other)


def test_rows_missing_a_context_field_are_skipped_or_rejected(tiny):
    _, tokenizer, rows, _, _ = tiny
    no_cot = [{**r, "extra_info": {**r["extra_info"], "cot": ""}} for r in rows]
    mixed = [no_cot[i] if i % 2 else rows[i] for i in range(len(rows))]
    config = sc.SignalAnalysisConfig(num_prompts=4, conditions=("cot_solution:think", "none:think"))
    items, skipped = sr.build_prompt_items(mixed, tokenizer, config=config)
    assert len(items) == 4 and all(item.row % 2 == 0 for item in items)
    assert set(skipped) == {"missing field for cot_solution"} and sum(skipped.values()) >= 1
    with pytest.raises(ValueError, match="cot_solution"):
        sr.build_prompt_items(no_cot, tokenizer, config=config)
    # A teacher-prompt cap drops rows under every condition alike.
    every = sc.SignalAnalysisConfig(num_prompts=len(rows), conditions=("cot_solution:think",))
    lengths = [len(i.teacher_ids["cot_solution:think"]) for i in sr.build_prompt_items(rows, tokenizer, config=every)[0]]
    cap = max(lengths) - 1  # drops the longest row(s) only
    capped = sc.SignalAnalysisConfig(num_prompts=4, conditions=("none:think", "cot_solution:think"),
                                     teacher_max_prompt_length=cap)
    kept, skipped = sr.build_prompt_items(rows, tokenizer, config=capped)
    assert all(len(ids) <= cap for item in kept for ids in item.teacher_ids.values())
    assert any("teacher prompt >" in reason for reason in skipped)


def test_config_validation():
    with pytest.raises(ValueError, match="context"):
        sc.SignalAnalysisConfig(conditions=("solution:think",))
    with pytest.raises(ValueError, match="mode"):
        sc.SignalAnalysisConfig(conditions=("full_solution:thinking",))
    with pytest.raises(ValueError, match="student prompt"):
        sc.SignalAnalysisConfig(conditions=("concise_to_detailed:think",))
    with pytest.raises(ValueError, match="duplicates"):
        sc.SignalAnalysisConfig(conditions=("none:think", "none:think"))
    with pytest.raises(ValueError, match="student_mode"):
        sc.SignalAnalysisConfig(student_mode="auto")
    with pytest.raises(ValueError, match="num_prompts"):
        sc.SignalAnalysisConfig(num_prompts=0)


def test_pca_on_hand_made_data():
    # Points on the line y = 2x: one component carries all the variance.
    x = torch.tensor([[-2.0, -4.0], [-1.0, -2.0], [0.0, 0.0], [1.0, 2.0], [2.0, 4.0]])
    result = sp.pca(x, n_components=2)
    torch.testing.assert_close(result.components_CF[0], torch.tensor([1.0, 2.0], dtype=torch.float64) / math.sqrt(5))
    torch.testing.assert_close(result.explained_variance_ratio_C, torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(result.coords_MC[:, 0], torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64) * math.sqrt(5))
    torch.testing.assert_close(result.coords_MC[:, 1], torch.zeros(5, dtype=torch.float64), atol=1e-12, rtol=0)
    # Axis-aligned data with variances 4 and 1: components are the axes, ratios 0.8 / 0.2.
    y = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    r = sp.pca(y)
    torch.testing.assert_close(r.components_CF.abs(), torch.eye(2, dtype=torch.float64))
    torch.testing.assert_close(r.explained_variance_ratio_C, torch.tensor([0.8, 0.2], dtype=torch.float64))


def test_standardize_columns():
    z = sp.standardize(torch.tensor([[1.0, 5.0, 3.0], [3.0, 5.0, 7.0]]))
    torch.testing.assert_close(z, torch.tensor([[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]], dtype=torch.float64))


def test_joint_pca_standardises_within_each_result():
    base = torch.tensor([[0.1, 0.2, 0.3, 0.9, 0.5, 0.4, 1.0], [0.3, 0.1, 0.2, 0.8, 0.4, 0.6, 1.2],
                         [0.2, 0.4, 0.1, 0.7, 0.6, 0.5, 0.9], [0.5, 0.3, 0.4, 0.6, 0.3, 0.7, 1.1]], dtype=torch.float64)

    def result(model, feats):
        return {"model": model, "config": {"student_mode": "think"}, "rollout_features": list(ss.ROLLOUT_FEATURES),
                "conditions": {"full": {"rollout_features": feats[:2].tolist()},
                               "answer": {"rollout_features": feats[2:].tolist()}}}

    # Model B = affine rescaling of model A: identical after within-model standardisation.
    points, explained = sp.joint_pca([result("A", base), result("B", 10 * base + 3)])
    assert set(points) == {"full", "answer"} and len(points["full"]) == 4
    torch.testing.assert_close(torch.tensor(points["full"][:2]), torch.tensor(points["full"][2:]))
    torch.testing.assert_close(torch.tensor(points["answer"][:2]), torch.tensor(points["answer"][2:]))
    single = sp.pca(sp.standardize(base), n_components=2)
    torch.testing.assert_close(torch.tensor(points["full"][:2], dtype=torch.float64), single.coords_MC[:2])
    assert explained == pytest.approx(single.explained_variance_ratio_C.tolist())


@pytest.mark.slow
def test_cli_samples_saves_rescoring_and_combines(tiny, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    _, _, _, train, model_dir = tiny
    script = Path(__file__).resolve().parents[2] / "scripts" / "analyze_signals.py"
    common = ["--model", str(model_dir), "--data", str(train), "--num-prompts", "2", "--rollouts-per-prompt", "1",
              "--max-new-tokens", "8", "--chunk-size", "16"]

    def run(*extra):
        return subprocess.run([sys.executable, str(script), *common, *extra], capture_output=True, text=True, timeout=300)

    first = run("--out-dir", str(tmp_path / "a"), "--conditions", "full_solution:think", "none:think")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "| none:think | 0.000 | 0.0 | 0.000 | 100.0 | 0.0 | 0.0 |" in first.stdout
    saved = tmp_path / "a" / "rollouts.json"
    second = run("--out-dir", str(tmp_path / "b"), "--conditions", "answer_only:no_think", "--rollouts", str(saved),
                 "--model-name", "again")
    assert second.returncode == 0, second.stderr[-2000:]
    a = json.loads((tmp_path / "a" / "signals.json").read_text())
    b = json.loads((tmp_path / "b" / "signals.json").read_text())
    assert a["num_tokens"] == b["num_tokens"]  # the same rollouts, rescored
    again = run("--out-dir", str(tmp_path / "a"), "--conditions", "none:think")
    assert again.returncode != 0 and "exists" in again.stderr
    combined = subprocess.run([sys.executable, str(script), "--combine", str(tmp_path / "a" / "signals.json"),
                               str(tmp_path / "b" / "signals.json")], capture_output=True, text=True, timeout=120)
    assert "| again | train | think | no_think | answer_only |" in combined.stdout
