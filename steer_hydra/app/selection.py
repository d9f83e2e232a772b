"""Held-out strength selection (AxBench's protocol): choose each arm's strength on dev, report it on test.

How it runs: the study sweeper (`hydra_plugins/steer_hydra_study`) evaluates each method arm at every strength
on the dev split of a task whose samples carry a `split` (the built-in `concept_steering`), asks
`StudySelection.choose` for the strengths, then evaluates every arm at its chosen strength on test and on the cost
suites, and calls `StudySelection.report`. `select_strengths(dev, objective)` sees only dev rows (it refuses any other
split) and picks, per arm, the strength with the best mean objective (ties go to the smaller strength). Sanity
arms (`caa_random`, `caa_negated`) are not tuned: `follows` maps them to the arm whose choice they take, so a
control is compared at the strength its method was chosen at. `report_selected(test, choices, ...)` keeps each
arm's test rows at its chosen strength and computes the statistics of `evaluation.stats` against the baseline.
`study_frame(save_dir)` builds the per-sample frame from a study's logs (an arm's display name `name@config_id`
counts as arm `name`); `write_study` writes `selection.csv`, `study_results.csv` and `selection.json` (the
objective, the choices and both splits' sample ids: the provenance of the choice) and, with cost suites,
`capability_costs.csv` (`report_costs`). `StudySelection` runs all of it and logs it to W&B; as a Hydra callback it
reports a plain grid multirun that evaluated every strength on both splits.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from steer_hydra.evaluation.stats import arm_statistics, per_sample_means

logger = logging.getLogger(__name__)

STRENGTH_KEYS = ("multiplier", "alpha")


@dataclass(frozen=True, slots=True)
class Objective:
    """What "best" means on dev: the mean of `metric` (higher is better unless `maximize=False`)."""

    metric: str = "concept_harmonic"
    maximize: bool = True


def select_strengths(
    dev: pd.DataFrame, objective: Objective, *, follows: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Per arm: the strength with the best dev objective. Columns `arm, strength, objective, candidates, source`.

    `dev` holds per-sample rows with `pipeline` (the arm), `strength`, `config_id`, `sample_id`, `split` and the
    objective's column; every row must be a dev row. Arms in `follows` take the strength chosen for the arm
    they follow (`source` says which); arms without a strength (baseline, prompts) get NaN.
    """
    if "split" not in dev or not (dev["split"] == "dev").all():
        splits = sorted(map(str, dev["split"].unique())) if "split" in dev else ["<no split column>"]
        raise ValueError(f"select_strengths reads dev rows only; got split(s) {splits}. Fix: pass frame[split=='dev'].")
    if objective.metric not in dev:
        raise KeyError(f"select_strengths: objective metric {objective.metric!r} is not a column of the dev frame.")
    follows = dict(follows or {})
    rows: dict[str, dict[str, Any]] = {}
    for arm, frame in dev.groupby("pipeline", sort=True):
        if arm in follows:
            continue
        swept = frame.dropna(subset=["strength"])
        if swept.empty:
            rows[arm] = {"arm": arm, "strength": math.nan, "objective": math.nan, "candidates": 0, "source": arm}
            continue
        means = per_sample_means(swept, objective.metric, keys=("strength", "sample_id"))
        by_strength = means.groupby("strength", sort=True)[objective.metric].mean()
        best = by_strength.max() if objective.maximize else by_strength.min()
        chosen = _smallest(by_strength, best)
        rows[arm] = {
            "arm": arm,
            "strength": chosen,
            "objective": float(best),
            "candidates": len(by_strength),
            "source": arm,
        }
    for arm, parent in follows.items():
        if parent not in rows:
            raise ValueError(f"select_strengths: {arm!r} follows {parent!r}, which has no dev rows.")
        rows[arm] = {**rows[parent], "arm": arm, "objective": math.nan, "candidates": 0, "source": parent}
    return pd.DataFrame(list(rows.values()), columns=["arm", "strength", "objective", "candidates", "source"])


def _smallest(by_strength: pd.Series, best: float) -> float:
    """The strength of smallest magnitude among those reaching `best` (the gentlest intervention wins a tie)."""
    tied = [float(s) for s, v in by_strength.items() if v == best]
    return min(tied, key=abs)


def report_selected(
    test: pd.DataFrame,
    choices: pd.DataFrame,
    scores: Sequence[str],
    *,
    baseline: str = "baseline",
    fluency: str | None = "fluency_score",
    n_resamples: int = 10_000,
) -> pd.DataFrame:
    """Statistics on test of each arm at its chosen strength (arms without a strength as they are)."""
    if "split" in test and not (test["split"] == "test").all():
        raise ValueError("report_selected reads test rows only. Fix: pass frame[split=='test'].")
    selected = at_chosen_strength(test, choices, baseline=baseline)
    base_ids = sorted(selected.loc[selected["pipeline"] == baseline, "config_id"].unique())
    if len(base_ids) != 1:
        raise ValueError(f"report_selected: the baseline {baseline!r} must be one configuration; got {base_ids}.")
    stats = arm_statistics(
        selected,
        list(scores),
        baseline_config=base_ids[0],
        fluency=fluency if fluency in selected else None,
        n_resamples=n_resamples,
    )
    strengths = selected.groupby("config_id")["strength"].first()
    return stats.assign(strength=stats["config_id"].map(strengths)).rename(columns={"pipeline": "arm"})


def at_chosen_strength(frame: pd.DataFrame, choices: pd.DataFrame, *, baseline: str = "baseline") -> pd.DataFrame:
    """The rows of each arm at its chosen strength (arms without a chosen strength: their unswept rows)."""
    chosen = dict(zip(choices["arm"], choices["strength"], strict=True))
    keep = []
    for arm, rows in frame.groupby("pipeline", sort=True):
        strength = chosen.get(arm, math.nan)
        if arm == baseline or strength is None or (isinstance(strength, float) and math.isnan(strength)):
            keep.append(rows if rows["strength"].isna().all() else rows[rows["strength"].isna()])
        else:
            keep.append(rows[rows["strength"] == strength])
    return pd.concat(keep, ignore_index=True) if keep else frame.iloc[:0]


NOT_SCORES = frozenset(
    {"pipeline", "config_id", "trial_id", "seed", "suite", "task", "sample_id", "input", "completion", "display",
     "strength", "split", "target", "error"}
)  # fmt: skip


def report_costs(
    samples: pd.DataFrame,
    choices: pd.DataFrame,
    *,
    suites: Sequence[str],
    baseline: str = "baseline",
    n_resamples: int = 10_000,
) -> pd.DataFrame:
    """Capability costs: per task of `suites`, each arm at its chosen strength vs the baseline (paired, by sample).

    Columns: `suite, task, arm, config_id, strength, metric, n, baseline_mean, arm_mean, delta, ci_low, ci_high,
    changed_fraction`. The score columns are every numeric score the task's logs hold.
    """
    out = []
    for (suite, task), frame in samples[samples["suite"].isin(list(suites))].groupby(["suite", "task"], sort=True):
        selected = at_chosen_strength(frame, choices, baseline=baseline)
        base_ids = sorted(selected.loc[selected["pipeline"] == baseline, "config_id"].unique())
        if len(base_ids) != 1:
            logger.warning("Capability costs of %s/%s skipped: baseline configurations %s", suite, task, base_ids)
            continue
        scores = [
            c
            for c in selected.columns
            if c not in NOT_SCORES and pd.to_numeric(selected[c], errors="coerce").notna().any()
        ]
        stats = arm_statistics(selected, scores, baseline_config=base_ids[0], n_resamples=n_resamples)
        strengths = selected.groupby("config_id")["strength"].first()
        out.append(
            stats.assign(suite=suite, task=task, strength=stats["config_id"].map(strengths)).rename(
                columns={"pipeline": "arm"}
            )
        )
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


# ---------------------------------------------------------------------------------------- reading a study
def strength_of(controls: Any) -> float | None:
    """The steering strength of a configuration's canonical controls: the first `multiplier` (or `alpha`) found."""
    if isinstance(controls, Mapping):
        for key in STRENGTH_KEYS:
            value = controls.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        for value in controls.values():
            found = strength_of(value)
            if found is not None:
                return found
    elif isinstance(controls, (list, tuple)):
        for value in controls:
            found = strength_of(value)
            if found is not None:
                return found
    return None


def study_frame(save_dir: str | Path, *, split_of: Mapping[str, str], swept: Sequence[str] = ()) -> pd.DataFrame:
    """Per-sample rows of every configuration in `save_dir`, with `strength` (for arms in `swept`) and `split`.

    `split_of` maps sample ids to their split (`concept_steering.split_ids`); samples of other tasks get the
    split `other`.
    """
    from steer_hydra.app.analysis import task_samples
    from steer_hydra.app.plan import arm_names
    from steer_hydra.evaluation.logs import results_from_logs

    save_dir = Path(save_dir)
    results = results_from_logs(save_dir, arm_names(save_dir))
    frames = [f for f in task_samples(results, save_dir, include_text=True) if not f.empty]
    if not frames:
        raise ValueError(f"study_frame: no evaluated samples under {save_dir}.")
    samples = pd.concat(frames, ignore_index=True)
    samples = samples.assign(display=samples["pipeline"], pipeline=samples["pipeline"].str.split("@").str[0])
    strengths = {}
    for path in sorted((save_dir / "configs").glob("*.json")):
        record = json.loads(path.read_text())
        if str(record["arm"]).split("@")[0] in swept:
            strengths[record["config_id"]] = strength_of(record.get("controls"))
    return samples.assign(
        strength=samples["config_id"].map(strengths).astype(float),
        split=samples["sample_id"].map(lambda i: split_of.get(str(i), "other")),
    )


def write_study(
    samples: pd.DataFrame,
    out_dir: str | Path,
    *,
    objective: Objective,
    scores: Sequence[str],
    follows: Mapping[str, str] | None = None,
    baseline: str = "baseline",
    task: str | None = None,
    strengths: Sequence[float] | None = None,
    cost_suites: Sequence[str] = (),
) -> dict[str, Any]:
    """Select on dev, report on test; write `selection.csv`, `study_results.csv`, `selection.json`.

    `strengths` (the study's grid) restricts the dev candidates (a save_dir may hold other strengths from earlier
    runs); `cost_suites` adds `capability_costs.csv`: each arm at its chosen strength on those suites' tasks.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev, test = dev_test(samples, task=task, strengths=strengths)
    choices = select_strengths(dev, objective, follows=follows)
    results = report_selected(test, choices, scores, baseline=baseline)
    costs = report_costs(samples, choices, suites=cost_suites, baseline=baseline) if cost_suites else pd.DataFrame()
    choices.to_csv(out_dir / "selection.csv", index=False)
    results.to_csv(out_dir / "study_results.csv", index=False)
    if not costs.empty:
        costs.to_csv(out_dir / "capability_costs.csv", index=False)
    provenance = {
        "objective": asdict(objective),
        "follows": dict(follows or {}),
        "choices": choices.to_dict(orient="records"),
        "dev_sample_ids": sorted(map(str, dev["sample_id"].unique())),
        "test_sample_ids": sorted(map(str, test["sample_id"].unique())),
    }
    (out_dir / "selection.json").write_text(json.dumps(provenance, indent=1, default=str))
    plot_study(results, out_dir / "study_deltas.png", baseline=baseline)
    logger.info("Strength selection on %d dev samples; results on %d test samples in %s", *_sizes(dev, test), out_dir)
    return {"choices": choices, "results": results, "costs": costs, "provenance": provenance}


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


def plot_study(results: pd.DataFrame, path: Path, *, baseline: str = "baseline") -> Path:
    """Each arm's test delta with its CI per metric; labels carry the strength, changed and degenerate rates."""
    import matplotlib.pyplot as plt

    from steer_hydra.evaluation.plotting import plot_paired_deltas

    rows = results[results["arm"] != baseline].copy()
    changed = rows.get("changed_fraction", pd.Series(math.nan, index=rows.index))
    degenerate = rows.get("degenerate_rate", pd.Series(math.nan, index=rows.index))
    rows["label"] = [
        f"{arm}{'' if pd.isna(s) else f'@{s:g}'} (changed {c:.2f}, degenerate {d:.2f})"
        for arm, s, c, d in zip(rows["arm"], rows["strength"], changed, degenerate, strict=True)
    ]
    plot_paired_deltas(
        rows, label_col="label", group_cols=("metric",), title="test split, chosen strength", save_path=path
    )
    plt.close("all")
    return path


def _sizes(dev: pd.DataFrame, test: pd.DataFrame) -> tuple[int, int]:
    return dev["sample_id"].nunique(), test["sample_id"].nunique()


class StudySelection(Callback):
    """The study's selection and report: strengths chosen on dev, reported on test, capability costs, W&B.

    As a Hydra callback (a plain grid multirun that evaluates both splits) it reports at `on_multirun_end`; the
    study sweeper (`hydra/sweeper: study`) calls `choose` between its dev and report batches and `report` at the
    end. Args: `objective` (a score column) and `maximize`, `scores` (the columns reported), `swept` (arms whose
    strength is swept), `follows` (sanity arm -> its method's arm), `task` (the task holding the splits),
    `baseline`, `cost_suites` (suites whose tasks give each arm's capability costs).
    """

    def __init__(
        self,
        objective: str = "concept_harmonic",
        maximize: bool = True,
        scores: Sequence[str] = ("concept_score", "instruction_score", "fluency_score", "concept_harmonic"),
        swept: Sequence[str] = (),
        follows: Mapping[str, str] | None = None,
        task: str = "steer_hydra/concept_steering",
        baseline: str = "baseline",
        cost_suites: Sequence[str] = (),
    ) -> None:
        self.objective = Objective(objective, maximize)
        self.scores, self.swept, self.follows = list(scores), list(swept), dict(follows or {})
        self.task, self.baseline, self.cost_suites = task, baseline, list(cost_suites)

    def samples(self, save_dir: str | Path) -> pd.DataFrame:
        """The study frame of `save_dir` with the concept task's splits."""
        from steer_hydra.tasks.concept_steering import split_ids

        split_of = {i: "dev" for i in split_ids("dev")} | {i: "test" for i in split_ids("test")}
        return study_frame(Path(save_dir).absolute(), split_of=split_of, swept=self.swept)

    def choose(self, save_dir: str | Path, *, strengths: Sequence[float] | None = None) -> dict[str, float]:
        """Each method arm's strength, chosen on the dev rows of `save_dir` only (sanity arms are not chosen)."""
        dev, _ = dev_test(self.samples(save_dir), task=self.task, strengths=strengths)
        dev = dev[~dev["pipeline"].isin(list(self.follows))]
        choices = select_strengths(dev, self.objective)
        return {r.arm: float(r.strength) for r in choices.itertuples(index=False) if not pd.isna(r.strength)}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.report(config)

    def report(
        self, config: DictConfig, *, save_dir: str | Path | None = None, strengths: Sequence[float] | None = None
    ) -> dict[str, Any] | None:
        """Select on dev, report on test (and costs) into `<sweep dir>/study/`, print the table, log to W&B."""
        out_dir = Path(config.hydra.sweep.dir).absolute() / "study"
        try:
            samples = self.samples(save_dir if save_dir is not None else str(config.save_dir))
            present = set(samples["pipeline"])
            out = write_study(
                samples,
                out_dir,
                objective=self.objective,
                scores=self.scores,
                follows={arm: parent for arm, parent in self.follows.items() if arm in present},
                baseline=self.baseline,
                task=self.task,
                strengths=strengths,
                cost_suites=self.cost_suites,
            )
        except (ValueError, KeyError) as error:
            logger.warning("Study selection skipped: %s", error)
            return None
        logger.info("Study (strength chosen on dev, reported on test):\n%s", study_table(out["results"]))
        if not out["costs"].empty:
            logger.info("Capability costs (chosen strength):\n%s", costs_table(out["costs"]))
        self._track(config, out_dir, out)
        return out

    def _track(self, config: DictConfig, out_dir: Path, out: Mapping[str, Any]) -> None:
        from steer_hydra.app.plan import to_plain
        from steer_hydra.app.tracking import Tracker, wandb_key

        logger_cfg = to_plain(OmegaConf.select(config, "logger") or {"kind": "none"})
        if logger_cfg.get("kind") == "none":
            return
        tracker = Tracker.from_logger(
            logger_cfg,
            directory=out_dir,
            name=f"{config.experiment_name}-study",
            group=str(config.experiment_name),
            job_type="study_selection",
            tags=["study_selection", *map(str, config.tags)],
            config={"selection": out["provenance"]},
        ).start()
        exit_code = 1
        try:
            results = out["results"]
            tracker.summary(
                {
                    f"study/{r.arm}/{r.metric}/{key}": getattr(r, key)
                    for r in results.itertuples(index=False)
                    for key in ("delta", "ci_low", "ci_high", "arm_mean", "changed_fraction", "degenerate_rate")
                    if hasattr(r, key)
                }
            )
            tracker.table(wandb_key("tables", "study_results"), results)
            tracker.table(wandb_key("tables", "selection"), out["choices"])
            if not out["costs"].empty:
                tracker.table(wandb_key("tables", "capability_costs"), out["costs"])
            exit_code = 0
        finally:
            tracker.finish(exit_code)


def study_table(results: pd.DataFrame, metrics: Sequence[str] | None = None) -> str:
    """A compact text table: one row per arm, `mean (delta [ci])` per metric, plus changed and degenerate rates."""
    metrics = list(metrics or results["metric"].unique())
    lines = []
    for arm, rows in results.groupby("arm", sort=False):
        rows = rows.set_index("metric")
        first = rows.iloc[0]
        cells = [
            f"{m}={rows.loc[m, 'arm_mean']:.3f} ({rows.loc[m, 'delta']:+.3f} [{rows.loc[m, 'ci_low']:+.3f}, "
            f"{rows.loc[m, 'ci_high']:+.3f}])"
            for m in metrics
            if m in rows.index
        ]
        strength = "" if pd.isna(first.get("strength")) else f" @{first['strength']:g}"
        changed, degenerate = first.get("changed_fraction", math.nan), first.get("degenerate_rate", math.nan)
        rates = f"changed={changed:.2f} degenerate={degenerate:.2f}"
        lines.append(f"{arm}{strength}: " + "  ".join(cells) + "  " + rates)
    return "\n".join(lines)


def costs_table(costs: pd.DataFrame) -> str:
    """One line per (task, metric): each arm's mean and delta [CI] vs the baseline."""
    lines = []
    for (task, metric), rows in costs.groupby(["task", "metric"], sort=True):
        cells = [
            f"{r.arm}{'' if pd.isna(r.strength) else f'@{r.strength:g}'}={r.arm_mean:.3f} "
            f"({r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}])"
            for r in rows.itertuples(index=False)
        ]
        lines.append(f"{task} {metric}: " + "  ".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m steer_hydra.app.selection SAVE_DIR OUT_DIR`: the study selection of a save_dir, after the fact."""
    import argparse

    from steer_hydra.tasks.concept_steering import split_ids

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("save_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--objective", default="concept_harmonic")
    parser.add_argument("--swept", nargs="*", default=["caa_weddings", "caa_weddings_random", "caa_weddings_negated"])
    parser.add_argument(
        "--follows", nargs="*", default=["caa_weddings_random=caa_weddings", "caa_weddings_negated=caa_weddings"]
    )
    parser.add_argument("--task", default="steer_hydra/concept_steering")
    parser.add_argument("--strengths", nargs="*", type=float, default=None, help="the grid (default: every one)")
    parser.add_argument("--cost-suites", nargs="*", default=["capability_offline"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    split_of = {i: "dev" for i in split_ids("dev")} | {i: "test" for i in split_ids("test")}
    samples = study_frame(args.save_dir, split_of=split_of, swept=args.swept)
    follows = dict(item.split("=", 1) for item in args.follows)
    present = set(samples["pipeline"])
    follows = {arm: parent for arm, parent in follows.items() if arm in present}
    out = write_study(
        samples,
        args.out_dir,
        objective=Objective(args.objective),
        scores=["concept_score", "instruction_score", "fluency_score", "concept_harmonic"],
        follows=follows,
        task=args.task,
        strengths=args.strengths,
        cost_suites=args.cost_suites,
    )
    print(study_table(out["results"]))  # noqa: T201 - a command's output
    if not out["costs"].empty:
        print(costs_table(out["costs"]))  # noqa: T201


if __name__ == "__main__":
    main()
