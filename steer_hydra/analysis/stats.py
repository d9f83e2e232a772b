"""The one statistics module: per-sample means, paired deltas vs the baseline with their confidence interval, the
changed share and the degenerate rate. Every table the job, the sweep and the study report comes from here.

Invariants (what the numbers mean):
- samples are the clusters: a score is first averaged per (configuration, sample) over all its runs (a run is a
  (`seed`, `trial_id`) pair: seeds pool as further trials), then arm and baseline are paired on `sample_id`, and
  the bootstrap resamples samples, never single generations; repeated trials narrow the interval only as far as
  they reduce per-sample noise;
- `delta` is the mean of the paired per-sample differences; its interval is a seeded percentile bootstrap over
  samples (`numpy.random.default_rng(seed)`, fresh per row, so a row's interval does not depend on which other
  arms are present) or, with `method="normal"`, `delta +/- z * sd / sqrt(n)`; with one pair it is NaN;
- `changed`: per sample, the share of its runs whose completion differs from the baseline's completion in the
  same run (paired on `seed` and `trial_id`), averaged over samples. At temperature 0 it is the share of samples whose
  output changed; under sampling it estimates how often a generation differs, not whether any ever did;
- `concept_interval` / `concept_deltas`: a study over concepts weighs each concept the same (the mean over
  concepts of each concept's mean) and its interval resamples concepts, then samples within each drawn concept,
  so it covers both the spread between concepts and the noise within each;
- `degenerate_rate`: the share of an arm's generations flagged degenerate (`fluency < threshold` for a fluency
  score column, else by the caller's `is_degenerate(text)`).
All functions are pure: frames in, frames out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

DELTA_METHODS = ("bootstrap", "normal")
SCORE_VALUES = {"C": 1.0, "I": 0.0, "P": 0.5, "N": 0.0}  # Inspect's letter grades as numbers
DELTA_COLUMNS = (
    "metric", "n", "baseline_mean", "arm_mean", "delta", "ci_low", "ci_high", "se", "n_trials", "n_trials_baseline",
    "changed", "confidence", "method",
)  # fmt: skip


def numeric_scores(series: pd.Series, metric: str) -> pd.Series:
    """A score column as floats: numbers and bools as they are, the letters C/I/P/N as 1/0/0.5/0, None as NaN."""

    def convert(value: Any) -> float:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return math.nan
        if isinstance(value, str) and value in SCORE_VALUES:
            return SCORE_VALUES[value]
        if isinstance(value, (bool, int, float, np.number)):
            return float(value)
        raise TypeError(
            f"Score column {metric!r} holds a non-numeric value {value!r}; compare numeric scores (select a dict "
            "key as 'scorer/key' in samples_frame)."
        )

    return series.map(convert).astype(float)


def run_keys(samples: pd.DataFrame) -> list[str]:
    """The columns that identify one run of a sample: `seed` (when the frame has it) and `trial_id`."""
    return [c for c in ("seed", "trial_id") if c in samples.columns]


def per_sample_means(
    samples: pd.DataFrame, score: str, keys: Sequence[str] = ("arm", "config_id", "sample_id")
) -> pd.DataFrame:
    """`keys + [score, n_trials]`: the score averaged over the runs (trials, seeds) of each (configuration, sample);
    `n_trials` counts those runs."""
    keys, runs = list(keys), run_keys(samples)
    frame = samples[[*keys, *runs]].assign(_value=numeric_scores(samples[score], score))
    out = frame.groupby(keys, sort=True, dropna=False)["_value"].mean().rename(score).to_frame()
    out["n_trials"] = frame.drop_duplicates([*keys, *runs]).groupby(keys, sort=True, dropna=False).size()
    return out.reset_index()


def confidence_interval(
    diffs: np.ndarray, *, confidence: float = 0.95, method: str = "bootstrap", n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """The interval of mean(diffs): a percentile bootstrap over the pairs, or the normal approximation."""
    if diffs.size < 2:
        return math.nan, math.nan
    if method == "normal":
        mean, se = float(diffs.mean()), float(diffs.std(ddof=1) / math.sqrt(diffs.size))
        z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
        return mean - z * se, mean + z * se
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, diffs.size, size=(n_resamples, diffs.size))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def concept_interval(
    values: Mapping[str, Sequence[float] | np.ndarray],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """`(estimate, low, high)`: the mean over concepts of each concept's mean value, with a two-stage percentile
    bootstrap that resamples concepts and, within each drawn concept, its samples.

    `values` maps a concept to its per-sample values (paired differences or scores); every concept weighs the
    same whatever its sample count. The draws, from `numpy.random.default_rng(seed)`, in this order: a
    `(n_resamples, C)` matrix of concept picks over the sorted concept names; then, per concept in sorted order,
    an `(n_resamples, C, n_c)` array of sample picks, so slot `j` of resample `b` averages its concept's values
    at `[b, j, :]` (a concept drawn twice is resampled twice, independently).
    """
    names = sorted(values)
    arrays = [np.asarray(values[name], dtype=float) for name in names]
    empty = [name for name, array in zip(names, arrays, strict=True) if array.size == 0]
    if not names or empty:
        raise ValueError(f"concept_interval needs at least one value per concept; none for {empty or 'any concept'}.")
    estimate = float(np.mean([array.mean() for array in arrays]))
    count = len(names)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(n_resamples, count))
    slot_means = np.empty((count, n_resamples, count))
    for k, array in enumerate(arrays):
        slot_means[k] = array[rng.integers(0, array.size, size=(n_resamples, count, array.size))].mean(axis=2)
    replicate, slot = np.indices(picks.shape)
    means = slot_means[picks, replicate, slot].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return estimate, float(low), float(high)


def concept_deltas(
    samples: pd.DataFrame,
    scores: Sequence[str],
    *,
    baseline_config_id: str,
    by: Sequence[str] = ("arm_name",),
    group_cols: Sequence[str] = (),
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per (*by, *group_cols, metric), over the `concept` column: the mean over concepts of the arm's and the
    baseline's per-concept means and of the paired per-sample deltas, with the delta's `concept_interval`.

    Samples pair with the baseline within (concept, *group_cols, sample_id), after averaging each sample over its
    runs (`per_sample_means`). Columns: `*by, *group_cols, metric, n_concepts, n` (paired samples over all
    concepts), `arm_mean, baseline_mean, delta, ci_low, ci_high, confidence`; the baseline's own rows have delta 0.
    """
    by, group_cols = list(by), list(group_cols)
    rows = []
    for metric in scores:
        means = per_sample_means(samples, metric, keys=["concept", *by, "config_id", *group_cols, "sample_id"])
        base = means.loc[means["config_id"] == baseline_config_id, ["concept", *group_cols, "sample_id", metric]]
        paired = means.merge(base, on=["concept", *group_cols, "sample_id"], suffixes=("", "_base"))
        paired = paired.dropna(subset=[metric, f"{metric}_base"])
        paired = paired.assign(_diff=paired[metric] - paired[f"{metric}_base"])
        for group, frame in paired.groupby([*by, *group_cols], sort=True, dropna=False):
            per_concept = frame.groupby("concept", sort=True)
            estimate, low, high = concept_interval(
                {c: f["_diff"].to_numpy() for c, f in per_concept},
                confidence=confidence,
                n_resamples=n_resamples,
                seed=seed,
            )
            rows.append(
                {
                    **dict(zip([*by, *group_cols], group if isinstance(group, tuple) else (group,), strict=True)),
                    "metric": metric,
                    "n_concepts": per_concept.ngroups,
                    "n": len(frame),
                    "arm_mean": float(per_concept[metric].mean().mean()),
                    "baseline_mean": float(per_concept[f"{metric}_base"].mean().mean()),
                    "delta": estimate,
                    "ci_low": low,
                    "ci_high": high,
                    "confidence": confidence,
                }
            )
    columns = [*by, *group_cols, "metric", "n_concepts", "n", "arm_mean", "baseline_mean", "delta", "ci_low"]
    return pd.DataFrame(rows, columns=[*columns, "ci_high", "confidence"])


def _baseline_config_id(samples: pd.DataFrame, baseline: str) -> str:
    """The one config_id `baseline` names (an arm name or a config_id)."""
    is_base = samples["arm"] == baseline
    if not is_base.any():
        is_base = samples["config_id"] == baseline
    if not is_base.any():
        raise ValueError(
            f"Baseline {baseline!r} matches no arm or config_id; arms: {sorted(map(str, samples['arm'].unique()))}. "
            "Fix: pass baseline=<an arm name or config_id in the frame>."
        )
    ids = sorted(samples.loc[is_base, "config_id"].unique())
    if len(ids) > 1:
        raise ValueError(f"Baseline {baseline!r} spans several configurations {ids}. Fix: pass one config_id.")
    return ids[0]


def changed_share(samples: pd.DataFrame, baseline: str, group_cols: Sequence[str] = ("suite", "task")) -> pd.DataFrame:
    """Per (arm, config_id, *group_cols): `changed` (see the module docstring) and `n_changed` (paired samples).

    `samples` needs a `completion` column (`samples_frame(..., include_text=True)`); NaN where no trial pairs.
    """
    group_cols = list(group_cols)
    base_id = _baseline_config_id(samples, baseline)
    columns = ["arm", "config_id", *group_cols, "changed", "n_changed"]
    on = [*group_cols, "sample_id", *run_keys(samples)]
    base = samples.loc[samples["config_id"] == base_id, [*on, "completion"]]
    arms = samples[samples["config_id"] != base_id]
    paired = arms.merge(base, on=on, suffixes=("", "_base"))
    same = (paired["completion"] == paired["completion_base"]) | (
        paired["completion"].isna() & paired["completion_base"].isna()
    )  # two missing completions (failed samples) are not a change
    paired = paired.assign(_changed=(~same).astype(float))
    keys = ["arm", "config_id", *group_cols]
    per_sample = paired.groupby([*keys, "sample_id"], sort=True, dropna=False)["_changed"].mean().reset_index()
    out = (
        per_sample.groupby(keys, sort=True, dropna=False)
        .agg(changed=("_changed", "mean"), n_changed=("sample_id", "nunique"))
        .reset_index()
    )
    unpaired = arms[keys].drop_duplicates().merge(out[keys], how="left", indicator=True)
    unpaired = unpaired[unpaired["_merge"] == "left_only"].drop(columns="_merge")
    out = pd.concat([out, unpaired.assign(changed=math.nan, n_changed=0)], ignore_index=True)
    return out[columns].sort_values(keys, kind="stable").reset_index(drop=True)


def paired_deltas(
    samples: pd.DataFrame,
    scores: Sequence[str] | str,
    *,
    baseline: str = "baseline",
    confidence: float = 0.95,
    method: str = "bootstrap",
    n_resamples: int = 10_000,
    seed: int = 0,
    group_cols: Sequence[str] = ("suite", "task"),
    include_baseline: bool = False,
) -> pd.DataFrame:
    """Paired per-sample differences of every arm against the baseline, per (*group_cols, metric).

    Args:
        samples: a samples frame (`samples_frame`), possibly several tasks, suites, trials or seeds.
        scores: the numeric score columns to compare.
        baseline: the baseline, an arm name or a config_id.
        group_cols: the columns that split the comparison (a sample id is unique within one group).
        include_baseline: also give the baseline's own rows (paired with itself: delta 0, changed 0), so a table
            shows its means beside the arms'.

    Returns:
        One row per (arm, config_id, *group_cols, metric) with `DELTA_COLUMNS`: `n` paired samples, both means,
        `delta`, `ci_low`, `ci_high`, `se` (sd of the differences / sqrt(n)), the trials per sample of each side,
        `changed` (NaN without a `completion` column), `confidence` and `method`. Samples one side lacks are left
        out (and logged).
    """
    scores = [scores] if isinstance(scores, str) else list(scores)
    if not scores:
        raise ValueError("paired_deltas needs at least one score column, e.g. scores=['includes'].")
    if method not in DELTA_METHODS:
        raise ValueError(f"paired_deltas: method must be one of {DELTA_METHODS}; got {method!r}.")
    if not 0 < confidence < 1:
        raise ValueError(f"paired_deltas: confidence must be in (0, 1); got {confidence!r}.")
    group_cols = list(group_cols)
    missing = [c for c in ["arm", "config_id", "trial_id", "sample_id", *group_cols, *scores] if c not in samples]
    if missing:
        raise KeyError(f"paired_deltas: columns {missing} are missing from the samples frame.")
    base_id = _baseline_config_id(samples, baseline)
    keys = ["arm", "config_id", *group_cols]
    # the baseline as given: a config_id passed on would be re-read as an arm name first, maybe another arm's
    changed = changed_share(samples, baseline, group_cols) if "completion" in samples else None
    rows = []
    dropped_in: list[tuple[dict[str, Any], int]] = []
    for metric in scores:
        means = per_sample_means(samples, metric, keys=[*keys, "sample_id"])
        base = means[means["config_id"] == base_id].drop(columns=["arm", "config_id"])
        compared = means if include_baseline else means[means["config_id"] != base_id]
        for group, arm in compared.groupby(keys, sort=True, dropna=False):
            group_key = dict(zip(keys, group, strict=True))
            base_rows = base
            for column in group_cols:
                base_rows = base_rows[base_rows[column] == group_key[column]]
            paired = arm.merge(base_rows, on=[*group_cols, "sample_id"], suffixes=("", "_base"))
            paired = paired.dropna(subset=[metric, f"{metric}_base"])
            dropped = len(arm) + len(base_rows) - 2 * len(paired)
            if dropped:
                dropped_in.append((group_key, dropped))
            diffs = (paired[metric] - paired[f"{metric}_base"]).to_numpy(dtype=float)
            n = diffs.size
            low, high = confidence_interval(
                diffs, confidence=confidence, method=method, n_resamples=n_resamples, seed=seed
            )
            rows.append(
                {
                    **group_key,
                    "metric": metric,
                    "n": n,
                    "baseline_mean": float(paired[f"{metric}_base"].mean()) if n else math.nan,
                    "arm_mean": float(paired[metric].mean()) if n else math.nan,
                    "delta": float(diffs.mean()) if n else math.nan,
                    "ci_low": low,
                    "ci_high": high,
                    "se": float(diffs.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
                    "n_trials": int(paired["n_trials"].max()) if n else 0,
                    "n_trials_baseline": int(paired["n_trials_base"].max()) if n else 0,
                    "confidence": confidence,
                    "method": method,
                }
            )
    if dropped_in:  # one line for the call, not one per group and metric
        (first, count), groups = dropped_in[0], {str(group) for group, _ in dropped_in}
        logger.info(
            "paired_deltas: %d sample(s) not held by both sides are left out, in %d group(s) (first: %s: %d).",
            sum(n for _, n in dropped_in),
            len(groups),
            first,
            count,
        )
    out = pd.DataFrame(rows, columns=[*keys, *[c for c in DELTA_COLUMNS if c != "changed"]])
    if changed is not None and not out.empty:
        out = out.merge(changed[[*keys, "changed"]], on=keys, how="left")
        out.loc[out["config_id"] == base_id, "changed"] = 0.0
    else:
        out = out.assign(changed=math.nan)
    return out[[*keys, *DELTA_COLUMNS]]


def degenerate_rate(
    samples: pd.DataFrame,
    *,
    fluency: str | None = None,
    threshold: float = 0.5,
    is_degenerate: Callable[[str], bool] | None = None,
) -> pd.DataFrame:
    """Per (arm, config_id): `degenerate_rate`, the share of generations that are degenerate (module docstring)."""
    if fluency is not None:
        flags = pd.to_numeric(samples[fluency], errors="coerce") < threshold
    elif is_degenerate is not None:
        flags = samples["completion"].fillna("").map(is_degenerate).astype(bool)
    else:
        raise ValueError("degenerate_rate needs fluency=<score column> or is_degenerate=<function of the text>.")
    frame = samples[["arm", "config_id"]].assign(_flag=flags.astype(float))
    out = frame.groupby(["arm", "config_id"], sort=True)["_flag"].mean().rename("degenerate_rate")
    return out.reset_index()


# ---------------------------------------------------------------------------------------------- agreement
AGREEMENT_COLUMNS = ("criterion", "rule", "judge", "n", "spearman")


def spearman(x: pd.Series, y: pd.Series) -> float:
    """Spearman's rank correlation of two aligned score series: the Pearson correlation of their ranks (ties share
    their average rank), over the positions where both are numbers; NaN with fewer than 3 such pairs or when one
    side is constant there."""
    both = pd.DataFrame({"x": x.to_numpy(dtype=float), "y": y.to_numpy(dtype=float)}).dropna()
    if len(both) < 3:
        return math.nan
    rx = both["x"].rank(method="average").to_numpy()
    ry = both["y"].rank(method="average").to_numpy()
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    return float((dx * dy).sum()) / denominator if denominator > 0 else math.nan


def agreement(frame: pd.DataFrame, pairs: dict[str, tuple[str, str]]) -> pd.DataFrame:
    """How well two scorings of the same samples agree, per criterion: Spearman's rank correlation (`spearman`)
    between a rule score column and a judge score column, over the rows where both are numbers (`n`; an unscored
    judge rating, NaN, leaves its row out).

    `pairs` maps a criterion to `(rule column, judge column)` of `frame` (a samples frame); a column the frame
    lacks gives `n` 0 and NaN. Returns one row per criterion with `AGREEMENT_COLUMNS`.
    """
    rows = []
    for criterion, (rule, judge) in pairs.items():
        if rule in frame.columns and judge in frame.columns:
            x, y = numeric_scores(frame[rule], rule), numeric_scores(frame[judge], judge)
            n = int((x.notna() & y.notna()).sum())
            rho = spearman(x, y)
        else:
            n, rho = 0, math.nan
        rows.append({"criterion": criterion, "rule": rule, "judge": judge, "n": n, "spearman": rho})
    return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))
