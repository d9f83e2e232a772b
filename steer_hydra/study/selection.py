"""Held-out selection (AxBench's protocol): each method's grid point is chosen on dev rows only, per concept.

`select_points(dev, objective, methods=...)` refuses any row that is not a dev row and, per (concept, method),
scores every grid point it launched by the mean objective over its samples (each sample first averaged over its
trials), and chooses the best; ties go to the point launched first (the plan launches the gentlest strength
first). Sanity arms (a random or negated direction) are not tuned: `follows` maps them to the method whose point
they take, so a control is compared where its method was chosen. The points come from what the study launched
(`concept`, `arm_name`, `point` and its axis columns, `job`), never from stored control descriptors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from steer_hydra.analysis.stats import per_sample_means
from steer_hydra.study.plan import AXES, Point

SELECTION_COLUMNS = ("concept", "arm_name", "point", *AXES, "objective", "n", "chosen", "source")


@dataclass(frozen=True, slots=True)
class Objective:
    """What "best" means on dev: the mean of `metric` (higher is better unless `maximize=False`)."""

    metric: str = "concept_harmonic"
    maximize: bool = True


def select_points(
    dev: pd.DataFrame,
    objective: Objective,
    *,
    methods: Sequence[str],
    follows: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Every dev point of every method with its objective, the chosen one flagged; followers take their method's
    choice (`source` names it). Columns `SELECTION_COLUMNS`, one row per (concept, arm, point).

    `dev` holds per-sample rows with `stage` ("dev" only), `concept`, `arm_name`, `point`, the `AXES` columns,
    `job` (launch order), `config_id`, `sample_id` and the objective's column.
    """
    if "stage" not in dev or not (dev["stage"] == "dev").all():
        stages = sorted(map(str, dev["stage"].unique())) if "stage" in dev else ["<no stage column>"]
        raise ValueError(f"select_points reads dev rows only; got stage(s) {stages}. Fix: pass frame[stage=='dev'].")
    if objective.metric not in dev:
        raise KeyError(
            f"select_points: objective metric {objective.metric!r} is not a column of the dev frame. Fix: choose "
            f"one of the score columns {sorted(c for c in dev.columns if c.endswith(('_score', '_harmonic')))}."
        )
    rows: list[dict[str, Any]] = []
    for (concept, method), frame in dev[dev["arm_name"].isin(list(methods))].groupby(["concept", "arm_name"]):
        means = per_sample_means(frame, objective.metric, keys=("job", "sample_id"))
        scored = means.groupby("job", sort=True)[objective.metric].agg(["mean", "count"])
        first = frame.drop_duplicates("job").set_index("job")
        best = scored["mean"].max() if objective.maximize else scored["mean"].min()
        chosen_job = scored.index[scored["mean"] == best].min()  # ties: the point launched first
        for job, stats in scored.iterrows():
            point = first.loc[job]
            rows.append(
                {
                    "concept": concept,
                    "arm_name": method,
                    "point": point["point"],
                    **{axis: point[axis] for axis in AXES},
                    "objective": float(stats["mean"]),
                    "n": int(stats["count"]),
                    "chosen": bool(job == chosen_job),
                    "source": method,
                }
            )
    table = pd.DataFrame(rows, columns=list(SELECTION_COLUMNS))
    chosen = table[table["chosen"]]
    followers = []
    for arm, method in dict(follows or {}).items():
        picked = chosen[chosen["arm_name"] == method]
        if picked.empty:
            raise ValueError(f"select_points: {arm!r} follows {method!r}, which has no dev rows.")
        followers.append(picked.assign(arm_name=arm, objective=float("nan"), n=0, source=method))
    return pd.concat([table, *followers], ignore_index=True) if followers else table


def chosen_points(selection: pd.DataFrame) -> dict[tuple[str, str], Point]:
    """`{(concept, arm_name): Point}` of the chosen rows of a `select_points` table."""
    return {
        (row["concept"], row["arm_name"]): Point.from_columns(row)
        for row in selection[selection["chosen"]].to_dict("records")
    }
