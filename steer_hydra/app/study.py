"""`StudySelection`: the held-out study's selection and report inside the app (files, printed tables, W&B).

The study sweeper (`hydra/sweeper: study`) calls `choose` between its dev and report batches and `report` at the
end; as a Hydra callback it reports a plain grid multirun that evaluated every strength on both splits. The work
itself is `steer_hydra.study`; this class adds the split of the built-in concept task, the study's folder in the
sweep, the printed tables and one W&B run holding the study's tables.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from steer_hydra.app.plan import to_plain
from steer_hydra.app.tracking import Tracker, wandb_key
from steer_hydra.study.report import STUDY_SCORES, costs_table, study_frame, study_table, write_study
from steer_hydra.study.selection import Objective, dev_test, select_strengths

logger = logging.getLogger(__name__)

STUDY_DIR = "study"  # <sweep dir>/study/: the study's files


class StudySelection(Callback):
    """The study's selection and report: strengths chosen on dev, reported on test, capability costs, W&B.

    Args: `objective` (a score column) and `maximize`, `scores` (the columns reported), `swept` (arms whose
    strength is swept), `follows` (sanity arm -> its method's arm), `task` (the task holding the splits),
    `baseline`, `cost_suites` (suites whose tasks give each arm's capability costs).
    """

    def __init__(
        self,
        objective: str = "concept_harmonic",
        maximize: bool = True,
        scores: Sequence[str] = STUDY_SCORES,
        swept: Sequence[str] = (),
        follows: Mapping[str, str] | None = None,
        task: str = "steer_hydra/concept_steering",
        baseline: str = "baseline",
        cost_suites: Sequence[str] = (),
    ) -> None:
        self.objective = Objective(objective, maximize)
        self.scores, self.swept, self.follows = list(scores), list(swept), dict(follows or {})
        self.task, self.baseline, self.cost_suites = task, baseline, list(cost_suites)

    def samples(self, save_dir: str | Path) -> pd.DataFrame:
        """The study frame of `save_dir` with the concept task's splits."""
        from steer_hydra.tasks.concept_steering import split_ids

        split_of = {i: "dev" for i in split_ids("dev")} | {i: "test" for i in split_ids("test")}
        return study_frame(Path(save_dir).absolute(), split_of=split_of, swept=self.swept)

    def choose(self, save_dir: str | Path, *, strengths: Sequence[float] | None = None) -> dict[str, float]:
        """Each method arm's strength, chosen on the dev rows of `save_dir` only (sanity arms are not chosen)."""
        dev, _ = dev_test(self.samples(save_dir), task=self.task, strengths=strengths)
        choices = select_strengths(dev[~dev["arm_name"].isin(list(self.follows))], self.objective)
        return {r.arm_name: float(r.strength) for r in choices.itertuples(index=False) if not pd.isna(r.strength)}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.report(config)

    def report(
        self, config: DictConfig, *, save_dir: str | Path | None = None, strengths: Sequence[float] | None = None
    ) -> dict[str, Any] | None:
        """Select on dev, report on test (and costs) into `<sweep dir>/study/`, print the tables, log to W&B."""
        out_dir = Path(config.hydra.sweep.dir).absolute() / STUDY_DIR
        try:
            samples = self.samples(save_dir if save_dir is not None else str(config.save_dir))
            present = set(samples["arm_name"])
            out = write_study(
                samples,
                out_dir,
                objective=self.objective,
                scores=self.scores,
                follows={arm: parent for arm, parent in self.follows.items() if arm in present},
                baseline=self.baseline,
                task=self.task,
                strengths=strengths,
                cost_suites=self.cost_suites,
            )
        except (ValueError, KeyError) as error:
            logger.warning("Study selection skipped: %s", error)
            return None
        logger.info("Study (strength chosen on dev, reported on test):\n%s", study_table(out["results"]))
        if not out["costs"].empty:
            logger.info("Capability costs (chosen strength):\n%s", costs_table(out["costs"]))
        self._track(config, out_dir, out)
        return out

    def _track(self, config: DictConfig, out_dir: Path, out: Mapping[str, Any]) -> None:
        logger_cfg = to_plain(OmegaConf.select(config, "logger") or {"kind": "none"})
        if logger_cfg.get("kind") == "none":
            return
        tracker = Tracker.from_logger(
            logger_cfg,
            directory=out_dir,
            name=f"{config.experiment_name}-study",
            group=str(config.experiment_name),
            job_type="study_selection",
            tags=["study_selection", *map(str, config.tags)],
            config={"selection": out["provenance"]},
        ).start()
        exit_code = 1
        try:
            keys = ("delta", "ci_low", "ci_high", "arm_mean", "changed", "degenerate_rate")
            tracker.summary(
                {
                    f"study/{r['arm_name']}/{r['metric']}/{key}": r[key]
                    for r in out["results"].to_dict("records")
                    for key in keys
                    if key in r
                }
            )
            tracker.table(wandb_key("tables", "study_results"), out["results"])
            tracker.table(wandb_key("tables", "selection"), out["choices"])
            if not out["costs"].empty:
                tracker.table(wandb_key("tables", "capability_costs"), out["costs"])
            tracker.images({wandb_key("plots", "study_deltas"): out["paths"]["plot_study_deltas"]})
            exit_code = 0
        finally:
            tracker.finish(exit_code)
