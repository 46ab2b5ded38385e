"""Frozen teacher-student signal analysis: sample rollouts once, rescore them under teacher conditions.

The paper's "Token-Level Analysis Protocol" (2,048 prompts x 2 rollouts at T 1.1, a 1,024-token cap; the
frozen teacher scores the visited response tokens under its privileged context): ``run_signal_analysis``
and ``analyze``, what ``scripts/analyze_signals.py`` runs. The parts: ``signal_conditions`` (conditions,
``SignalAnalysisConfig``), ``signal_rollouts`` (prompt items, sampling, the rollouts file, model loading),
``signal_scoring`` (token signals, per-condition summaries), ``signal_pca`` (the rollout PCA),
``signal_report`` (tables, output files). Protocol, columns and the mode grid: docs/analysis.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from recipe.analysis import generation_features, signal_report, signal_rollouts
from recipe.analysis.signal_conditions import SignalAnalysisConfig, sampling_settings
from recipe.analysis.signal_pca import pca, standardize
from recipe.analysis.signal_rollouts import PromptItem, Rollout, build_prompt_items, sample_rollouts
from recipe.analysis.signal_scoring import ROLLOUT_FEATURES, condition_report, sampler_logp_gap, score_rollouts
from recipe.common import cli

logger = logging.getLogger(__name__)

# Warn when rescored student log-probs differ from the sampler's by more than this (nats);
# fp32 generate with a KV cache vs one full forward agree to ~1e-5 on CPU, bf16 to ~1e-2.
SAMPLER_GAP_WARNING = 5e-2


def run_signal_analysis(
    model, tokenizer, rows: Sequence[Mapping[str, Any]], *, config: SignalAnalysisConfig, model_name: str = "model",
    data_label: str = "data", rollouts: Sequence[Rollout] | None = None, items: Sequence[PromptItem] | None = None,
) -> dict[str, Any]:
    """Sample (unless ``rollouts`` + ``items`` are given), score, summarise. Returns the result dict.

    ``model_name`` and ``data_label`` (the dataset, e.g. ``openthoughts``) name the run in multi-run
    tables and the joint PCA, where conditions of different datasets are kept apart.
    """
    skipped: dict[str, int] = {}
    if items is None:
        items, skipped = build_prompt_items(rows, tokenizer, config=config)
    if rollouts is None:
        rollouts = sample_rollouts(model, tokenizer, items, config=config)
    token_signals = score_rollouts(model, items, rollouts, config=config)
    conditions = {
        name: condition_report(sig, tokenizer, config=config, num_rollouts=len(rollouts)) for name, sig in token_signals.items()
    }
    names = list(conditions)
    stacked = torch.cat([torch.tensor(conditions[n]["rollout_features"], dtype=torch.float64) for n in names])
    result_pca = pca(standardize(stacked), n_components=2)
    coords = result_pca.coords_MC.split(len(rollouts))
    for name, xy in zip(names, coords):
        conditions[name]["pca"] = xy.tolist()
    lengths = [len(r.response_ids) for r in rollouts]
    gap = sampler_logp_gap(rollouts, next(iter(token_signals.values())))
    if gap is not None and gap > SAMPLER_GAP_WARNING:
        logger.warning(
            "rescored student log-probs differ from the sampler's by up to %.3g (> %g): the rescoring does not see "
            "the rollouts as sampled (prompt, template or dtype mismatch?)", gap, SAMPLER_GAP_WARNING,
        )
    texts = [tokenizer.decode(r.response_ids, skip_special_tokens=True) for r in rollouts]
    style = generation_features.feature_rates([{"text": t, "num_tokens": n} for t, n in zip(texts, lengths)])
    prompt_truncated = {name: sum(name in item.truncated for item in items) for name in names if "@" in name}
    return {
        "sampler_logp_max_abs_diff": gap,
        "model": model_name,
        "data_label": data_label,
        "config": asdict(config),
        "num_prompts": len(items),
        "num_rollouts": len(rollouts),
        "num_tokens": sum(lengths),
        "mean_response_length": sum(lengths) / len(lengths),
        "truncated_rate": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
        "skipped_rows": skipped,
        "prompt_truncated_rows": prompt_truncated,
        "rollout_style": style,
        "rollout_features": list(ROLLOUT_FEATURES),
        "pca": {
            "features": list(ROLLOUT_FEATURES),
            "components": result_pca.components_CF.tolist(),
            "explained_variance_ratio": result_pca.explained_variance_ratio_C.tolist(),
        },
        "conditions": conditions,
    }


def analyze(*, model: str, data: str, out_dir: str | Path, config: SignalAnalysisConfig, model_name: str | None = None,
            data_label: str | None = None, rollouts: str | None = None, device: str = "cpu", dtype: str = "float32",
            overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One analysis of ``model`` on the parquet ``data`` into ``out_dir``: sample (or reload ``rollouts``, a
    ``rollouts.json`` of an earlier run), score, write ``signal_report.OUTPUT_FILES`` and ``rollouts.json``.

    Every input problem (an existing output, the model directory, the parquet, the rollouts file) is a
    ``recipe.common.cli.InputError`` raised before any sampling. Returns the result (with ``timing_s``).
    """
    from recipe.common.checkpoints import check_model_dir

    out_dir = Path(out_dir)
    rollouts_out = out_dir / "rollouts.json"
    if rollouts_out.exists() and not overwrite and rollouts != str(rollouts_out):
        raise cli.OutputExistsError("exists", file=rollouts_out,
                                    hint=f"pass --overwrite, --rollouts {rollouts_out}, or another --out-dir")
    cli.refuse_overwrite([out_dir / name for name in signal_report.OUTPUT_FILES], overwrite=overwrite,
                         other="another --out-dir")
    model_name = model_name or Path(model).resolve().name
    check_model_dir(model)
    with cli.reraise_as_input(ValueError, file=data):  # the parquet's schema checks
        rows = signal_rollouts.load_rows(cli.require_file(data, what="training parquet"))
    tokenizer = signal_rollouts.load_tokenizer(model)
    loaded = None
    timing = {"sample": 0.0}
    if rollouts:
        with cli.reraise_as_input(ValueError, KeyError, file=rollouts, hint="pass a rollouts.json of the same data and model"):
            items, sampled, meta = signal_rollouts.load_rollouts(cli.require_file(rollouts, what="rollouts file"), rows,
                                                                 tokenizer, config=config)
        log(f"rescoring {len(sampled)} saved rollouts from {rollouts} (sampled with {meta.get('sampling')})")
    else:
        with cli.reraise_as_input(ValueError, file=data):  # no row can be scored under the conditions
            items, skipped = build_prompt_items(rows, tokenizer, config=config)
        log(f"sampling {len(items)} prompts x {config.rollouts_per_prompt} rollouts (skipped rows: {skipped or 'none'})")
        if config.backend == "hf":
            loaded = signal_rollouts.load_model(model, device=device, dtype=dtype)
        # vLLM samples first and frees the GPU before the HF model is loaded for scoring.
        start = time.time()
        sampled = sample_rollouts(loaded if loaded is not None else model, tokenizer, items, config=config)
        timing["sample"] = round(time.time() - start, 1)
        out_dir.mkdir(parents=True, exist_ok=True)
        meta = {"model": str(model), "data": str(data), "sampling": sampling_settings(config)}
        signal_rollouts.save_rollouts(rollouts_out, items, sampled, meta=meta)
    if loaded is None:
        loaded = signal_rollouts.load_model(model, device=device, dtype=dtype)
    start = time.time()
    result = run_signal_analysis(loaded, tokenizer, rows, config=config, model_name=model_name,
                                 data_label=data_label or Path(data).stem, rollouts=sampled, items=items)
    result["timing_s"] = {**timing, "score": round(time.time() - start, 1)}
    log(f"sampling {timing['sample']} s, scoring {result['timing_s']['score']} s")
    paths = signal_report.write_outputs(result, out_dir, overwrite=overwrite)
    log(signal_report.markdown_report(result))
    log("wrote " + ", ".join(str(p) for p in paths.values()))
    return result
