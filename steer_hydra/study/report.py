"""The study's report: its per-sample frame, the choice on dev, per-concept and cross-concept statistics on test,
capability costs, its files and plots.

How it runs: `study_frame(save_dir, launched)` reads the samples of every (configuration, suite) cell the study
launched (`launched`: the plan's jobs with each one's `config_id` and suite name, from the job records) and labels
them with what was launched: `stage` (dev, test, cost), `concept`, `arm_name`, `point` and its axes. A cell
launched for several concepts (the baseline on a cost suite) gives its rows to each. `write_study` then:

1. chooses each method's point per concept on dev rows only (`selection.select_points`);
2. reports each concept's test rows (launched at the chosen points only) against the baseline with the one
   statistics module (`analysis.stats.paired_deltas`, plus the degenerate rate), and the cost suites' tasks;
3. summarises over concepts (`stats.concept_deltas`: each concept weighs the same; intervals resample concepts,
   then samples), with each method's win rate against the prompting arm (AxBench's: the share of concepts where
   its test objective is higher; a tie counts a half);
4. writes `selection.csv` (every dev point, the chosen ones flagged), `selection.json` (the objective, the choices,
   each concept's dev and test sample ids), `study_results.csv`, `study_summary.csv`, `capability_costs.csv`,
   `costs_summary.csv`, `study_deltas.png` and `pareto.png` (concept objective against capability cost);
5. writes the dev objective against strength per method (and layer), per concept and over concepts, with 95%
   intervals (`curves.strength_curves`): `strength_curves.csv` and `strength_curves.png`;
6. writes `index.html` (`page.write_page`): the tables, the plots and the command that bundles the logs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.analysis.compare import cell_samples, numeric_score_columns
from steer_hydra.analysis.stats import concept_deltas, degenerate_rate, paired_deltas
from steer_hydra.core.files import write_csv, write_json
from steer_hydra.study.curves import strength_curves
from steer_hydra.study.page import write_page
from steer_hydra.study.plan import AXES
from steer_hydra.study.selection import Objective, select_points
from steer_hydra.tasks.concept_steering import FLUENCY, OBJECTIVE, SCORES
from steer_hydra.tasks.judge import SCORE_KEYS as JUDGE_KEYS

logger = logging.getLogger(__name__)

LAUNCHED_KEYS = ("job", "stage", "concept", "arm_name", "point", *AXES)


def study_frame(save_dir: str | Path, launched: pd.DataFrame) -> pd.DataFrame:
    """Per-sample rows of every cell `launched` names (`config_id`, `suite` and `LAUNCHED_KEYS` columns), with
    what was launched; a cell launched for several concepts appears once per concept."""
    _, frames = cell_samples(save_dir, config_ids=set(launched["config_id"]), suites=set(launched["suite"]))
    if not frames:
        raise ValueError(f"study_frame: no evaluated samples under {save_dir}.")
    samples = pd.concat(frames, ignore_index=True)
    labels = launched[[*LAUNCHED_KEYS, "config_id", "suite"]].drop_duplicates(["concept", "config_id", "suite"])
    return samples.merge(labels, on=["config_id", "suite"], how="inner")


def study_scores(frame: pd.DataFrame) -> list[str]:
    """The concept task's rule scores, then the judge's score columns the frame holds (a judge ran or re-scored)."""
    judged = [c for key in JUDGE_KEYS for c in frame.columns if c == key or c.endswith(f"/{key}")]
    return [*SCORES, *dict.fromkeys(judged)]


def _baseline_id(frame: pd.DataFrame, baseline: str) -> str:
    ids = sorted(frame.loc[frame["arm_name"] == baseline, "config_id"].unique())
    if len(ids) != 1:
        raise ValueError(f"The baseline {baseline!r} must be one configuration; got {ids}.")
    return ids[0]


def per_concept_deltas(
    frame: pd.DataFrame, scores: Sequence[str], baseline: str = "baseline", n_resamples: int = 10_000
) -> pd.DataFrame:
    """Paired deltas per (concept, suite, task) of every arm (baseline rows included), labelled with the launch;
    with the degenerate rate where the frame has the fluency score."""
    out = []
    for concept, rows in frame.groupby("concept", sort=True):
        stats = paired_deltas(
            rows,
            list(scores),
            baseline=_baseline_id(rows, baseline),
            include_baseline=True,
            group_cols=("suite", "task"),
            n_resamples=n_resamples,
        )
        labels = rows.drop_duplicates("config_id").set_index("config_id")
        stats = stats.assign(concept=concept, **{k: stats["config_id"].map(labels[k]) for k in ("arm_name", "point")})
        if FLUENCY in rows:
            stats = stats.merge(degenerate_rate(rows, fluency=FLUENCY), on=["arm", "config_id"], how="left")
        out.append(stats[stats["n"] > 0])  # a (task, metric) pair whose task has no such scorer
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def win_rates(results: pd.DataFrame, *, objective: str, versus: str, baseline: str = "baseline") -> pd.DataFrame:
    """Per steered arm: the share of concepts where its test `objective` mean beats `versus`'s (a tie counts a
    half); the baseline, which steers nothing, gets none."""
    rows = results[(results["metric"] == objective) & (results["arm_name"] != baseline)]
    reference = rows[rows["arm_name"] == versus].set_index("concept")["arm_mean"]
    if reference.empty:
        return pd.DataFrame(columns=["arm_name", "win_rate", "win_rate_concepts"])
    out = []
    for arm, frame in rows[rows["arm_name"] != versus].groupby("arm_name", sort=True):
        other = frame["concept"].map(reference)
        wins = (frame["arm_mean"] > other).astype(float) + 0.5 * (frame["arm_mean"] == other)
        out.append({"arm_name": arm, "win_rate": float(wins.mean()), "win_rate_concepts": int(wins.count())})
    return pd.DataFrame(out, columns=["arm_name", "win_rate", "win_rate_concepts"])


def write_study(
    frame: pd.DataFrame,
    out_dir: str | Path,
    *,
    objective: Objective = Objective(OBJECTIVE),
    methods: Sequence[str],
    follows: Mapping[str, str] | None = None,
    scores: Sequence[str] | None = None,
    baseline: str = "baseline",
    prompt_arm: str | None = "prompt_concept",
    n_resamples: int = 10_000,
    save_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Choose on dev, report on test and the cost suites, summarise over concepts; write the files to `out_dir`.

    `scores` defaults to the rule scores and, where a judge scored the task, the judge's (`study_scores`);
    `save_dir` (where the jobs' logs are) puts the command that bundles its logs on the page.
    Returns the tables (`selection`, `results`, `summary`, `costs`, `costs_summary`, `strength_curves`), the
    provenance and the paths.
    """
    out_dir = Path(out_dir)
    scores = list(scores) if scores is not None else study_scores(frame)
    dev, test, cost = (frame[frame["stage"] == stage] for stage in ("dev", "test", "cost"))
    overlap = {
        c: sorted(set(dev.loc[dev["concept"] == c, "sample_id"]) & set(test.loc[test["concept"] == c, "sample_id"]))
        for c in frame["concept"].unique()
    }
    if any(overlap.values()):
        raise ValueError(f"Dev and test share sample ids {overlap}: the dev suite and the test suite must be disjoint.")
    selection = select_points(dev, objective, methods=methods, follows=follows)
    curves = strength_curves(dev, objective.metric, n_resamples=n_resamples)
    results = per_concept_deltas(test, scores, baseline, n_resamples) if not test.empty else pd.DataFrame()
    summary = pd.DataFrame()
    if not results.empty:
        summary = concept_deltas(
            test, list(scores), baseline_config_id=_baseline_id(test, baseline), n_resamples=n_resamples
        )
        if prompt_arm is not None:
            summary = summary.merge(
                win_rates(results, objective=objective.metric, versus=prompt_arm, baseline=baseline), how="left"
            )
    costs, costs_summary = pd.DataFrame(), pd.DataFrame()
    if not cost.empty:
        cost_scores = numeric_score_columns(cost, labels=LAUNCHED_KEYS)  # the cost suites' tasks, any scorers
        costs = per_concept_deltas(cost, cost_scores, baseline, n_resamples)
        costs_summary = concept_deltas(
            cost,
            cost_scores,
            baseline_config_id=_baseline_id(cost, baseline),
            group_cols=("task",),
            n_resamples=n_resamples,
        )
    provenance = {
        "objective": asdict(objective),
        "follows": dict(follows or {}),
        "concepts": sorted(map(str, frame["concept"].unique())),
        "selection": selection.to_dict(orient="records"),
        "dev_sample_ids": {c: sorted(map(str, f["sample_id"].unique())) for c, f in dev.groupby("concept")},
        "test_sample_ids": {c: sorted(map(str, f["sample_id"].unique())) for c, f in test.groupby("concept")},
    }
    tables = {
        "selection": selection,
        "study_results": results,
        "study_summary": summary,
        "capability_costs": costs,
        "costs_summary": costs_summary,
        "strength_curves": curves,
    }
    paths = {}
    for name, table in tables.items():
        if not table.empty or name == "selection":
            paths[name] = out_dir / f"{name}.csv"
            write_csv(table, paths[name])
    paths["provenance"] = out_dir / "selection.json"
    write_json(paths["provenance"], provenance)
    if not summary.empty:
        paths["plot_study_deltas"] = plot_summary(summary, out_dir / "study_deltas.png", baseline=baseline)
        paths["plot_pareto"] = plot_pareto(
            results, costs, out_dir / "pareto.png", objective=objective.metric, baseline=baseline
        )
    if not curves.empty:
        paths["plot_strength_curves"] = plot_strength_curves(
            curves, out_dir / "strength_curves.png", objective=objective.metric
        )
    paths["page"] = write_page(
        out_dir, concepts=provenance["concepts"], tables=tables, objective=objective.metric, save_dir=save_dir
    )
    logger.info(
        "Study: %d concept(s); points chosen on %d dev sample(s), reported on %d test sample(s); files in %s",
        frame["concept"].nunique(),
        dev["sample_id"].nunique(),
        test["sample_id"].nunique(),
        out_dir,
    )
    return {
        "selection": selection,
        "results": results,
        "summary": summary,
        "costs": costs,
        "costs_summary": costs_summary,
        "strength_curves": curves,
        "provenance": provenance,
        "paths": paths,
    }


# ---------------------------------------------------------------------------------------------- plots
def plot_summary(summary: pd.DataFrame, path: Path, *, baseline: str = "baseline") -> Path:
    """Each arm's delta over concepts with its interval, per metric."""
    import matplotlib.pyplot as plt

    from steer_hydra.analysis.plotting import plot_paired_deltas

    rows = summary[summary["arm_name"] != baseline].copy()
    rows["label"] = [
        f"{r.arm_name}" + (f" (wins {r.win_rate:.2f})" if "win_rate" in rows and not pd.isna(r.win_rate) else "")
        for r in rows.itertuples(index=False)
    ]
    concepts = int(summary["n_concepts"].max())
    plot_paired_deltas(
        rows, label_col="label", group_cols=("metric",), title=f"test split, {concepts} concept(s)", save_path=path
    )
    plt.close("all")
    return path


def pareto_points(results: pd.DataFrame, costs: pd.DataFrame, *, objective: str, baseline: str) -> pd.DataFrame:
    """Per (concept, arm): the test `objective` delta and the capability cost (mean delta over the cost tasks'
    metrics; NaN without cost suites)."""
    gain = results.loc[results["metric"] == objective, ["concept", "arm_name", "delta"]]
    gain = gain[gain["arm_name"] != baseline].rename(columns={"delta": "objective_delta"})
    if costs.empty:
        return gain.assign(capability_delta=math.nan)
    cost = costs.groupby(["concept", "arm_name"], as_index=False)["delta"].mean()
    return gain.merge(cost.rename(columns={"delta": "capability_delta"}), on=["concept", "arm_name"], how="left")


def plot_pareto(
    results: pd.DataFrame, costs: pd.DataFrame, path: Path, *, objective: str, baseline: str = "baseline"
) -> Path:
    """Concept objective gain against capability cost: one small marker per concept, one large per arm (its mean)."""
    import matplotlib.pyplot as plt

    points = pareto_points(results, costs, objective=objective, baseline=baseline)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for arm, rows in points.groupby("arm_name", sort=True):
        line = ax.scatter(rows["capability_delta"], rows["objective_delta"], s=14, alpha=0.45)
        ax.scatter(
            rows["capability_delta"].mean(),
            rows["objective_delta"].mean(),
            s=90,
            color=line.get_facecolor()[0],
            edgecolor="black",
            label=arm,
        )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("capability delta vs baseline (mean over cost tasks; right is better)")
    ax.set_ylabel(f"{objective} delta vs baseline (up is better)")
    ax.set_title("concept gain against capability cost (small: one concept)")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


MAX_CURVE_PANELS = 24  # concept panels drawn beside the over-concepts one; every concept is in the CSV


def plot_strength_curves(curves: pd.DataFrame, path: Path, *, objective: str) -> Path:
    """The dev objective against strength with its 95% interval (`curves.strength_curves`): the over-concepts panel,
    then one per concept (the first `MAX_CURVE_PANELS` by name); one line per method (and per layer when layers
    were swept), in the same colour in every panel."""
    import matplotlib.pyplot as plt

    from steer_hydra.study.curves import OVER_CONCEPTS, curve_label

    concepts = sorted(c for c in curves["concept"].unique() if c != OVER_CONCEPTS)
    panels = [OVER_CONCEPTS, *concepts[:MAX_CURVE_PANELS]]
    lines = sorted({curve_label(r.arm_name, r.layer) for r in curves.itertuples(index=False)})
    colors = {label: f"C{i % 10}" for i, label in enumerate(lines)}
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False, sharey=True)
    for ax, concept in zip(axes.flat, panels, strict=False):
        groups = curves[curves["concept"] == concept].groupby(["arm_name", "layer"], sort=True, dropna=False)
        for (arm, layer), rows in groups:
            rows = rows.sort_values("strength")
            label, mean = curve_label(arm, layer), rows["mean"].to_numpy(dtype=float)
            spread = [(mean - rows["ci_low"]).clip(lower=0), (rows["ci_high"] - mean).clip(lower=0)]
            ax.errorbar(rows["strength"], mean, yerr=spread, marker="o", capsize=2, color=colors[label], label=label)
            ax.fill_between(rows["strength"], rows["ci_low"], rows["ci_high"], color=colors[label], alpha=0.15)
        ax.set_title("over concepts" if concept == OVER_CONCEPTS else str(concept), fontsize=9)
        ax.set_xlabel("strength", fontsize=8)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(f"{objective} on dev", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="best")
    shown = "" if len(concepts) <= MAX_CURVE_PANELS else f"; {MAX_CURVE_PANELS} of {len(concepts)} concepts shown"
    fig.suptitle(f"{objective} on dev against strength, 95% CI{shown}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- text tables
def study_table(results: pd.DataFrame, metrics: Sequence[str] | None = None) -> str:
    """One line per (concept, arm): `metric=mean (delta [ci])`, plus changed and degenerate rates."""
    metrics = list(metrics or results["metric"].unique())
    lines = []
    for (concept, _), rows in results.groupby(["concept", "config_id"], sort=False):
        rows = rows.set_index("metric")
        first = rows.iloc[0]
        cells = [
            f"{m}={rows.loc[m, 'arm_mean']:.3f} ({rows.loc[m, 'delta']:+.3f} [{rows.loc[m, 'ci_low']:+.3f}, "
            f"{rows.loc[m, 'ci_high']:+.3f}])"
            for m in metrics
            if m in rows.index
        ]
        point = "" if first["point"] == "-" else f" @ {first['point']}"
        rates = f"changed={first['changed']:.2f} degenerate={first.get('degenerate_rate', math.nan):.2f}"
        lines.append(f"[{concept}] {first['arm_name']}{point}: " + "  ".join(cells) + "  " + rates)
    return "\n".join(lines)


def summary_table(summary: pd.DataFrame, metrics: Sequence[str] | None = None) -> str:
    """One line per arm over concepts: `metric=mean (delta [ci])` and the win rate against prompting."""
    metrics = list(metrics or summary["metric"].unique())
    lines = []
    for arm, rows in summary.groupby("arm_name", sort=True):
        rows = rows.set_index("metric")
        cells = [
            f"{m}={rows.loc[m, 'arm_mean']:.3f} ({rows.loc[m, 'delta']:+.3f} [{rows.loc[m, 'ci_low']:+.3f}, "
            f"{rows.loc[m, 'ci_high']:+.3f}])"
            for m in metrics
            if m in rows.index
        ]
        wins = rows["win_rate"].iloc[0] if "win_rate" in rows else math.nan
        tail = "" if pd.isna(wins) else f"  win rate vs prompting={wins:.2f}"
        lines.append(f"{arm} ({int(rows['n_concepts'].max())} concepts): " + "  ".join(cells) + tail)
    return "\n".join(lines)


def costs_table(costs_summary: pd.DataFrame) -> str:
    """One line per (task, metric): each arm's mean and delta [CI] vs the baseline, over concepts."""
    lines = []
    for (task, metric), rows in costs_summary.groupby(["task", "metric"], sort=True):
        cells = [
            f"{r.arm_name}={r.arm_mean:.3f} ({r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}])"
            for r in rows.itertuples(index=False)
        ]
        lines.append(f"{task} {metric}: " + "  ".join(cells))
    return "\n".join(lines)
