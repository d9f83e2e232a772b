"""`StudySweeper`: a held-out steering study in one Hydra multirun; a shim over `steer_hydra.study`.

`python -m steer_hydra --multirun experiment=concept_steering` uses it (`hydra/sweeper: study`). Its config is a
`steer_hydra.study.plan.StudyPlan` (arms, concepts, grids, suites); `steer_hydra.app.study.sweep_study` plans
the jobs, launches them through the configured launcher, chooses on dev and writes the report.
"""

from __future__ import annotations

from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class StudySweeper(Sweeper):
    """Dev jobs per concept and grid point, the choice on dev, then every arm at its point on test and costs."""

    def __init__(self, **spec: Any) -> None:
        self.spec = spec
        self.config: DictConfig | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from steer_hydra.app.study import sweep_study

        assert self.config is not None and self.launcher is not None
        return sweep_study(self.spec, arguments, self.config, self.launcher)
