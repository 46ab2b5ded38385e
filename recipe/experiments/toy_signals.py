"""Toy-scale reproductions of the paper's frozen-teacher measurements (docs/toy_world.md).

``initial_signals`` runs the project's signal analysis (``recipe.analysis.signal_analysis``:
sample rollouts from the student prompt once, rescore the same response tokens under every
teacher context with ``recipe.opsd.core.signals``) on the toy student, in its no-think mode, with
response-position windows scaled to toy responses (~20 tokens instead of thousands).
"""

from __future__ import annotations

from pathlib import Path

from recipe.analysis import signal_analysis as sa

CONTEXTS = ("full_solution", "answer_only", "unrelated", "none")
# Response-position windows [lo, hi) for ~20-token toy responses (the paper's start at 0-128).
TOY_WINDOWS = ((0, 4), (4, 8), (8, 12), (12, 16), (16, 24), (24, 48))


def signal_config(*, num_prompts: int = 128, rollouts_per_prompt: int = 2, temperature: float = 1.0,
                  max_new_tokens: int = 48, seed: int = 42, contexts=CONTEXTS) -> sa.SignalAnalysisConfig:
    return sa.SignalAnalysisConfig(
        num_prompts=num_prompts, rollouts_per_prompt=rollouts_per_prompt, temperature=temperature,
        # untruncated sampling, as the toy measurements of docs/toy_world.md were taken
        top_p=1.0, top_k=-1,
        max_new_tokens=max_new_tokens, seed=seed, student_mode="no_think",
        conditions=tuple(f"{context}:no_think" for context in contexts), windows=TOY_WINDOWS,
        sample_batch_size=64, score_batch_size=32, top_tokens=10,
    )


def initial_signals(model_dir: str | Path, train_parquet: str | Path, *, config: sa.SignalAnalysisConfig,
                    model_name: str = "toy student") -> dict:
    """Signal-analysis result (``sa.run_signal_analysis``) of ``model_dir`` on the toy training prompts."""
    model = sa.load_model(model_dir)
    tokenizer = sa.load_tokenizer(model_dir)
    rows = sa.load_rows(train_parquet)
    return sa.run_signal_analysis(model, tokenizer, rows, config=config, model_name=model_name)


def context_table(result: dict) -> str:
    """Fwd KL per teacher context and its ratio to the full-solution teacher's."""
    conds = result["conditions"]
    full = conds.get("full_solution:no_think", {}).get("summary", {}).get("fwd_kl")
    lines = ["| teacher context | Fwd KL | Fwd KL / full solution | top-1 agree (%) | abs adv |", "|---|---|---|---|---|"]
    for name, rep in conds.items():
        s = rep["summary"]
        ratio = f"{s['fwd_kl'] / full:.2f}" if full else "-"
        lines.append(f"| {name.split(':')[0]} | {s['fwd_kl']:.4f} | {ratio} | {s['agree']:.1f} | {s['abs_adv']:.3f} |")
    return "\n".join(lines) + "\n"
