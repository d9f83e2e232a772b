"""The study's report: its per-sample frame, test statistics at the chosen strengths, capability costs, its files.

How it runs: `study_frame(save_dir)` reads every configuration's samples from a study's save_dir (the results
path's reader, `evaluation.logs.task_samples`) and adds `arm_name` (the arm's YAML name: the method), `strength`
(for swept arms) and `split`. `write_study` chooses each method's strength on dev (`selection.select_strengths`),
then reports each arm at that strength on test (`report_selected`) and on the cost suites' tasks
(`report_costs`), with the one statistics module (`evaluation.stats.paired_deltas`, baseline rows included, plus
the degenerate rate), and writes `selection.csv`, `study_results.csv`, `capability_costs.csv`, `selection.json`
(the objective, the choices and both splits' sample ids: the provenance of the choice) and `study_deltas.png`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.core.files import write_csv, write_json
from steer_hydra.evaluation.frames import SAMPLE_ID_COLUMNS
from steer_hydra.evaluation.logs import config_records, results_from_logs, task_samples
from steer_hydra.evaluation.stats import degenerate_rate, paired_deltas
from steer_hydra.study.selection import Objective, at_chosen_strength, dev_test, select_strengths, strength_of

logger = logging.getLogger(__name__)

STUDY_SCORES = ("concept_score", "instruction_score", "fluency_score", "concept_harmonic")
NOT_SCORES = frozenset({*SAMPLE_ID_COLUMNS, "input", "completion", "arm_name", "strength", "split", "target", "error"})


def study_frame(save_dir: str | Path, *, split_of: Mapping[str, str], swept: Sequence[str] = ()) -> pd.DataFrame:
    """Per-sample rows of every configuration in `save_dir`, with `arm_name`, `strength` (arms in `swept`) and
    `split` (`split_of` maps sample ids to their split; samples of other tasks get `other`)."""
    save_dir = Path(save_dir)
    frames = [f for f in task_samples(results_from_logs(save_dir), save_dir) if not f.empty]
    if not frames:
        raise ValueError(f"study_frame: no evaluated samples under {save_dir}.")
    samples = pd.concat(frames, ignore_index=True)
    records = config_records(save_dir)
    names = {cid: r.get("arm_name") or str(r["arm"]).split("@")[0] for cid, r in records.items()}
    strengths = {cid: strength_of(r.get("controls")) for cid, r in records.items() if names[cid] in swept}
    return samples.assign(
        arm_name=samples["config_id"].map(names).fillna(samples["arm"].str.split("@").str[0]),
        strength=samples["config_id"].map(strengths).astype(float),
        split=samples["sample_id"].map(lambda i: split_of.get(str(i), "other")),
    )


def _statistics(selected: pd.DataFrame, scores: Sequence[str], baseline: str, **kwargs: Any) -> pd.DataFrame:
    """Paired deltas of every arm of `selected` (baseline rows included), with `arm_name` and `strength`."""
    base_ids = sorted(selected.loc[selected["arm_name"] == baseline, "config_id"].unique())
    if len(base_ids) != 1:
        raise ValueError(f"The baseline {baseline!r} must be one configuration; got {base_ids}.")
    stats = paired_deltas(selected, list(scores), baseline=base_ids[0], include_baseline=True, **kwargs)
    by_config = selected.groupby("config_id")
    return stats.assign(
        arm_name=stats["config_id"].map(by_config["arm_name"].first()),
        strength=stats["config_id"].map(by_config["strength"].first()),
    )


def report_selected(
    test: pd.DataFrame,
    choices: pd.DataFrame,
    scores: Sequence[str],
    *,
    baseline: str = "baseline",
    fluency: str | None = "fluency_score",
    n_resamples: int = 10_000,
) -> pd.DataFrame:
    """Statistics on test of each arm at its chosen strength (arms without a strength as they are), with each
    arm's `degenerate_rate` when the frame has the `fluency` column."""
    if "split" in test and not (test["split"] == "test").all():
        raise ValueError("report_selected reads test rows only. Fix: pass frame[split=='test'].")
    selected = at_chosen_strength(test, choices, baseline=baseline)
    stats = _statistics(selected, scores, baseline, group_cols=(), n_resamples=n_resamples)
    if fluency is not None and fluency in selected:
        stats = stats.merge(degenerate_rate(selected, fluency=fluency), on=["arm", "config_id"], how="left")
    return stats


def report_costs(
    samples: pd.DataFrame,
    choices: pd.DataFrame,
    *,
    suites: Sequence[str],
    baseline: str = "baseline",
    n_resamples: int = 10_000,
) -> pd.DataFrame:
    """Capability costs: per task of `suites`, each arm at its chosen strength vs the baseline (paired by sample),
    on every numeric score the task's logs hold."""
    out = []
    for (suite, task), frame in samples[samples["suite"].isin(list(suites))].groupby(["suite", "task"], sort=True):
        selected = at_chosen_strength(frame, choices, baseline=baseline)
        scores = [
            c
            for c in selected.columns
            if c not in NOT_SCORES and pd.to_numeric(selected[c], errors="coerce").notna().any()
        ]
        try:
            out.append(_statistics(selected, scores, baseline, n_resamples=n_resamples))
        except ValueError as error:
            logger.warning("Capability costs of %s/%s skipped: %s", suite, task, error)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def write_study(
    samples: pd.DataFrame,
    out_dir: str | Path,
    *,
    objective: Objective,
    scores: Sequence[str] = STUDY_SCORES,
    follows: Mapping[str, str] | None = None,
    baseline: str = "baseline",
    task: str | None = None,
    strengths: Sequence[float] | None = None,
    cost_suites: Sequence[str] = (),
) -> dict[str, Any]:
    """Select on dev, report on test (and the costs on `cost_suites`); write the study's files into `out_dir`.

    `strengths` (the study's grid) restricts the dev candidates (a save_dir may hold other strengths from earlier
    runs). Returns the choices, results, costs, provenance and the paths written.
    """
    out_dir = Path(out_dir)
    dev, test = dev_test(samples, task=task, strengths=strengths)
    choices = select_strengths(dev, objective, follows=follows)
    results = report_selected(test, choices, scores, baseline=baseline)
    costs = report_costs(samples, choices, suites=cost_suites, baseline=baseline) if cost_suites else pd.DataFrame()
    provenance = {
        "objective": asdict(objective),
        "follows": dict(follows or {}),
        "choices": choices.to_dict(orient="records"),
        "dev_sample_ids": sorted(map(str, dev["sample_id"].unique())),
        "test_sample_ids": sorted(map(str, test["sample_id"].unique())),
    }
    paths = {name: out_dir / f"{name}.csv" for name in ("selection", "study_results")}
    write_csv(choices, paths["selection"])
    write_csv(results, paths["study_results"])
    if not costs.empty:
        paths["capability_costs"] = out_dir / "capability_costs.csv"
        write_csv(costs, paths["capability_costs"])
    paths["provenance"] = out_dir / "selection.json"
    write_json(paths["provenance"], provenance)
    paths["plot_study_deltas"] = plot_study(results, out_dir / "study_deltas.png", baseline=baseline)
    logger.info(
        "Strength selection on %d dev samples; results on %d test samples in %s",
        dev["sample_id"].nunique(),
        test["sample_id"].nunique(),
        out_dir,
    )
    return {"choices": choices, "results": results, "costs": costs, "provenance": provenance, "paths": paths}


def _label(row: Any) -> str:
    """`name@strength` (`name` for an unswept arm)."""
    return f"{row.arm_name}{'' if pd.isna(row.strength) else f'@{row.strength:g}'}"


def plot_study(results: pd.DataFrame, path: Path, *, baseline: str = "baseline") -> Path:
    """Each arm's test delta with its CI per metric; labels carry the strength, changed and degenerate rates."""
    import matplotlib.pyplot as plt

    from steer_hydra.evaluation.plotting import plot_paired_deltas

    rows = results[results["arm_name"] != baseline].copy()
    degenerate = rows.get("degenerate_rate", pd.Series(math.nan, index=rows.index))
    rows["label"] = [
        f"{_label(r)} (changed {r.changed:.2f}, degenerate {d:.2f})"
        for r, d in zip(rows.itertuples(index=False), degenerate, strict=True)
    ]
    plot_paired_deltas(
        rows, label_col="label", group_cols=("metric",), title="test split, chosen strength", save_path=path
    )
    plt.close("all")
    return path


def study_table(results: pd.DataFrame, metrics: Sequence[str] | None = None) -> str:
    """A compact text table: one row per arm, `mean (delta [ci])` per metric, plus changed and degenerate rates."""
    metrics = list(metrics or results["metric"].unique())
    lines = []
    for _, rows in results.groupby("config_id", sort=False):
        rows = rows.set_index("metric")
        first = rows.iloc[0]
        cells = [
            f"{m}={rows.loc[m, 'arm_mean']:.3f} ({rows.loc[m, 'delta']:+.3f} [{rows.loc[m, 'ci_low']:+.3f}, "
            f"{rows.loc[m, 'ci_high']:+.3f}])"
            for m in metrics
            if m in rows.index
        ]
        strength = "" if pd.isna(first["strength"]) else f" @{first['strength']:g}"
        rates = f"changed={first['changed']:.2f} degenerate={first.get('degenerate_rate', math.nan):.2f}"
        lines.append(f"{first['arm_name']}{strength}: " + "  ".join(cells) + "  " + rates)
    return "\n".join(lines)


def costs_table(costs: pd.DataFrame) -> str:
    """One line per (task, metric): each arm's mean and delta [CI] vs the baseline."""
    lines = []
    for (task, metric), rows in costs.groupby(["task", "metric"], sort=True):
        cells = [
            f"{_label(r)}={r.arm_mean:.3f} ({r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}])"
            for r in rows.itertuples(index=False)
        ]
        lines.append(f"{task} {metric}: " + "  ".join(cells))
    return "\n".join(lines)
