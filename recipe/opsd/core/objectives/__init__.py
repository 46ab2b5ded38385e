"""The OPSD objectives, one module each, found by name through one registry (``base``).

    divergence     the paper: full-vocabulary clipped divergence D(pT, pS) (+ task term)
    sampled_token  teacher - student log-prob of the sampled token through the PPO surrogate
    purified       Purified OPSD: the PMI-corrected target of two teacher forwards
    beta_opsd      beta-OPSD: mixture target, return-to-go credit
    rlsd           RLSD: the grader's GRPO advantage, each token's share weighted by the teacher

Shared pieces (surrogate, advantages, SFT term, returns) are in ``terms``. Selected with
``opsd.loss.objective``; parameters in ``opsd.loss.params``. A new objective: one module with a
``@register_objective`` class, imported below, and one experiment preset.
"""

# registration, in the order the names are listed
from recipe.opsd.core.objectives import divergence  # noqa: F401  isort: skip
from recipe.opsd.core.objectives import sampled_token  # noqa: F401  isort: skip
from recipe.opsd.core.objectives import purified  # noqa: F401  isort: skip
from recipe.opsd.core.objectives import beta_opsd  # noqa: F401  isort: skip
from recipe.opsd.core.objectives import rlsd  # noqa: F401  isort: skip
from recipe.opsd.core.objectives.base import (
    Objective,
    ObjectiveBatch,
    ObjectiveLoss,
    get_objective,
    objective_names,
    register_objective,
)

__all__ = ["Objective", "ObjectiveBatch", "ObjectiveLoss", "get_objective", "objective_names", "register_objective"]
