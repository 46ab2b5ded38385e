"""The rollout-level PCA of the signal analysis (paper ``fig:teacher_context_signals``): per-rollout
features standardised within a model--mode setting, principal components by ``torch.linalg.svd``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recipe.analysis.signal_scoring import ROLLOUT_FEATURES

def standardize(features_MF: torch.Tensor) -> torch.Tensor:
    """Z-score every column (population std); constant columns become 0."""
    x = features_MF.double()
    std = x.std(dim=0, unbiased=False)
    return (x - x.mean(dim=0)) / torch.where(std > 0, std, torch.ones_like(std))


@dataclass
class PCAResult:
    coords_MC: torch.Tensor  # projections of the rows
    components_CF: torch.Tensor  # unit principal directions
    explained_variance_ratio_C: torch.Tensor
    mean_F: torch.Tensor


def pca(features_MF: torch.Tensor, *, n_components: int = 2) -> PCAResult:
    """PCA by SVD of the centred matrix. Each component's sign is fixed so that its
    largest-magnitude loading is positive (deterministic output)."""
    x = features_MF.double()
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"pca: need a [M >= 2, F] matrix, got shape {tuple(x.shape)}")
    if not 1 <= n_components <= min(x.shape):
        raise ValueError(f"pca: n_components must be in [1, {min(x.shape)}], got {n_components}")
    mean_F = x.mean(dim=0)
    centred = x - mean_F
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    components = vh[:n_components]
    signs = torch.sign(components.gather(1, components.abs().argmax(dim=1, keepdim=True)))
    components = components * signs
    total = (s**2).sum()
    ratio = (s[:n_components] ** 2) / total if total > 0 else torch.zeros(n_components, dtype=x.dtype)
    return PCAResult(coords_MC=centred @ components.T, components_CF=components, explained_variance_ratio_C=ratio, mean_F=mean_F)


def setting(result: Mapping[str, Any]) -> tuple[str, str]:
    """The model--mode setting of a result: (model name, student mode)."""
    return str(result["model"]), str(result["config"]["student_mode"])


def joint_pca(results: Sequence[Mapping[str, Any]], *, n_components: int = 2) -> tuple[dict[str, list[list[float]]], list[float]]:
    """One PCA over the rollout features of several analysis results (models, student modes, datasets).

    The paper (``fig:teacher_context_pca_by_model``): "large markers are centroids for the seven
    dataset--context conditions ... Features are standardized within each model--mode setting
    before the joint PCA fit". So the results of one (model, student mode) setting (e.g. three runs on
    OpenThoughts, OpenMathReasoning and DAPO) are stacked and standardised together, then one PCA is
    fitted on all settings. A point's label is its condition, prefixed with the run's ``data_label``
    when the results span several datasets (``OMR/answer_only:think`` and ``DAPO/answer_only:think``
    stay apart); points with the same label from different settings are pooled (a per-condition
    cloud over models). Returns ``({label: [[pc1, pc2], ...]}, explained_variance_ratio)``.
    """
    by_data = len({r.get("data_label", "data") for r in results}) > 1
    settings: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for result in results:
        if list(result["rollout_features"]) != list(ROLLOUT_FEATURES):
            raise ValueError(f"{result.get('model')}: rollout features {result['rollout_features']} != {list(ROLLOUT_FEATURES)}")
        settings.setdefault(setting(result), []).append(result)
    blocks, labels = [], []
    for group in settings.values():
        feats = []
        for result in group:
            prefix = f"{result.get('data_label', 'data')}/" if by_data else ""
            for name, rep in result["conditions"].items():
                feats.append(torch.tensor(rep["rollout_features"], dtype=torch.float64))
                labels += [prefix + name] * len(rep["rollout_features"])
        blocks.append(standardize(torch.cat(feats)))
    fit = pca(torch.cat(blocks), n_components=n_components)
    points: dict[str, list[list[float]]] = {}
    for label, xy in zip(labels, fit.coords_MC.tolist()):
        points.setdefault(label, []).append(xy)
    return points, fit.explained_variance_ratio_C.tolist()
