"""The strength curves: the objective on dev against strength, per method and layer, per concept and over concepts."""

from __future__ import annotations

import pandas as pd

from steer_hydra.analysis.stats import confidence_interval, per_sample_means

CURVE_COLUMNS = ("concept", "arm_name", "layer", "strength", "mean", "ci_low", "ci_high", "n")
OVER_CONCEPTS = "all"


def strength_curves(
    dev: pd.DataFrame, objective: str, *, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> pd.DataFrame:
    """One row (`CURVE_COLUMNS`) per (concept, arm_name, layer, strength) of the `dev` rows that have a strength,
    each sample first averaged over its runs (`stats.per_sample_means`); empty without strengths.

    - per concept: `mean` of the per-sample means, `ci_low`/`ci_high` their percentile bootstrap over samples
      (`stats.confidence_interval`, seeded), `n` the samples;
    - over concepts (`concept` = "all"): the mean over concepts of each concept's mean (every concept weighs the
      same) and a percentile bootstrap over those per-concept means (`stats.confidence_interval`: concepts are the
      resampled units; each concept's mean carries its own sample noise), `n` the concepts; NaN with one concept.
      It costs n_resamples x concepts, cheap over hundreds of concepts (the two-stage `stats.concept_interval` of
      `study_summary.csv` also redraws every sample).

    `layer` is a line's layer where the arm's dev points span several layers (a layer sweep), else empty (NA): an
    unswept layer (the model's `steering_layer`, recorded in every row) gives one line per arm.
    """
    if dev.empty or "strength" not in dev or objective not in dev:
        return pd.DataFrame(columns=list(CURVE_COLUMNS))
    rows = dev[dev["strength"].notna()]
    if "layer" not in rows:
        rows = rows.assign(layer=float("nan"))
    if rows.empty:
        return pd.DataFrame(columns=list(CURVE_COLUMNS))
    swept = rows.groupby("arm_name")["layer"].transform("nunique") > 1
    rows = rows.assign(layer=rows["layer"].where(swept))
    keys = ["concept", "arm_name", "layer", "strength"]
    means = per_sample_means(rows, objective, keys=[*keys, "sample_id"]).dropna(subset=[objective])
    out = []
    for (concept, arm, layer, strength), frame in means.groupby(keys, sort=True, dropna=False):
        values = frame[objective].to_numpy(dtype=float)
        low, high = confidence_interval(values, confidence=confidence, n_resamples=n_resamples, seed=seed)
        out.append((concept, arm, layer, strength, float(values.mean()), low, high, values.size))
    for (arm, layer, strength), frame in means.groupby(keys[1:], sort=True, dropna=False):
        concept_means = frame.groupby("concept", sort=True)[objective].mean().to_numpy(dtype=float)
        low, high = confidence_interval(concept_means, confidence=confidence, n_resamples=n_resamples, seed=seed)
        out.append((OVER_CONCEPTS, arm, layer, strength, float(concept_means.mean()), low, high, concept_means.size))
    table = pd.DataFrame(out, columns=list(CURVE_COLUMNS))
    return table.assign(layer=table["layer"].astype("Int64"), n=table["n"].astype(int))


def curve_label(arm: str, layer: float) -> str:
    """A line's name: the arm, with its layer when layers were swept."""
    return arm if pd.isna(layer) else f"{arm} layer {int(layer)}"
