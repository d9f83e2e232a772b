"""The held-out study inside the app: jobs launched through Hydra's launcher, the printed tables, one W&B run.

The study sweeper (`hydra/sweeper: study`, a shim in `hydra_plugins/`) calls `sweep_study`. The study itself
(plan, selection, statistics, report) is `steer_hydra.study`; this module adds what needs the app: launching a
batch of jobs with the configured launcher (basic, joblib, submitit...), reading each job's record, the
`launched_jobs.json` the sweep aggregate reads, `planned_jobs.json` (the jobs of each phase, counted before any
runs: the progress lines count over the whole study), the console tables and W&B.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from steer_hydra.app.compose import to_plain
from steer_hydra.app.records import JobRecord
from steer_hydra.app.tracking import wandb_key, wandb_run
from steer_hydra.core.files import write_json
from steer_hydra.study import LAUNCHED_FILE, PLANNED_FILE
from steer_hydra.study.plan import Job, StudyPlan
from steer_hydra.study.report import costs_table, study_table, summary_table
from steer_hydra.study.run import run_study

logger = logging.getLogger(__name__)

STUDY_DIR = "study"  # <sweep dir>/study/: the study's files


class HydraLauncher:
    """`launch(jobs)` for `run_study`: one batch through Hydra's launcher, each job's record read back."""

    def __init__(self, launcher: Any, sweep_dir: Path) -> None:
        self.launcher, self.sweep_dir = launcher, sweep_dir
        self.launched: list[list[str]] = []

    def __call__(self, jobs: list[Job]) -> list[Mapping[str, Any]]:
        overrides = [list(job.overrides) for job in jobs]
        start = len(self.launched)
        self.launched.extend(overrides)
        (self.sweep_dir / LAUNCHED_FILE).write_text(json.dumps(self.launched, indent=1))
        results = self.launcher.launch(overrides, initial_job_idx=start)
        records = []
        for result in results:
            _ = result.return_value  # re-raises a failed job's error, as Hydra's basic sweeper does
            records.append(JobRecord.read(result.hydra_cfg.hydra.runtime.output_dir).to_dict())
        return records


class StudyRefused(SystemExit):
    """A study refused before it launches anything (a concept that cannot be used, a sweep it cannot run), in one
    line naming the fix; no job runs and no sweep folder is left."""


def plan_study(spec: Mapping[str, Any], arguments: Sequence[str], config: DictConfig) -> tuple[StudyPlan, list[str]]:
    """The study's plan and the overrides every job gets; `StudyRefused` (one line) when a concept cannot be used
    or the command line asks for what a study cannot run. Every concept is checked here, before any job."""
    from steer_hydra.tasks.concepts import ConceptFileError

    try:
        plan = StudyPlan(**{key: to_plain(value) for key, value in spec.items()})
        layer = OmegaConf.select(config, "model.steering_layer", default=None)
        plan.default_layer = int(layer) if isinstance(layer, int) and not isinstance(layer, bool) else None
        passthrough = plan.take_arguments(arguments)
    except (ConceptFileError, ValueError, TypeError) as error:
        raise StudyRefused(f"steer_hydra: invalid study: {' '.join(str(error).split())}") from None
    return plan, passthrough


def sweep_study(spec: Mapping[str, Any], arguments: Sequence[str], config: DictConfig, launcher: Any) -> Any:
    """Run the study `spec` (the sweeper's config) with the command line's `arguments`; print and track it."""
    plan, passthrough = plan_study(spec, arguments, config)
    sweep_dir = Path(config.hydra.sweep.dir).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(config, sweep_dir / "multirun.yaml")
    write_json(sweep_dir / PLANNED_FILE, plan.job_counts(passthrough))  # the progress lines' whole-study total
    out = run_study(plan, passthrough, HydraLauncher(launcher, sweep_dir), sweep_dir / STUDY_DIR)
    if not out["results"].empty:
        logger.info("Study per concept (point chosen on dev, reported on test):\n%s", study_table(out["results"]))
        logger.info("Study over concepts:\n%s", summary_table(out["summary"]))
    if not out["costs_summary"].empty:
        logger.info("Capability costs over concepts:\n%s", costs_table(out["costs_summary"]))
    track_study(config, sweep_dir / STUDY_DIR, out)
    return out


def track_study(config: DictConfig, out_dir: Path, out: Mapping[str, Any]) -> None:
    """One W&B run (job_type `study_selection`) holding the study's tables, summary numbers, plots and page."""
    run = wandb_run(
        config,
        directory=out_dir,
        name=f"{config.experiment_name}-study",
        job_type="study_selection",
        tags=["study_selection"],
        run_config={"selection": out["provenance"]},
    )
    with run as tracker:
        if tracker is None:
            return
        keys = ("delta", "ci_low", "ci_high", "arm_mean", "win_rate")
        tracker.summary(
            {
                f"study/{r['arm_name']}/{r['metric']}/{key}": r[key]
                for r in out["summary"].to_dict("records")
                for key in keys
                if key in r
            }
        )
        for name in ("selection", "results", "summary", "costs", "costs_summary", "strength_curves"):
            if not out[name].empty:
                tracker.table(wandb_key("tables", f"study_{name}"), out[name])
        plots = {k: v for k, v in out["paths"].items() if k.startswith("plot_")}
        if plots:
            tracker.images({wandb_key("plots", name.removeprefix("plot_")): path for name, path in plots.items()})
        if "page" in out["paths"]:
            tracker.html(wandb_key("pages", "study"), out["paths"]["page"])
