"""The OPSD objectives, one module each (its docstring says what it optimises), found by name through
one registry (``base``).

Every module of this package but the helpers (``base``; ``terms``: the surrogate, advantages, SFT term
and returns they share) is imported here by discovery (``base.import_objective_modules``) and registers
its objective. Selected with ``opsd.loss.objective``; parameters in ``opsd.loss.params``. A new
objective: one module with a ``@register_objective`` class and one experiment preset.
"""

from recipe.opsd.core.objectives.base import (
    Objective,
    ObjectiveBatch,
    ObjectiveLoss,
    get_objective,
    import_objective_modules,
    objective_names,
    register_objective,
)

import_objective_modules(package=__name__, path=__path__)

__all__ = ["Objective", "ObjectiveBatch", "ObjectiveLoss", "get_objective", "objective_names", "register_objective"]
