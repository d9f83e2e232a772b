"""Held-out strength selection (AxBench's protocol): each method's strength is chosen on dev rows only.

`select_strengths(dev, objective)` refuses any row that is not a dev row and picks, per method (`arm_name`, the
arm's YAML name), the strength with the best mean objective over its samples (ties go to the strength of smallest
magnitude: the gentlest intervention wins). Sanity arms (a random or negated direction) are not tuned: `follows`
maps them to the method whose choice they take, so a control is compared at the strength its method was chosen
at. `at_chosen_strength` keeps each arm's rows at its chosen strength; `strength_of` reads a configuration's
strength from its canonical controls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from steer_hydra.evaluation.stats import per_sample_means

STRENGTH_KEYS = ("multiplier", "alpha")
SELECTION_COLUMNS = ("arm_name", "strength", "objective", "candidates", "source")


@dataclass(frozen=True, slots=True)
class Objective:
    """What "best" means on dev: the mean of `metric` (higher is better unless `maximize=False`)."""

    metric: str = "concept_harmonic"
    maximize: bool = True


def select_strengths(
    dev: pd.DataFrame, objective: Objective, *, follows: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Per method: the strength with the best dev objective. Columns `SELECTION_COLUMNS`.

    `dev` holds per-sample rows with `arm_name`, `strength`, `config_id`, `sample_id`, `split` and the objective's
    column; every row must be a dev row. Arms in `follows` take the strength chosen for the arm they follow
    (`source` says which); arms without a strength (baseline, prompts) get NaN.
    """
    if "split" not in dev or not (dev["split"] == "dev").all():
        splits = sorted(map(str, dev["split"].unique())) if "split" in dev else ["<no split column>"]
        raise ValueError(f"select_strengths reads dev rows only; got split(s) {splits}. Fix: pass frame[split=='dev'].")
    if objective.metric not in dev:
        raise KeyError(
            f"select_strengths: objective metric {objective.metric!r} is not a column of the dev frame. Fix: choose "
            f"one of the score columns {sorted(c for c in dev.columns if c.endswith(('_score', '_harmonic')))}."
        )
    follows = dict(follows or {})
    rows: dict[str, dict[str, Any]] = {}
    for name, frame in dev.groupby("arm_name", sort=True):
        if name in follows:
            continue
        swept = frame.dropna(subset=["strength"])
        if swept.empty:
            rows[name] = dict(zip(SELECTION_COLUMNS, (name, math.nan, math.nan, 0, name), strict=True))
            continue
        means = per_sample_means(swept, objective.metric, keys=("strength", "sample_id"))
        by_strength = means.groupby("strength", sort=True)[objective.metric].mean()
        best = by_strength.max() if objective.maximize else by_strength.min()
        chosen = min((float(s) for s, v in by_strength.items() if v == best), key=abs)
        rows[name] = dict(zip(SELECTION_COLUMNS, (name, chosen, float(best), len(by_strength), name), strict=True))
    for name, parent in follows.items():
        if parent not in rows:
            raise ValueError(f"select_strengths: {name!r} follows {parent!r}, which has no dev rows.")
        rows[name] = {**rows[parent], "arm_name": name, "objective": math.nan, "candidates": 0, "source": parent}
    return pd.DataFrame(list(rows.values()), columns=list(SELECTION_COLUMNS))


def at_chosen_strength(frame: pd.DataFrame, choices: pd.DataFrame, *, baseline: str = "baseline") -> pd.DataFrame:
    """The rows of each arm at its chosen strength (arms without a chosen strength: their unswept rows)."""
    chosen = dict(zip(choices["arm_name"], choices["strength"], strict=True))
    keep = []
    for name, rows in frame.groupby("arm_name", sort=True):
        strength = chosen.get(name, math.nan)
        if name == baseline or strength is None or (isinstance(strength, float) and math.isnan(strength)):
            keep.append(rows if rows["strength"].isna().all() else rows[rows["strength"].isna()])
        else:
            keep.append(rows[rows["strength"] == strength])
    return pd.concat(keep, ignore_index=True) if keep else frame.iloc[:0]


def dev_test(
    samples: pd.DataFrame, *, task: str | None = None, strengths: Sequence[float] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The study task's dev rows (swept rows restricted to the `strengths` grid when given) and its test rows."""
    frame = samples if task is None else samples[samples["task"] == task]
    dev = frame[frame["split"] == "dev"]
    if strengths is not None:
        grid = [float(s) for s in strengths]
        on_grid = dev["strength"].map(lambda s: pd.isna(s) or any(math.isclose(s, g) for g in grid))
        dev = dev[on_grid.astype(bool)]
    return dev, frame[frame["split"] == "test"]


def strength_of(controls: Any) -> float | None:
    """The steering strength of a configuration's canonical controls: the first `multiplier` (or `alpha`) found."""
    if isinstance(controls, Mapping):
        for key in STRENGTH_KEYS:
            value = controls.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        values: Sequence[Any] = list(controls.values())
    elif isinstance(controls, (list, tuple)):
        values = controls
    else:
        return None
    for value in values:
        found = strength_of(value)
        if found is not None:
            return found
    return None
