"""Results of one save_dir (or several, one per seed) as metrics, per-sample tables and paired deltas, plus plots.

The app's column vocabulary (every CSV, job record and W&B key it writes): `arm` (the display name), `config_id`
(the key every selection and join uses), `trial_id`, `seed` (the job's base seed, the `seed=` override) and
`trial_seed` (the seed derived per configuration and trial). `app_columns` renames the library frames to it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.app.tracking import wandb_key
from steer_hydra.evaluation.deltas import paired_deltas
from steer_hydra.evaluation.logs import cells_from_logs, samples_frame

logger = logging.getLogger(__name__)

ID_COLUMNS = ("pipeline", "config_id", "trial_id", "seed", "suite", "task", "sample_id", "input", "completion")
_RENAMES = {"config": "arm", "pipeline": "arm", "trial": "trial_id", "seed": "trial_seed"}


def app_columns(frame: pd.DataFrame, *, seed: Any = None) -> pd.DataFrame:
    """A library frame in the app's vocabulary: `arm, config_id, [trial_id, seed, trial_seed,] ...`.

    `seed` (the base seed) is added after `trial_id` (or `config_id`) when given.
    """
    out = frame.rename(columns={k: v for k, v in _RENAMES.items() if k in frame.columns})
    if seed is not None and "seed" not in out.columns:
        anchor = "trial_id" if "trial_id" in out.columns else "config_id"
        out.insert(list(out.columns).index(anchor) + 1 if anchor in out.columns else 0, "seed", seed)
    return out


def metric_name(suite: str, task: str, scorer: str, metric: str) -> str:
    """`<suite>/<task>/<scorer>/<metric>` (`tracking.wandb_key`); a task's own `/` becomes `.` (four parts)."""
    return wandb_key(None, suite, task, scorer, metric)


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


def select_cells(
    save_dir: Path, config_ids: Collection[str], names: Mapping[str, str], *, suite: str | None = None
) -> pd.DataFrame:
    """The cells of exactly `config_ids` in `save_dir` (of one suite when given): the one place results are selected."""
    cells = cells_from_logs(save_dir, names, config_ids=config_ids)
    return cells[cells["suite"] == suite].reset_index(drop=True) if suite is not None else cells


def task_samples(cells: pd.DataFrame, log_root: Path, *, include_text: bool = False) -> list[pd.DataFrame]:
    """One samples frame per (suite, task) of `cells` (a cells or results frame), every scorer the logs hold."""
    keys = cells[["suite", "task"]].drop_duplicates().itertuples(index=False)
    return [
        samples_frame(cells, log_root, scores=None, suite=k.suite, task=k.task, include_text=include_text) for k in keys
    ]


def score_columns(frame: pd.DataFrame) -> list[str]:
    """The score columns of a samples frame (everything that is not an id, text or metadata column)."""
    return [c for c in frame.columns if c not in ID_COLUMNS]


def long_samples(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Task sample frames stacked in long form: one row per (sample, scorer) with a `score` column."""
    parts = []
    for frame in frames:
        ids = [c for c in ID_COLUMNS if c in frame.columns]
        scores = score_columns(frame)
        if scores:
            parts.append(frame.melt(id_vars=ids, value_vars=scores, var_name="scorer", value_name="score"))
        else:  # an unscored run: its samples, no scores
            parts.append(frame.assign(scorer=None, score=None))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _numeric(frame: pd.DataFrame, column: str) -> bool:
    values = frame[column].dropna()
    return not values.empty and all(isinstance(v, (bool, int, float)) for v in values)


def deltas_for(frames: Sequence[pd.DataFrame], baseline_config_id: str) -> pd.DataFrame:
    """Paired deltas of every configuration against `baseline_config_id`, per (suite, task, numeric scorer)."""
    out = []
    for frame in frames:
        if frame.empty or not (frame["config_id"] == baseline_config_id).any() or frame["config_id"].nunique() < 2:
            continue
        scores = [c for c in score_columns(frame) if _numeric(frame, c)]
        if scores:
            out.append(paired_deltas(frame, scores, baseline=baseline_config_id))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def tasks_without_baseline(cells: pd.DataFrame, baseline_config_id: str) -> list[str]:
    """`suite/task` of every task some configuration in `cells` holds and the baseline does not (yet)."""
    held = cells[["suite", "task"]].drop_duplicates()
    base = cells.loc[cells["config_id"] == baseline_config_id, ["suite", "task"]].drop_duplicates()
    missing = held.merge(base, how="left", indicator=True)
    return sorted(f"{r.suite}/{r.task}" for r in missing[missing["_merge"] == "left_only"].itertuples(index=False))


def pooled_samples(
    save_dirs: Mapping[str, Path],
    names: Mapping[str, str],
    config_ids: Collection[str],
    *,
    suite: str,
    include_text: bool = False,
) -> tuple[list[pd.DataFrame], pd.DataFrame]:
    """Sample frames of each task of `suite` over several save_dirs (one per seed), only `config_ids`, trials
    renamed `<seed>/<trial>`; and the cells they came from.

    Seeds act as further trials of the same samples: `paired_deltas` averages a sample over all of them.
    """
    by_task: dict[tuple[str, str], list[pd.DataFrame]] = {}
    all_cells = []
    for seed, save_dir in save_dirs.items():
        cells = select_cells(save_dir, config_ids, names, suite=suite)
        if cells.empty:
            continue
        all_cells.append(cells)
        cells = cells.assign(trial=cells["trial"].map(lambda t, s=seed: f"{s}/{t}"))
        for frame in task_samples(cells, save_dir, include_text=include_text):
            if len(frame):
                by_task.setdefault((frame["suite"].iloc[0], frame["task"].iloc[0]), []).append(frame)
    cells = (
        pd.concat(all_cells, ignore_index=True) if all_cells else pd.DataFrame(columns=["config_id", "suite", "task"])
    )
    return [pd.concat(frames, ignore_index=True) for frames in by_task.values()], cells


def plot_job(
    results: pd.DataFrame, deltas: pd.DataFrame, out_dir: Path, *, model: str | None = None
) -> dict[str, Path]:
    """The plots as PNGs: headline metric per task for each arm in `results` (column `arm`) with the scorer's
    stderr (the spread over runs when no stderr was reported), and the paired deltas with their CIs; titles name
    the suite(s), the model and `n`."""
    from steer_hydra.evaluation.plotting import plot_comparison_bars, plot_paired_deltas

    paths: dict[str, Path] = {}
    results = app_columns(results)
    suites = ", ".join(sorted(map(str, results["suite"].unique()))) if "suite" in results.columns else ""
    context = " · ".join(
        part for part in (f"suite {suites}" if suites else "", f"model {model}" if model else "") if part
    )
    main = results[~results["metric"].isin(["stderr", "std"])]
    if not main.empty:
        label = main["task"].str.split("/").str[-1] + "/" + main["scorer"] + "/" + main["metric"]
        table = (
            main.assign(label=label)
            .groupby(["label", "arm"], sort=True)["value"]
            .agg(["mean", "std"])
            .reset_index()
            .pivot(index="label", columns="arm")
        )
        stderr = results[results["metric"] == "stderr"]
        stderr = (
            stderr.assign(label=stderr["task"].str.split("/").str[-1] + "/" + stderr["scorer"])
            .groupby(["label", "arm"])["value"]
            .mean()
        )
        frame = pd.DataFrame({"label": table.index})
        arms = sorted({c for _, c in table.columns})
        for arm in arms:
            frame[f"{arm}_mean"] = table[("mean", arm)].to_numpy()
            errors = [stderr.get(("/".join(str(i).split("/")[:2]), arm)) for i in table.index]
            spread = table[("std", arm)].fillna(0.0).to_numpy()
            frame[f"{arm}_std"] = [s if e is None or pd.isna(e) else e for e, s in zip(errors, spread, strict=True)]
        n = int(pd.to_numeric(main["n"], errors="coerce").max()) if "n" in main.columns and len(main) else None
        title = " · ".join(part for part in (context, f"n={n} per task" if n else "") if part)
        paths["metrics"] = out_dir / "metrics.png"
        plot_comparison_bars(
            frame, arms, group_col="label", ylabel="score", title=title, error_label="stderr",
            save_path=paths["metrics"],
        )  # fmt: skip
    if not deltas.empty:
        paths["paired_deltas"] = out_dir / "paired_deltas.png"
        label = "arm" if "arm" in deltas.columns else "pipeline"
        title = "paired delta vs baseline" + (f" · {context}" if context else "")
        plot_paired_deltas(deltas, label_col=label, title=title, save_path=paths["paired_deltas"])
    _close_figures()
    return paths


def _close_figures() -> None:
    import matplotlib.pyplot as plt

    plt.close("all")
