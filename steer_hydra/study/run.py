"""Running a study: launch the dev jobs, choose on dev, launch the report jobs, write the report.

`run_study(plan, passthrough, launch, out_dir)` drives any launcher: `launch(jobs)` runs a batch of `plan.Job`s
and returns, per job in order, its record (`config_id`, `suite`: the suite's name as the job ran it, `save_dir`).
The table of what was launched (`launched.csv` in `out_dir`: each job's stage, concept, arm, point and cell) is
written after each batch; it is what the report reads, so a study's numbers are labelled by what ran.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.core.files import read_json, write_csv, write_json
from steer_hydra.study.plan import AXES, Job, StudyPlan
from steer_hydra.study.report import study_frame, write_study
from steer_hydra.study.selection import Objective, chosen_points, select_points

logger = logging.getLogger(__name__)

LAUNCHED_TABLE = "launched.csv"
PLAN_FILE = "plan.json"

Launch = Callable[[list[Job]], list[Mapping[str, Any]]]


def _rows(jobs: Sequence[Job], records: Sequence[Mapping[str, Any]], start: int) -> list[dict[str, Any]]:
    if len(records) != len(jobs):
        raise RuntimeError(f"The launcher returned {len(records)} job record(s) for {len(jobs)} job(s).")
    return [
        {
            "job": start + i,
            **job.row(),
            "suite_option": job.suite,
            "suite": record["suite"],
            "config_id": record["config_id"],
            "save_dir": str(record["save_dir"]),
        }  # fmt: skip
        for i, (job, record) in enumerate(zip(jobs, records, strict=True))
    ]


def read_launched(out_dir: str | Path) -> pd.DataFrame:
    """The launched table a study wrote into `out_dir`."""
    path = Path(out_dir) / LAUNCHED_TABLE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: it is written by a study sweep (experiment=concept_steering).")
    launched = pd.read_csv(path, keep_default_na=True)
    missing = [axis for axis in AXES if axis not in launched]  # a table written before an axis existed
    return launched.assign(**dict.fromkeys(missing, float("nan"))) if missing else launched


def read_plan(out_dir: str | Path) -> StudyPlan:
    """The plan a study wrote into `out_dir`."""
    return StudyPlan(**read_json(Path(out_dir) / PLAN_FILE)["plan"])


def save_dir_of(launched: pd.DataFrame) -> Path:
    """The one save_dir every launched job wrote into."""
    dirs = sorted(set(launched["save_dir"]))
    if len(dirs) != 1:
        raise ValueError(f"A study's jobs share one save_dir; these launched into {dirs}.")
    return Path(dirs[0])


def run_study(
    plan: StudyPlan,
    passthrough: Sequence[str],
    launch: Launch,
    out_dir: str | Path,
) -> dict[str, Any]:
    """Dev jobs, the choice on dev rows only, report jobs at the chosen points, then `report.write_study`; the plan
    (`plan.json`) and the launched table are written to `out_dir` first, so `report_study` can redo the report."""
    out_dir = Path(out_dir)
    write_json(out_dir / PLAN_FILE, {"plan": asdict(plan), "passthrough": list(passthrough)})
    rows: list[dict[str, Any]] = []

    def run(jobs: list[Job]) -> pd.DataFrame:
        if jobs:
            rows.extend(_rows(jobs, launch(jobs), len(rows)))
            write_csv(pd.DataFrame(rows), out_dir / LAUNCHED_TABLE)
        return pd.DataFrame(rows)

    launched = run(plan.dev_jobs(passthrough))
    choices = {}
    if not launched.empty:
        frame = study_frame(save_dir_of(launched), launched)
        objective = Objective(plan.objective, plan.maximize)
        selection = select_points(frame[frame["stage"] == "dev"], objective, methods=plan.methods())
        choices = chosen_points(selection)
        logger.info("Points chosen on dev: %s", {f"{c}/{a}": p.label for (c, a), p in choices.items()})
    return _report(plan, run(plan.report_jobs(passthrough, choices)), out_dir)


def report_study(out_dir: str | Path) -> dict[str, Any]:
    """The report of a study whose jobs ran (its `plan.json` and launched table in `out_dir`), written again."""
    return _report(read_plan(out_dir), read_launched(out_dir), Path(out_dir))


def _report(plan: StudyPlan, launched: pd.DataFrame, out_dir: Path) -> dict[str, Any]:
    save_dir = save_dir_of(launched)
    return write_study(
        study_frame(save_dir, launched),
        out_dir,
        objective=Objective(plan.objective, plan.maximize),
        methods=plan.methods(),
        follows={arm: method for arm, method in plan.follows.items() if arm in plan.arms},
        baseline=plan.baseline,
        prompt_arm=plan.prompt_arm if plan.prompt_arm in plan.arms else None,
        save_dir=save_dir,
    )
