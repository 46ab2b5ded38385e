"""Signal analysis: native modes, prompt caps (Sol vs Sol-long), scaled heads, entropy strata,
rollout sampling defaults, multi-run tables and the joint PCA over datasets (tiny models)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from recipe.analysis import signal_analysis as sa
from recipe.analysis import signal_conditions as sc
from recipe.analysis import signal_pca as sp
from recipe.analysis import signal_report as srep
from recipe.analysis import signal_rollouts as sr
from recipe.analysis import signal_scoring as ss
from recipe.common import chat, prompts
from recipe.opsd.core import signals

REPO_ROOT = Path(__file__).resolve().parents[2]
# A ChatML template without an enable_thinking switch (SmolLM2's shape).
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def native_tokenizer(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny[4])
    tok.chat_template = CHATML
    assert not chat.has_thinking_switch(tok)
    return tok


def _reference_signals(model, items, rollouts, cond, config):
    """token_signals on plain full logits (model(...).logits, whatever the head does) per rollout, concatenated."""
    out = []
    for rollout in rollouts:
        item, resp = items[rollout.prompt], rollout.response_ids
        with torch.no_grad():
            s = model(torch.tensor([item.student_ids + resp])).logits[0]
            t = model(torch.tensor([item.teacher_ids[cond] + resp])).logits[0]
        ps, pt, n = len(item.student_ids), len(item.teacher_ids[cond]), len(resp)
        out.append(signals.token_signals(s[ps - 1 : ps - 1 + n].double(), t[pt - 1 : pt - 1 + n].double(),
                                         torch.tensor(resp), student_temperature=config.temperature, clip_tau=config.clip_tau))
    return {k: torch.cat([o[k] for o in out]) for k in out[0]}


# ---------------------------------------------------------------------------- modes
def test_condition_syntax_native_and_caps():
    assert sc.Condition.parse("full_solution:native") == sc.Condition("full_solution", "native")
    capped = sc.Condition.parse("full_solution:think@1024")
    assert (capped.context, capped.mode, capped.prompt_cap, capped.name) == ("full_solution", "think", 1024,
                                                                            "full_solution:think@1024")
    assert sc.MODES == chat.MODES == ("think", "no_think", "native")  # the renderer's own modes, native included
    with pytest.raises(ValueError, match="context:mode"):
        sc.Condition.parse("full_solution")
    with pytest.raises(ValueError, match="answer_only.*has none to truncate"):
        sc.Condition.parse("answer_only:think@64")
    for bad in ("full_solution:think@0", "full_solution:think@x", "full_solution:think@"):
        with pytest.raises(ValueError, match="positive integer"):
            sc.Condition.parse(bad)
    sc.SignalAnalysisConfig(student_mode="native", conditions=("full_solution:native", "full_solution:native@64"))


def test_native_mode_renders_the_template_default(tiny, native_tokenizer):
    _, _, rows, _, _ = tiny
    config = sc.SignalAnalysisConfig(num_prompts=2, student_mode="native", conditions=("full_solution:native", "none:native"))
    items, _ = sr.build_prompt_items(rows, native_tokenizer, config=config)
    for item in items:
        record = rows[item.row]
        assert item.student_ids == chat.render_ids(record["prompt"], native_tokenizer, "native")
        _, teacher = prompts.build_prompt_pair("full_solution", record["extra_info"])
        assert item.teacher_ids["full_solution:native"] == chat.render_ids(teacher, native_tokenizer, "native")
        assert item.teacher_ids["none:native"] == item.student_ids


@pytest.mark.parametrize("student,conditions", [("think", ("full_solution:native",)), ("native", ("full_solution:no_think",))])
def test_a_mode_the_template_cannot_render_is_refused(tiny, native_tokenizer, student, conditions):
    _, _, rows, _, _ = tiny
    config = sc.SignalAnalysisConfig(num_prompts=2, student_mode=student, conditions=conditions)
    with pytest.raises(ValueError, match="no enable_thinking switch.*--student-mode native"):
        sr.build_prompt_items(rows, native_tokenizer, config=config)


def test_native_mode_on_a_switch_template_is_the_template_default(tiny):
    """native on Qwen3's template = its default (thinking): nothing passed to the template."""
    _, tokenizer, rows, _, _ = tiny
    config = sc.SignalAnalysisConfig(num_prompts=1, student_mode="native", conditions=("answer_only:native",))
    (item,), _ = sr.build_prompt_items(rows, tokenizer, config=config)
    assert item.student_ids == chat.render_ids(rows[item.row]["prompt"], tokenizer, "native")


# ---------------------------------------------------------------------------- prompt caps
def test_prompt_cap_cuts_the_solution_to_the_longest_fitting_prefix(tiny):
    _, tokenizer, rows, _, _ = tiny
    extra = dict(rows[0]["extra_info"])
    extra["solution"] = " ".join(f"step {i}: add the tens then the ones." for i in range(8))
    full, cut = sr.teacher_prompt_ids(extra, sc.Condition("full_solution", "think"), tokenizer)
    assert not cut
    cap = len(full) - 25
    ids, cut = sr.teacher_prompt_ids(extra, sc.Condition("full_solution", "think", cap), tokenizer)
    assert cut and len(ids) <= cap
    text = tokenizer.decode(ids)
    solution_ids = tokenizer(extra["solution"], add_special_tokens=False)["input_ids"]
    # The kept text is a token prefix of the solution, and one more token would not fit.
    k = max(j for j in range(len(solution_ids)) if tokenizer.decode(solution_ids[:j]) in text)
    assert 0 < k < len(solution_ids)
    one_more = {**extra, "solution": tokenizer.decode(solution_ids[: k + 1])}
    longer = chat.render_ids(prompts.build_prompt_pair("full_solution", one_more)[1], tokenizer, "think")
    assert len(longer) > cap
    assert ids == chat.render_ids(prompts.build_prompt_pair(
        "full_solution", {**extra, "solution": tokenizer.decode(solution_ids[:k])})[1], tokenizer, "think")
    # A cap the full prompt fits: the uncapped prompt, not cut.
    same, cut = sr.teacher_prompt_ids(extra, sc.Condition("full_solution", "think", len(full)), tokenizer)
    assert same == full and not cut
    # A cap the problem alone does not fit: the row is unusable, with the reason.
    with pytest.raises(ValueError, match="with solution cut"):
        sr.teacher_prompt_ids(extra, sc.Condition("full_solution", "think", 10), tokenizer)


@pytest.mark.slow
def test_sol_and_sol_long_share_rows_and_rollouts(tiny, tmp_path):
    """The paper's length control: Sol (prompt cap, C truncated) and Sol-long (no cap) on the same rows;
    the global teacher-prompt filter does not apply to capped conditions; rescoring rebuilds the cut."""
    model, tokenizer, rows, _, _ = tiny
    lengths = sorted(len(sr.teacher_prompt_ids(r["extra_info"], sc.Condition("full_solution", "think"), tokenizer)[0])
                     for r in rows)
    assert lengths[0] < lengths[-1]
    cap = lengths[0]  # the shortest teacher prompt: every longer row needs a cut
    conds = ("full_solution:think", f"full_solution:think@{cap}")
    config = sc.SignalAnalysisConfig(num_prompts=len(rows), rollouts_per_prompt=1, max_new_tokens=6, conditions=conds)
    items, skipped = sr.build_prompt_items(rows, tokenizer, config=config)
    assert len(items) == len(rows) and not skipped
    cut = [item for item in items if item.truncated]
    assert 0 < len(cut) < len(items) and all(item.truncated == [conds[1]] for item in cut)
    for item in items:
        assert len(item.teacher_ids[conds[1]]) <= cap
        assert (item.teacher_ids[conds[1]] == item.teacher_ids[conds[0]]) == (not item.truncated)
    # A global filter below the cap drops rows for the uncapped condition only.
    only_capped = sc.SignalAnalysisConfig(num_prompts=len(rows), conditions=(conds[1],), teacher_max_prompt_length=5)
    assert len(sr.build_prompt_items(rows, tokenizer, config=only_capped)[0]) == len(rows)
    rollouts = sr.sample_rollouts(model, tokenizer, items, config=config)
    result = sa.run_signal_analysis(model, tokenizer, rows, config=config, items=items, rollouts=rollouts)
    assert result["prompt_truncated_rows"] == {conds[1]: len(cut)}
    assert "cut to the prompt cap" in srep.markdown_report(result)
    path = tmp_path / "rollouts.json"
    sr.save_rollouts(path, items, rollouts, meta={"sampling": sc.sampling_settings(config)})
    loaded, _, _ = sr.load_rollouts(path, rows, tokenizer, config=config)
    assert [i.teacher_ids for i in loaded] == [i.teacher_ids for i in items]
    assert [i.truncated for i in loaded] == [i.truncated for i in items]


# ---------------------------------------------------------------------------- heads
def _falcon_h1(vocab_size: int, pad_token_id: int, multiplier: float):
    import transformers

    config = transformers.FalconH1Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=8, mamba_chunk_size=8, lm_head_multiplier=multiplier, pad_token_id=pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.FalconH1ForCausalLM(config).eval()


@pytest.mark.slow
def test_scaled_head_model_is_scored_like_its_logits(tiny):
    """Falcon-H1 (logits = lm_head(h) x 0.37): the folded head reproduces token_signals on model(...).logits."""
    _, tokenizer, rows, _, _ = tiny
    model = _falcon_h1(len(tokenizer), tokenizer.pad_token_id, 0.37)
    config = sc.SignalAnalysisConfig(num_prompts=2, rollouts_per_prompt=1, max_new_tokens=5, chunk_size=4,
                                     conditions=("full_solution:think", "none:think"), top_p=1.0, top_k=-1)
    items, _ = sr.build_prompt_items(rows, tokenizer, config=config)
    rollouts = [sr.Rollout(prompt=p, response_ids=[40 + p, 41, 42, 43], finish_reason="length") for p in range(2)]
    scored = ss.score_rollouts(model, items, rollouts, config=config)
    ref = _reference_signals(model, items, rollouts, "full_solution:think", config)
    for key in ("fwd_kl", "adv", "student_entropy", "teacher_entropy", "student_logp", "teacher_logp"):
        torch.testing.assert_close(scored["full_solution:think"][key].double(), ref[key], atol=2e-5, rtol=1e-4, msg=key)
    # Without the fold the entropies would be those of 1/0.37-times sharper logits.
    weight, _ = ss.output_head(model)
    torch.testing.assert_close(weight, model.lm_head.weight * 0.37)


def test_soft_capped_and_unknown_heads_are_refused(tiny):
    model, tokenizer, rows, _, _ = tiny
    config = sc.SignalAnalysisConfig(num_prompts=2, rollouts_per_prompt=1, conditions=("none:think",))
    items, _ = sr.build_prompt_items(rows, tokenizer, config=config)
    rollouts = [sr.Rollout(prompt=0, response_ids=[40, 41], finish_reason="length")]
    model.config.final_logit_softcapping = 30.0
    try:
        with pytest.raises(ValueError, match="soft-capped heads are not supported"):
            ss.score_rollouts(model, items, rollouts, config=config)
    finally:
        model.config.final_logit_softcapping = None
    # A scale attribute the model's forward ignores: the folded head no longer gives its logits.
    model.config.lm_head_multiplier = 0.5
    try:
        with pytest.raises(ValueError, match="output head is not supported"):
            ss.score_rollouts(model, items, rollouts, config=config)
    finally:
        del model.config.lm_head_multiplier


# ---------------------------------------------------------------------------- sampling
def test_rollout_sampling_defaults_are_the_trainers():
    trainer = yaml.safe_load((REPO_ROOT / "recipe" / "opsd" / "config" / "opsd_trainer.yaml").read_text())
    rollout = trainer["actor_rollout_ref"]["rollout"]
    config = sc.SignalAnalysisConfig()
    assert (config.temperature, config.top_p, config.top_k) == (rollout["temperature"], rollout["top_p"], rollout["top_k"])
    assert config.max_new_tokens == 1024 and config.num_prompts == 2048 and config.rollouts_per_prompt == 2


@pytest.mark.parametrize("top_p,top_k", [(0.95, 20), (0.9, -1), (1.0, 3), (1.0, -1)])
def test_rescoring_check_sees_the_filtered_sampling_distribution(tiny, top_p, top_k):
    model, tokenizer, rows, _, _ = tiny
    config = sc.SignalAnalysisConfig(num_prompts=2, rollouts_per_prompt=2, max_new_tokens=8, top_p=top_p, top_k=top_k,
                                     conditions=("none:think",), chunk_size=5)
    items, _ = sr.build_prompt_items(rows, tokenizer, config=config)
    rollouts = sr.sample_rollouts(model, tokenizer, items, config=config)
    scored = ss.score_rollouts(model, items, rollouts, config=config)["none:think"]
    sampled = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=torch.float64)
    torch.testing.assert_close(scored["sampler_view_logp"].double(), sampled, atol=1e-4, rtol=0)
    assert ss.sampler_logp_gap(rollouts, scored) < 1e-4
    # The scored student distribution is the untruncated one: renormalising over a kept subset raises log p.
    if top_p < 1 or top_k > 0:
        assert bool((scored["sampler_view_logp"] >= scored["student_logp"] - 1e-5).all())
        assert bool((scored["sampler_view_logp"] > scored["student_logp"] + 1e-3).any())
    else:
        torch.testing.assert_close(scored["sampler_view_logp"], scored["student_logp"], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- entropy strata
def test_entropy_strata_by_hand():
    kl = torch.tensor([0.01, 0.2, 0.0, 0.07, 0.5, 0.03, 0.06, 0.0, 0.1, 0.02])
    ent = torch.tensor([0.1, 2.0, 0.0, 1.5, 3.0, 0.2, 1.0, 0.05, 2.5, 0.3])
    got = ss.entropy_strata(kl, ent, fraction=0.2)  # 2 of 10 positions
    # highest entropy: 3.0 (kl .5), 2.5 (kl .1); lowest: 0.0 (kl 0), 0.05 (kl 0)
    assert got["highest_kl"] == pytest.approx(0.3) and got["highest_d_gt_005"] == 100.0
    assert got["lowest_kl"] == 0.0 and got["lowest_d_gt_005"] == 0.0
    got = ss.entropy_strata(kl, ent, fraction=0.3)  # ceil(3) positions: + 2.0 (kl .2) / + 0.1 (kl .01)
    assert got["highest_kl"] == pytest.approx(0.8 / 3) and got["lowest_kl"] == pytest.approx(0.01 / 3)
    # Ties keep the lower index (stable), as signals.entropy_tail_shares does.
    tied = ss.entropy_strata(torch.tensor([1.0, 0.0, 0.0]), torch.ones(3), fraction=0.3)
    assert tied["highest_kl"] == 1.0 and tied["lowest_kl"] == 1.0
    # The same positions as the shared HE share: 2 x highest mean / total = the HE20 KL share.
    shares = signals.entropy_tail_shares(kl, kl, ent, fraction=0.2)
    high = ss.entropy_strata(kl, ent, fraction=0.2)["highest_kl"]
    assert 100 * 2 * high / float(kl.sum()) == pytest.approx(shares["kl_share"])


# ---------------------------------------------------------------------------- multi-run
def _result(model, student, data, conds):
    keys = ("fwd_kl", "d_gt_005", "abs_adv", "agree", "enc", "disc")
    return {"model": model, "data_label": data, "config": {"student_mode": student},
            "conditions": {name: {"summary": dict(zip(keys, values))} for name, values in conds.items()}}


def test_combined_table_keys_rows_by_run():
    table = srep.combined_table([
        _result("A", "think", "OT", {"full_solution:think": (0.1, 20, 0.15, 93, 30, 60), "answer_only:think": (0.02, 3, 0.04, 98, 40, 50)}),
        _result("A", "think", "OMR", {"answer_only:think": (0.04, 5, 0.06, 97, 41, 52)}),
        _result("A", "think", "OMR", {"answer_only:think": (0.06, 7, 0.08, 95, 43, 54)}),  # a second run: no error
        _result("B", "think", "OT", {"full_solution:think@1024": (0.3, 40, 0.25, 91, 20, 70), "full_solution:think": (0.3, 40, 0.25, 91, 20, 70)}),
        _result("B", "think", "OMR", {"answer_only:think": (0.1, 9, 0.1, 90, 45, 50)}),
    ]).splitlines()
    assert "| A | OT | think | think | answer_only | 0.020 | 3.0 | 0.040 | 98.0 | 40.0 | 50.0 |" in table
    assert "| A | OMR | think | think | answer_only | 0.040 | 5.0 | 0.060 | 97.0 | 41.0 | 52.0 |" in table
    assert "| A | OMR | think | think | answer_only | 0.060 | 7.0 | 0.080 | 95.0 | 43.0 | 54.0 |" in table
    assert "| B | OT | think | think | full_solution@1024 | 0.300 | 40.0 | 0.250 | 91.0 | 20.0 | 70.0 |" in table
    macro = sorted(line for line in table if line.startswith("| Macro"))
    # OMR answer: A = mean of its two runs (0.05, 6, 0.07, 96, 42, 53), then the mean with B.
    assert macro == [
        "| Macro average | OMR | think | think | answer_only | 0.075 | 7.5 | 0.085 | 93.0 | 43.5 | 51.5 |",
        "| Macro average | OT | think | think | full_solution | 0.200 | 30.0 | 0.200 | 92.0 | 25.0 | 65.0 |",
    ]


def _features(seed, n):
    return torch.rand(n, len(ss.ROLLOUT_FEATURES), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _pca_result(model, student, data, conds):
    return {"model": model, "data_label": data, "config": {"student_mode": student}, "rollout_features": list(ss.ROLLOUT_FEATURES),
            "conditions": {name: {"rollout_features": feats.tolist()} for name, feats in conds.items()}}


def test_joint_pca_keeps_datasets_apart_and_standardises_per_model_mode():
    ot, omr, dapo = _features(0, 6), _features(1, 4), _features(2, 4)
    results = [
        _pca_result("A", "think", "OT", {"answer_only:think": ot[:3], "full_solution:think": ot[3:]}),
        _pca_result("A", "think", "OMR", {"answer_only:think": omr}),
        _pca_result("A", "think", "DAPO", {"answer_only:think": dapo}),
        # Model B = an affine rescaling of model A's features: identical after per-setting standardisation.
        _pca_result("B", "think", "OT", {"answer_only:think": 5 * ot[:3] + 2, "full_solution:think": 5 * ot[3:] + 2}),
        _pca_result("B", "think", "OMR", {"answer_only:think": 5 * omr + 2}),
        _pca_result("B", "think", "DAPO", {"answer_only:think": 5 * dapo + 2}),
    ]
    points, explained = sp.joint_pca(results)
    assert set(points) == {"OT/answer_only:think", "OT/full_solution:think", "OMR/answer_only:think", "DAPO/answer_only:think"}
    assert [len(points[k]) for k in ("OT/answer_only:think", "OMR/answer_only:think", "DAPO/answer_only:think")] == [6, 8, 8]
    # The setting is standardised as one block (all three datasets together), not per run.
    block = sp.standardize(torch.cat([ot, omr, dapo]))
    single = sp.pca(torch.cat([block, block]), n_components=2)
    torch.testing.assert_close(torch.tensor(points["OMR/answer_only:think"][:4], dtype=torch.float64), single.coords_MC[6:10])
    torch.testing.assert_close(torch.tensor(points["OMR/answer_only:think"][:4]), torch.tensor(points["OMR/answer_only:think"][4:]))
    assert explained == pytest.approx(single.explained_variance_ratio_C.tolist())
    assert not math.isclose(float(sp.standardize(omr)[0, 0]), float(block[6, 0]))  # per-run would differ
    # One dataset: plain condition labels.
    assert set(sp.joint_pca(results[:1])[0]) == {"answer_only:think", "full_solution:think"}


# ---------------------------------------------------------------------------- a real model
@pytest.mark.slow
def test_cli_on_smollm2_native(smollm2_dir, tmp_path):
    """SmolLM2 (no thinking switch): the CLI runs in native mode; think is refused with the hint."""
    import json
    import subprocess
    import sys

    from recipe.toy.demo import write_tiny_data
    from recipe.toy.task import TaskConfig

    train = write_tiny_data(tmp_path / "data", TaskConfig(num_operands=2, digits=2, n_train=4, n_heldout=1))["train"]
    script = REPO_ROOT / "scripts" / "analyze_signals.py"
    common = [sys.executable, str(script), "--model", str(smollm2_dir), "--data", str(train), "--num-prompts", "2",
              "--rollouts-per-prompt", "1", "--max-new-tokens", "12", "--windows", "0:4", "4:12"]
    run = subprocess.run([*common, "--out-dir", str(tmp_path / "a"), "--student-mode", "native",
                          "--conditions", "full_solution:native", "none:native"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "a" / "signals.json").read_text())
    assert result["sampler_logp_max_abs_diff"] < 1e-3
    assert result["conditions"]["none:native"]["summary"]["fwd_kl"] == pytest.approx(0.0, abs=1e-6)
    assert result["conditions"]["full_solution:native"]["summary"]["fwd_kl"] > 0
    refused = subprocess.run([*common, "--out-dir", str(tmp_path / "b"), "--conditions", "full_solution:think"],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "--student-mode native" in refused.stderr
