"""The outputs of a signal analysis: the Markdown tables of one run (``markdown_report``), the table over
several runs (``combined_table``), and the files of ``write_outputs`` (``OUTPUT_FILES``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipe.analysis.signal_conditions import Condition
from recipe.analysis.signal_pca import setting

def markdown_report(result: Mapping[str, Any]) -> str:
    """The paper's signal tables for one analysis result, as Markdown."""
    conds = result["conditions"]
    cfg = result["config"]
    lines = [
        f"# Token-level signals: {result['model']}",
        "",
        f"{result['num_prompts']} prompts x {cfg['rollouts_per_prompt']} rollouts = {result['num_rollouts']} rollouts, "
        f"{result['num_tokens']} response tokens (mean length {result['mean_response_length']:.1f}, "
        f"{100 * result['truncated_rate']:.1f}% hit the {cfg['max_new_tokens']}-token cap); student mode "
        f"`{cfg['student_mode']}`, data `{result.get('data_label', '-')}`, sampling T={cfg['temperature']} "
        f"top-p={cfg['top_p']} top-k={cfg['top_k'] if cfg['top_k'] > 0 else 'off'}, "
        f"scoring T={cfg['signal_temperature'] or cfg['temperature']} (full vocabulary).",
        f"Rescoring check: max |student log-prob - sampler log-prob| = {_f(result.get('sampler_logp_max_abs_diff'), 6)}.",
    ]
    if result.get("prompt_truncated_rows"):
        cut = ", ".join(f"{name}: {n} of {result['num_prompts']}" for name, n in result["prompt_truncated_rows"].items())
        lines.append(f"Rows whose privileged text was cut to the prompt cap: {cut}.")
    lines += [
        "",
        "## Signal summary",
        "",
        "Fwd KL: mean vocabulary-summed unclipped forward KL; D>.05: % positions with Fwd KL > 0.05; "
        "|adv|: mean |log pT(y) - log pS(y)|; Agree: % top-1 agreement; Enc/Disc: % positions with adv > 0 / < 0; "
        f"H_S/H_T: mean entropies; Clip: mean % vocabulary entries with d > tau={cfg['clip_tau']}.",
        "",
        "| Condition | Fwd KL | D>.05 (%) | abs adv | Agree (%) | Enc (%) | Disc (%) | H_S | H_T | Clip (%) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rep in conds.items():
        s = rep["summary"]
        lines.append(
            f"| {name} | {_f(s['fwd_kl'], 3)} | {_f(s['d_gt_005'], 1)} | {_f(s['abs_adv'], 3)} | {_f(s['agree'], 1)} | "
            f"{_f(s['enc'], 1)} | {_f(s['disc'], 1)} | {_f(s['student_entropy'], 3)} | {_f(s['teacher_entropy'], 3)} | "
            f"{_f(100 * s['clip_frac'], 3)} |"
        )
    first = next(iter(conds.values()))
    frac = round(100 * first["entropy_tails"]["fraction"])
    lines += [
        "",
        f"## Highest-entropy {frac}% shares (HE{frac})",
        "",
        f"Mean forward KL and D>.05 (%) within the {frac}% positions of highest / lowest student entropy; share (%) "
        f"of total forward KL and of total |adv| carried by the highest {frac}% (pooled positions).",
        "",
        f"| Condition | Highest {frac}% KL | Highest {frac}% D>.05 (%) | Lowest {frac}% KL | Lowest {frac}% D>.05 (%) "
        f"| HE{frac} KL (%) | HE{frac} abs adv (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rep in conds.items():
        t = rep["entropy_tails"]
        lines.append(f"| {name} | {_f(t['highest_kl'], 3)} | {_f(t['highest_d_gt_005'], 1)} | {_f(t['lowest_kl'], 3)} | "
                     f"{_f(t['lowest_d_gt_005'], 1)} | {_f(t['kl_share'], 1)} | {_f(t['abs_adv_share'], 1)} |")
    labels = [w["window"] for w in first["position_windows"]]
    lines += [
        "",
        "## Forward KL by response-position window (mean / SNR, SNR = mean / token std)",
        "",
        "| Condition | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for name, rep in conds.items():
        cells = [
            f"{_f(w['mean'], 3)} / {_f(w['snr'], 3)}" if w["count"] else "-" for w in rep["position_windows"]
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Vocabulary items with the largest divergence mass (sum over positions of d_v)", ""]
    for name, rep in conds.items():
        lines += [f"**{name}**", "", "| Rank | Token | Mass | Share (%) |", "|---|---|---|---|"]
        for rank, item in enumerate(rep["top_tokens"], start=1):
            lines.append(f"| {rank} | `{_token_text(item['token'])}` | {_f(item['mass'], 4)} | {_f(item['share'], 1)} |")
        lines.append("")
    style = result["rollout_style"]
    lines += [
        "## Rollout text features (% of rollouts; recipe/analysis/generation_features.py)",
        "",
        '| "wait" | Self-correction | <think> |',
        "|---|---|---|",
        f"| {_f(style['wait'], 1)} | {_f(style['self_correction'], 1)} | {_f(style['think_tag'], 1)} |",
        "",
    ]
    pca_info = result["pca"]
    ratios = ", ".join(f"{100 * r:.1f}%" for r in pca_info["explained_variance_ratio"])
    lines += [
        "## Rollout-level PCA (features standardised within the model)",
        "",
        f"Explained variance of PC1, PC2: {ratios}. Features: {', '.join(pca_info['features'])}.",
        "",
        "| Condition | PC1 centroid | PC2 centroid |",
        "|---|---|---|",
    ]
    for name, rep in conds.items():
        xy = rep["pca"]
        lines.append(f"| {name} | {_f(sum(p[0] for p in xy) / len(xy), 3)} | {_f(sum(p[1] for p in xy) / len(xy), 3)} |")
    return "\n".join(lines) + "\n"


def combined_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown table over several analyses (models, student modes, datasets), in the layout of the
    paper's ``tab:token_context_signal_app`` / ``tab:token_signal_summary``: Model, Data, S, T, Context,
    Fwd KL, D>.05, abs adv, Agree, Enc, Disc; one row per run and condition (a condition of two runs
    never collides). For each (student mode, dataset, condition) that every model analysed in that
    student mode has (two or more models), a macro-average row gives each model equal weight (a model
    with several runs of it counts once, with the mean of its runs)."""
    cols = (("fwd_kl", 3), ("d_gt_005", 1), ("abs_adv", 3), ("agree", 1), ("enc", 1), ("disc", 1))
    lines = [
        "| Model | Data | S | T | Context | Fwd KL | D>.05 (%) | abs adv | Agree (%) | Enc (%) | Disc (%) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], dict[str, list[Mapping[str, float]]]] = {}
    models_by_mode: dict[str, set[str]] = {}
    for result in results:
        model, student = setting(result)
        data = str(result.get("data_label", "data"))
        models_by_mode.setdefault(student, set()).add(model)
        for name, rep in result["conditions"].items():
            cond = Condition.parse(name)
            s = rep["summary"]
            groups.setdefault((student, data, name), {}).setdefault(model, []).append(s)
            context = cond.context if cond.prompt_cap is None else f"{cond.context}@{cond.prompt_cap}"
            cells = " | ".join(_f(s[key], digits) for key, digits in cols)
            lines.append(f"| {model} | {data} | {student} | {cond.mode} | {context} | {cells} |")
    for (student, data, name), by_model in groups.items():
        if len(models_by_mode[student]) < 2 or set(by_model) != models_by_mode[student]:
            continue
        cond = Condition.parse(name)
        context = cond.context if cond.prompt_cap is None else f"{cond.context}@{cond.prompt_cap}"
        per_model = [{key: sum(_nan_none(s[key]) for s in runs) / len(runs) for key, _ in cols} for runs in by_model.values()]
        cells = " | ".join(_f(sum(m[key] for m in per_model) / len(per_model), digits) for key, digits in cols)
        lines.append(f"| Macro average | {data} | {student} | {cond.mode} | {context} | {cells} |")
    return "\n".join(lines) + "\n"


def to_jsonable(value: Any) -> Any:
    """NaN / inf -> None (strict JSON), tuples -> lists, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


OUTPUT_FILES = ("signals.json", "signals.md", "pca.png", "position_windows.png")


def write_outputs(result: Mapping[str, Any], out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """``signals.json``, ``signals.md``, ``pca.png`` and ``position_windows.png`` in ``out_dir``."""
    from recipe.analysis import plots

    out_dir = Path(out_dir)
    paths = {name: out_dir / name for name in OUTPUT_FILES}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"refusing to overwrite {existing}; pass overwrite=True (--overwrite) or another out dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths["signals.json"].write_text(json.dumps(to_jsonable(result), indent=1))
    paths["signals.md"].write_text(markdown_report(result))
    conds = result["conditions"]
    ratios = result["pca"]["explained_variance_ratio"]
    plots.plot_pca_scatter(
        {name: rep["pca"] for name, rep in conds.items()}, paths["pca.png"], explained=ratios,
        title=f"{result['model']}: rollout-level signals (student {result['config']['student_mode']})", overwrite=True,
    )
    plots.plot_position_windows(
        {name: to_jsonable(rep["position_windows"]) for name, rep in conds.items()}, paths["position_windows.png"], overwrite=True
    )
    return paths


def _f(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if 0 < abs(value) < 10 ** (-digits):  # would print as 0.000
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def _token_text(token: str) -> str:
    return token.replace("\n", "\\n").replace("\t", "\\t").replace("|", "\\|").replace("`", "'") or " "


def _nan_none(value: Any) -> float:
    return math.nan if value is None else float(value)
