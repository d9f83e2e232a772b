"""`StudySweeper`: a held-out steering study in one Hydra multirun (select a strength on dev, then report on test).

`python -m steer_hydra --multirun experiment=concept_steering` uses it (`hydra/sweeper: study`). It launches, through
the configured launcher (basic, joblib, submitit...), two batches of ordinary jobs into one save_dir:

1. **dev**: every method arm (a `swept` arm that follows no other) at every strength of the grid, on `dev_suite`;
2. after the jobs, each method's strength is chosen from the dev rows only (`steer_hydra.study`);
3. **report**: the baseline and every arm, vector arms at their method's chosen strength, on `test_suite` and each
   of `cost_suites` (the capability costs), one job per (arm, suite);
4. the study report (`<sweep dir>/study/`: selection, test statistics, capability costs, plot, W&B) is written
   by `StudySelection.report`.

Command-line overrides reach every job; `arm=a,b` and `strength=x,y` choose the study's arms and grid (the
baseline is always evaluated); any other sweep is refused (one study per save_dir). The launched jobs are
recorded in `<sweep dir>/launched_jobs.json` so a sweep aggregate can name those that left no record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from steer_hydra.study import LAUNCHED_FILE

logger = logging.getLogger(__name__)


class StudySweeper(Sweeper):
    """Two-stage sweep: method arms x strengths on dev, then every arm at its chosen strength on test and costs."""

    def __init__(
        self,
        arms: Sequence[str],
        strengths: Sequence[float],
        swept: Sequence[str],
        follows: dict[str, str] | None = None,
        objective: str = "concept_harmonic",
        maximize: bool = True,
        task: str = "steer_hydra/concept_steering",
        dev_suite: str = "concept_steering_dev",
        test_suite: str = "concept_steering_test",
        cost_suites: Sequence[str] = (),
        baseline: str = "baseline",
        scores: Sequence[str] = ("concept_score", "instruction_score", "fluency_score", "concept_harmonic"),
    ) -> None:
        self.arms, self.strengths = list(arms), [float(s) for s in strengths]
        self.swept, self.follows = list(swept), dict(follows or {})
        self.objective, self.maximize, self.task, self.baseline = objective, maximize, task, baseline
        self.dev_suite, self.test_suite, self.cost_suites = dev_suite, test_suite, list(cost_suites)
        self.scores = list(scores)
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # ------------------------------------------------------------------------------------------ planning
    def plan_arguments(self, arguments: Sequence[str]) -> list[str]:
        """Split the command line: `arm=` / `strength=` set the study's arms and grid; the rest reach every job."""
        passthrough = []
        for override in OverridesParser.create().parse_overrides(list(arguments)):
            key = override.get_key_element()
            if key in ("arm", "strength"):
                values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
                if key == "arm":
                    self.arms = [str(v) for v in values]
                else:
                    self.strengths = sorted(float(v) for v in values)
            elif override.is_sweep_override():
                raise ValueError(
                    f"StudySweeper: `{override.input_line}` sweeps {key!r}; a study sweeps only `arm` and "
                    "`strength` (one study per save_dir). Fix: run one study command per value, e.g. per seed."
                )
            else:
                passthrough.append(override.input_line)
        return passthrough

    def methods(self) -> list[str]:
        """The arms whose strength is chosen on dev: swept arms in the study, and the arms they follow."""
        chosen = [a for a in self.arms if a in self.swept and a not in self.follows]
        chosen += [self.follows[a] for a in self.arms if a in self.follows]
        return list(dict.fromkeys(chosen))

    def dev_jobs(self, passthrough: Sequence[str]) -> list[list[str]]:
        """The baseline (for the dev rows' paired deltas) and each method at each strength, on the dev suite."""
        methods = self.methods()
        if not methods:
            return []
        jobs = [[*passthrough, f"arm={self.baseline}", f"suite={self.dev_suite}"]]
        return jobs + [
            [*passthrough, f"arm={m}", f"strength={s!r}", f"suite={self.dev_suite}"]
            for m in methods
            for s in self.strengths
        ]

    def report_jobs(self, passthrough: Sequence[str], choices: dict[str, float]) -> list[list[str]]:
        arms = list(dict.fromkeys([self.baseline, *self.arms]))
        jobs = []
        for suite in [self.test_suite, *self.cost_suites]:
            for arm in arms:
                strength = choices.get(self.follows.get(arm, arm)) if arm in self.swept else None
                jobs.append([*passthrough, f"arm={arm}", *([f"strength={strength!r}"] if strength is not None else []),
                             f"suite={suite}"])  # fmt: skip
        return jobs

    # ------------------------------------------------------------------------------------------ running
    def sweep(self, arguments: list[str]) -> Any:
        from steer_hydra.app.study import StudySelection

        assert self.config is not None and self.launcher is not None
        passthrough = self.plan_arguments(arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        study = StudySelection(
            objective=self.objective,
            maximize=self.maximize,
            scores=self.scores,
            swept=self.swept,
            follows={a: p for a, p in self.follows.items() if a in self.arms},
            task=self.task,
            baseline=self.baseline,
            cost_suites=self.cost_suites,
        )
        launched: list[list[str]] = []
        dev = self.dev_jobs(passthrough)
        returns = [self._launch(dev, launched, sweep_dir)]
        save_dir = Path(str(returns[0][0].cfg.save_dir)) if returns[0] else Path(str(self.config.save_dir))
        choices = study.choose(save_dir, strengths=self.strengths) if dev else {}
        logger.info("Strengths chosen on dev: %s", choices or "(no swept arm)")
        returns.append(self._launch(self.report_jobs(passthrough, choices), launched, sweep_dir))
        study.report(self.config, save_dir=save_dir)
        return returns

    def _launch(self, jobs: list[list[str]], launched: list[list[str]], sweep_dir: Path) -> Any:
        if not jobs:
            return []
        self.validate_batch_is_legal(jobs)
        start = len(launched)
        launched.extend(jobs)
        (sweep_dir / LAUNCHED_FILE).write_text(json.dumps(launched, indent=1))
        results = self.launcher.launch(jobs, initial_job_idx=start)
        for result in results:
            _ = result.return_value  # re-raises a failed job's error, as Hydra's basic sweeper does
        return results
