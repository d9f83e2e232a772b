"""The evaluation layer: Inspect provider and collator, solver, scorer adapter, suites, runner, frames, plots.

Names resolve lazily (importing this package does not import Inspect or torch until a name is used).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> defining module (append new exports here)
_EXPORTS: dict[str, str] = {
    "ProviderOptions": "steer_hydra.evaluation.options",
    "as_inspect_model": "steer_hydra.evaluation.provider",
    "SteeringPipelineModelAPI": "steer_hydra.evaluation.provider",
    "LockLeaderCollator": "steer_hydra.evaluation.batching",
    "BatchRequest": "steer_hydra.evaluation.batching",
    "runtime_kwargs_solver": "steer_hydra.evaluation.solvers",
    "sample_scorer_from_inspect": "steer_hydra.evaluation.scorers",
    "InspectSuite": "steer_hydra.evaluation.suite",
    "SteeringEval": "steer_hydra.evaluation.runner",
    "results_frame": "steer_hydra.analysis.frames",
    "runs_frame": "steer_hydra.analysis.frames",
    "samples_frame": "steer_hydra.analysis.logs",
    "summarize_runs": "steer_hydra.analysis.frames",
    "paired_deltas": "steer_hydra.analysis.stats",
    "results_from_logs": "steer_hydra.analysis.logs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
