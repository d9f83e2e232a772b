"""The one results path of a job, a sweep, a rescore and the study: select cells, read their samples, paired
statistics, the results table, files and plots, each step once.

How it runs: a `CellSelection` names exactly the cells compared (configurations by `config_id`, the baseline, one
suite, the trials, one save_dir per seed); `compare(selection)` reads their metrics and samples from the Inspect
logs (`analysis.logs`) and computes the paired deltas vs the baseline (`analysis.stats`, which also owns the
changed share) and the results table (`table.results_table`); `write_files` writes the CSVs and plots
(the app logs the same to W&B). The job compares its own configuration with the
baseline in its save_dir; the sweep compares its configurations per (model, suite), pooling seeds as further
trials; both are short compositions of these steps. Other configurations evaluated into the same save_dirs never
appear, and neither do trials outside `trial_ids`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.analysis.frames import SAMPLE_ID_COLUMNS, cells_frame, results_frame
from steer_hydra.analysis.logs import arm_names, failed_samples, logged_records, task_samples
from steer_hydra.analysis.stats import paired_deltas
from steer_hydra.analysis.table import SPREAD_METRICS, results_table
from steer_hydra.core.files import write_csv

TEXT_COLUMNS = ("input", "completion", "target", "error")  # per-sample text that is never a score


@dataclass(frozen=True)
class CellSelection:
    """The cells one comparison reads: `config_ids` (the baseline's included) of `suite`, trials `trial_ids` (None:
    every trial), in each seed's save_dir. `names` maps config_id to the arm shown (default: the save_dir's
    configuration records); `model` labels the rows."""

    save_dirs: Mapping[Any, Path]
    config_ids: Collection[str]
    baseline_config_id: str
    suite: str
    model: str
    trial_ids: Collection[int] | None = None
    names: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_ids", tuple(dict.fromkeys([*self.config_ids, self.baseline_config_id])))


@dataclass
class Comparison:
    """What `compare` read and computed: results rows, per-task sample frames, paired deltas and the table, every
    row labelled with its `model`; `combine` stacks several (a sweep's models and suites)."""

    cells: list[tuple[Path, pd.DataFrame]]  # (save_dir, its selected cells)
    results: pd.DataFrame
    frames: list[pd.DataFrame]
    deltas: pd.DataFrame
    table: pd.DataFrame
    tasks_without_baseline: list[str]

    def samples(self, config_id: str | None = None) -> pd.DataFrame:
        """The per-sample rows in long form (one row per sample and scorer, a `score` column), of one configuration
        when given."""
        frames = [f[f["config_id"] == config_id] for f in self.frames] if config_id is not None else self.frames
        return long_samples([f for f in frames if not f.empty])

    def failed(self, config_id: str) -> pd.DataFrame:
        """The failed samples of one configuration (`analysis.logs.failed_samples`)."""
        parts = [failed_samples(cells[cells["config_id"] == config_id], save_dir) for save_dir, cells in self.cells]
        parts = [p for p in parts if not p.empty]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*SAMPLE_ID_COLUMNS, "error"])

    @classmethod
    def combine(cls, parts: Sequence[Comparison]) -> Comparison:
        """One comparison holding every part's rows (tables keep their own baselines)."""

        def stack(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
            frames = [f for f in frames if not f.empty]
            return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

        return cls(
            cells=[cell for part in parts for cell in part.cells],
            results=stack([p.results for p in parts]),
            frames=[frame for part in parts for frame in part.frames],
            deltas=stack([p.deltas for p in parts]),
            table=stack([p.table for p in parts]),
            tasks_without_baseline=[task for part in parts for task in part.tasks_without_baseline],
        )


def _selected(frame: pd.DataFrame, selection: CellSelection) -> pd.DataFrame:
    """The rows of a cells or results frame that `selection` names: its suite and trials (the one place results
    are selected; configurations are selected when the logs are read)."""
    keep = frame["suite"] == selection.suite
    if selection.trial_ids is not None:
        keep &= frame["trial_id"].isin(list(selection.trial_ids))
    return frame[keep].reset_index(drop=True)


def cell_samples(
    save_dir: str | Path,
    *,
    config_ids: Collection[str],
    suites: Collection[str],
    trial_ids: Collection[int] | None = None,
    names: Mapping[str, str] | None = None,
    seed: Any = None,
) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """The cells of `config_ids` x `suites` (x `trial_ids`, None: every trial) in a save_dir, as a cells frame, and
    their per-(suite, task) sample frames with every scorer: the one way a job, a sweep, a rescore and the study
    read samples."""
    records = logged_records(save_dir, names, seed=seed, config_ids=config_ids, suites=suites)
    return _cell_samples(records, save_dir, trial_ids)


def _cell_samples(
    records: Mapping[str, Any], save_dir: str | Path, trial_ids: Collection[int] | None
) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """`cell_samples` of records read already (`logs.logged_records`)."""
    cells = cells_frame(records)
    if trial_ids is not None and not cells.empty:
        cells = cells[cells["trial_id"].isin(list(trial_ids))].reset_index(drop=True)
    return cells, ([f for f in task_samples(cells, Path(save_dir)) if not f.empty] if not cells.empty else [])


def compare(selection: CellSelection) -> Comparison:
    """Read the selected cells' metrics and samples, pair every configuration with the baseline per task."""
    cells_by_dir, results, by_task = [], [], {}
    for seed, save_dir in selection.save_dirs.items():
        names = {**arm_names(save_dir), **selection.names}
        read = {"config_ids": selection.config_ids, "suites": [selection.suite]}
        records = logged_records(save_dir, names, seed=seed, **read)  # the selected cells' logs, read once
        cells, samples = _cell_samples(records, save_dir, selection.trial_ids)
        if cells.empty:
            continue
        cells_by_dir.append((save_dir, cells))
        results.append(_selected(results_frame(records), selection))
        for frame in samples:
            frame = frame.assign(model=selection.model)
            by_task.setdefault((frame["suite"].iloc[0], frame["task"].iloc[0]), []).append(frame)
    found = pd.concat(results, ignore_index=True) if results else pd.DataFrame(columns=["suite", "task"])
    found = found.assign(model=selection.model)
    frames = [pd.concat(parts, ignore_index=True) for parts in by_task.values()]
    base = selection.baseline_config_id
    deltas = pd.concat([d for d in (_deltas(f, base) for f in frames) if not d.empty] or [pd.DataFrame()])
    if not deltas.empty:
        seeds = ",".join(sorted(map(str, selection.save_dirs)))
        deltas = deltas.assign(model=selection.model, seeds=seeds).reset_index(drop=True)
    return Comparison(
        cells=cells_by_dir,
        results=found,
        frames=frames,
        deltas=deltas,
        table=results_table(found, deltas, base),
        tasks_without_baseline=_tasks_without_baseline(found, base),
    )


def _deltas(frame: pd.DataFrame, baseline_config_id: str) -> pd.DataFrame:
    """Paired deltas of one task's sample frame on its numeric score columns (empty without a baseline)."""
    if frame.empty or frame["config_id"].nunique() < 2 or not (frame["config_id"] == baseline_config_id).any():
        return pd.DataFrame()
    scores = numeric_score_columns(frame)
    return paired_deltas(frame, scores, baseline=baseline_config_id) if scores else pd.DataFrame()


def _tasks_without_baseline(results: pd.DataFrame, baseline_config_id: str) -> list[str]:
    """`suite/task` of every task some configuration holds and the baseline does not (yet)."""
    if results.empty:
        return []
    held = results[["suite", "task"]].drop_duplicates()
    base = results.loc[results["config_id"] == baseline_config_id, ["suite", "task"]].drop_duplicates()
    missing = held.merge(base, how="left", indicator=True)
    return sorted(f"{r.suite}/{r.task}" for r in missing[missing["_merge"] == "left_only"].itertuples(index=False))


def score_columns(frame: pd.DataFrame, *, labels: Collection[str] = ()) -> list[str]:
    """The score columns of a samples frame: every column but the ids, the text and the `labels` a caller added
    (the one rule for which columns are scores)."""
    return [c for c in frame.columns if c not in (*SAMPLE_ID_COLUMNS, *TEXT_COLUMNS, "model", *labels)]


def numeric_score_columns(frame: pd.DataFrame, *, labels: Collection[str] = ()) -> list[str]:
    """The score columns (`score_columns`) whose present values are all numbers: what paired statistics compare."""
    return [c for c in score_columns(frame, labels=labels) if _numeric(frame[c])]


def _numeric(values: pd.Series) -> bool:
    present = values.dropna()
    return not present.empty and all(isinstance(v, (bool, int, float)) for v in present)


def long_samples(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Task sample frames stacked in long form: one row per (sample, scorer) with a `score` column."""
    parts = []
    for frame in frames:
        ids = [c for c in (*SAMPLE_ID_COLUMNS, "model", *TEXT_COLUMNS) if c in frame.columns]
        scores = score_columns(frame)
        if scores:
            parts.append(frame.melt(id_vars=ids, value_vars=scores, var_name="scorer", value_name="score"))
        else:  # an unscored run: its samples, no scores
            parts.append(frame.assign(scorer=None, score=None))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*SAMPLE_ID_COLUMNS, "scorer"])


# ------------------------------------------------------------------------------------------ headline, files
def headline(results: pd.DataFrame) -> float:
    """The mean over tasks of each task's first non-spread metric (the value a sweeper can optimise)."""
    values = []
    for _, rows in results.groupby(["suite", "task"], sort=True):
        main = rows[~rows["metric"].isin(SPREAD_METRICS)]
        if not main.empty:
            values.append(float(main["value"].iloc[0]))
    return float(sum(values) / len(values)) if values else math.nan


def write_files(
    comparison: Comparison, out_dir: Path, *, own_config_id: str | None = None, plots: bool = True
) -> dict[str, Path]:
    """Write the comparison's files into `out_dir`: `results.csv`, `samples.csv`, `failed_samples.csv` (of
    `own_config_id` when given, else every configuration), `paired_deltas.csv`, `results_table.csv` and, when
    `plots`, the plots. Returns every file written, by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = comparison.results
    own = results if own_config_id is None else results[results["config_id"] == own_config_id]
    files = {"results": out_dir / "results.csv", "samples": out_dir / "samples.csv"}
    write_csv(own.reset_index(drop=True), files["results"])
    write_csv(comparison.samples(own_config_id), files["samples"])
    if own_config_id is not None:
        failures = comparison.failed(own_config_id)
        if not failures.empty:
            files["failed_samples"] = out_dir / "failed_samples.csv"
            write_csv(failures, files["failed_samples"])
    if not comparison.deltas.empty:
        files["paired_deltas"] = out_dir / "paired_deltas.csv"
        write_csv(comparison.deltas, files["paired_deltas"])
    files["results_table"] = out_dir / "results_table.csv"
    write_csv(comparison.table, files["results_table"])
    drawn = plot_comparison(results, comparison.deltas, out_dir) if plots else {}
    return {**files, **{f"plot_{name}": path for name, path in drawn.items()}}


def plot_comparison(results: pd.DataFrame, deltas: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """The plots as PNGs: the headline metric per task for each arm with the scorer's stderr (the spread over runs
    when no stderr was reported), and the paired deltas with their CIs; titles name the suite(s), the model, `n`."""
    from steer_hydra.analysis.plotting import plot_comparison_bars, plot_paired_deltas

    paths: dict[str, Path] = {}
    suites = ", ".join(sorted(map(str, results["suite"].unique()))) if "suite" in results.columns else ""
    model = ", ".join(sorted(map(str, results["model"].unique()))) if "model" in results.columns else ""
    context = " · ".join(p for p in (f"suite {suites}" if suites else "", f"model {model}" if model else "") if p)
    main = results[~results["metric"].isin(SPREAD_METRICS)] if not results.empty else results
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
        n = int(pd.to_numeric(main["n"], errors="coerce").max()) if "n" in main.columns else None
        full = " · ".join(part for part in (context, f"n={n} per task" if n else "") if part)
        paths["metrics"] = out_dir / "metrics.png"
        plot_comparison_bars(
            frame, arms, group_col="label", ylabel="score", title=full, error_label="stderr", save_path=paths["metrics"]
        )
    if not deltas.empty:
        paths["paired_deltas"] = out_dir / "paired_deltas.png"
        title = "paired delta vs baseline" + (f" · {context}" if context else "")
        plot_paired_deltas(deltas, label_col="arm", title=title, save_path=paths["paired_deltas"])
    _close_figures()
    return paths


def _close_figures() -> None:
    import matplotlib.pyplot as plt

    plt.close("all")
