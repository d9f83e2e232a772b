"""Results of one save_dir (or several, one per seed) as metrics, per-sample tables and paired deltas, plus plots."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from steer_hydra.evaluation.frames import paired_deltas, results_from_logs, samples_frame

logger = logging.getLogger(__name__)


def metric_name(suite: str, task: str, scorer: str, metric: str) -> str:
    """`<suite>/<task>/<scorer>/<metric>`; a task's own `/` (registry names) becomes `.` to keep four parts."""
    return "/".join([suite, task.replace("/", "."), scorer, metric])


def summary_metrics(results: pd.DataFrame) -> dict[str, float]:
    """Each (suite, task, scorer, metric) averaged over configurations' trials, named by `metric_name`."""
    if results.empty:
        return {}
    means = results.groupby(["suite", "task", "scorer", "metric"], sort=True)["value"].mean()
    return {metric_name(*key): float(value) for key, value in means.items() if value is not None}


def headline(results: pd.DataFrame) -> float:
    """The mean over tasks of each task's first non-stderr metric (the value a sweeper can optimise)."""
    values = []
    for _, rows in results.groupby(["suite", "task"], sort=True):
        main = rows[~rows["metric"].isin(["stderr", "std"])]
        if not main.empty:
            values.append(float(main.iloc[0]["value"]))
    return float(sum(values) / len(values)) if values else math.nan


def scorers_by_task(results: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """`{(suite, task): [scorer, ...]}` in first-seen order."""
    out: dict[tuple[str, str], list[str]] = {}
    for row in results[["suite", "task", "scorer"]].drop_duplicates().itertuples(index=False):
        out.setdefault((row.suite, row.task), []).append(row.scorer)
    return out


def task_samples(results: pd.DataFrame, log_root: Path, *, include_text: bool = False) -> list[pd.DataFrame]:
    """One samples frame per (suite, task), with that task's scorers as score columns."""
    frames = []
    for (suite, task), scorers in scorers_by_task(results).items():
        frames.append(
            samples_frame(results, log_root, scores=scorers, suite=suite, task=task, include_text=include_text)
        )
    return frames


def long_samples(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Task sample frames stacked in long form: one row per (sample, scorer) with a `score` column."""
    id_cols = ["pipeline", "config_id", "trial_id", "seed", "suite", "task", "sample_id"]
    parts = []
    for frame in frames:
        extra = [c for c in ("input", "completion") if c in frame.columns]
        scores = [c for c in frame.columns if c not in id_cols + extra]
        parts.append(frame.melt(id_vars=id_cols + extra, value_vars=scores, var_name="scorer", value_name="score"))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def deltas_for(frames: Sequence[pd.DataFrame], baseline: str) -> pd.DataFrame:
    """Paired deltas of every arm against `baseline`, per (suite, task, scorer), over the given sample frames."""
    id_cols = {"pipeline", "config_id", "trial_id", "seed", "suite", "task", "sample_id", "input", "completion"}
    out = []
    for frame in frames:
        if frame.empty or not (frame["pipeline"] == baseline).any() or frame["pipeline"].nunique() < 2:
            continue
        scores = [c for c in frame.columns if c not in id_cols]
        out.append(paired_deltas(frame, scores, baseline=baseline))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def pooled_samples(save_dirs: Mapping[str, Path], names: Mapping[str, str]) -> list[pd.DataFrame]:
    """Sample frames of every task over several save_dirs (one per seed), trials renamed `<seed>/<trial>`.

    Seeds act as further trials of the same samples: `paired_deltas` averages a sample over all of them.
    """
    by_task: dict[tuple[str, str], list[pd.DataFrame]] = {}
    for seed, save_dir in save_dirs.items():
        results = results_from_logs(save_dir, names)
        if results.empty:
            continue
        results = results.assign(trial=results["trial"].map(lambda t, s=seed: f"{s}/{t}"))
        for frame in task_samples(results, save_dir):
            key = (frame["suite"].iloc[0], frame["task"].iloc[0]) if len(frame) else None
            if key is not None:
                by_task.setdefault(key, []).append(frame)
    return [pd.concat(frames, ignore_index=True) for frames in by_task.values()]


def plot_job(results: pd.DataFrame, deltas: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """The job's plots as PNGs: headline metric per task for each arm in `results`, and deltas with CIs."""
    from steer_hydra.evaluation.plotting import plot_comparison_bars, plot_paired_deltas

    paths: dict[str, Path] = {}
    main = results[~results["metric"].isin(["stderr", "std"])]
    if not main.empty:
        table = (
            main.assign(label=main["task"].str.split("/").str[-1] + "/" + main["scorer"] + "/" + main["metric"])
            .groupby(["label", "config"], sort=True)["value"]
            .agg(["mean", "std"])
            .reset_index()
            .pivot(index="label", columns="config")
        )
        frame = pd.DataFrame({"label": table.index})
        arms = sorted({c for _, c in table.columns})
        for arm in arms:
            frame[f"{arm}_mean"] = table[("mean", arm)].to_numpy()
            frame[f"{arm}_std"] = table[("std", arm)].fillna(0.0).to_numpy()
        paths["metrics"] = out_dir / "metrics.png"
        plot_comparison_bars(frame, arms, group_col="label", ylabel="score", save_path=paths["metrics"])
    if not deltas.empty:
        paths["paired_deltas"] = out_dir / "paired_deltas.png"
        plot_paired_deltas(deltas, title="paired delta vs baseline", save_path=paths["paired_deltas"])
    _close_figures()
    return paths


def _close_figures() -> None:
    import matplotlib.pyplot as plt

    plt.close("all")
