"""One Hydra job end to end: plan -> evaluate into the shared save_dir -> results, plots -> W&B, always finished.

Order matters for the promises made to users: every config error is raised before anything is written; the
protocol is claimed only right before the first cell is evaluated, and released again when the job fails before
any log of its suite exists; the results (CSV files, plots, Inspect logs) are on disk before W&B sees them, and a
W&B failure only warns; the pipeline is released by the runner in `finally`, so a multirun in one process does
not accumulate memory.

Selection: the job's outputs (results, samples, deltas, plots, W&B) hold its own configuration and, for the
deltas and plots, the baseline's, both selected by `config_id` from the save_dir (`analysis.select_cells`);
other configurations evaluated into the same save_dir never appear.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from steer_hydra.app.analysis import (
    app_columns,
    deltas_for,
    headline,
    long_samples,
    plot_job,
    select_cells,
    summary_metrics,
    task_samples,
    tasks_without_baseline,
)
from steer_hydra.app.console import job_console
from steer_hydra.app.files import write_csv, write_json
from steer_hydra.app.plan import JobPlan, arm_names, to_plain
from steer_hydra.app.report import (
    changed_share,
    delta_rows,
    print_report,
    report_text,
    results_table,
    table_title,
    with_changed,
)
from steer_hydra.app.secrets import redact, redact_overrides
from steer_hydra.app.tracking import Tracker, wandb_key
from steer_hydra.evaluation.frames import cells_frame
from steer_hydra.evaluation.logs import failed_samples, results_from_logs

logger = logging.getLogger(__name__)

JOB_RECORD = "job_record.json"


def git_commit() -> str | None:
    """The checkout's commit (with `-dirty` when it has local changes), or None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def memory_report() -> dict[str, Any]:
    """This process's resident memory (MiB, Linux) and how many transformers models are still alive."""
    import gc

    from transformers import PreTrainedModel

    gc.collect()
    rss = None
    statm = Path("/proc/self/statm")
    if statm.exists():
        rss = int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    live = sum(1 for obj in gc.get_objects() if issubclass(type(obj), PreTrainedModel))  # type(): no lazy attrs
    return {"pid": os.getpid(), "rss_mib": rss, "live_models": live}


def make_tracker(cfg: DictConfig, plan: JobPlan, output_dir: Path) -> Tracker | None:
    """The job's W&B run (None with `logger=none`): group = experiment, job_type = arm, tags, redacted config."""
    logger_cfg = to_plain(cfg.logger)
    if logger_cfg["kind"] == "none":
        return None
    tags = [plan.arm, plan.suite.name, plan.model["name"], plan.backend.kind, *map(str, cfg.tags)]
    context = {"config_id": plan.config_id, "sweep_id": sweep_id(), "overrides": job_overrides()}
    return Tracker.from_logger(
        logger_cfg,
        directory=output_dir,
        name=f"{plan.arm}-{plan.model['name']}-{plan.suite.name}-seed{plan.seed}",
        group=str(cfg.experiment_name),
        job_type=plan.arm,
        tags=tags,
        config={**redact(to_plain(cfg)), **redact(context)},
    )


def sweep_id() -> str | None:
    """`<experiment>/<sweep folder>` of the multirun this job belongs to, or None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    return sweep_id_of(hydra_cfg.sweep.dir)


def sweep_id_of(sweep_dir: str | Path) -> str:
    """A sweep's id: its folder's parent's parent (the experiment) and its own name (the launch time)."""
    path = Path(sweep_dir).absolute()
    return f"{path.parent.parent.name}/{path.name}"


def delta_summary(located: pd.DataFrame) -> dict[str, float]:
    """`delta/<key>`, `delta_ci_low/<key>`, `delta_ci_high/<key>` of each located delta (`report.delta_rows`)."""
    out: dict[str, float] = {}
    for row in located.to_dict("records"):
        parts = (row["suite"], row["task"], row["scorer"], row["metric"])
        for section, column in (("delta", "delta"), ("delta_ci_low", "ci_low"), ("delta_ci_high", "ci_high")):
            out[wandb_key(section, *parts)] = float(row[column])
    return out


def job_overrides() -> list[str]:
    """This job's command-line overrides (secret values redacted), or [] outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return redact_overrides(list(HydraConfig.get().overrides.task))


def run_job(cfg: DictConfig, output_dir: str | Path) -> float:
    """Run one job; returns the headline metric (mean over tasks of each task's first metric).

    Prints the results table at the end; warnings are logged once each (`console.job_console`)."""
    with job_console():
        return _run_job(cfg, Path(output_dir))


def _run_job(cfg: DictConfig, output_dir: Path) -> float:
    plan = JobPlan.from_config(cfg)  # every config error surfaces here, before anything is written
    plan.check_protocol()  # fail fast; the claim itself happens under a lock right before the first cell
    runner = plan.runner()
    tracker = make_tracker(cfg, plan, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    logger.info("Job: arm %s [%s] on suite %s; logs under %s", plan.arm, plan.config_id, plan.suite.name, plan.save_dir)
    exit_code = 1
    try:
        if tracker is not None:
            tracker.start()
        try:
            records = runner.run()[plan.arm]
        finally:
            plan.release_claim()  # removes the claim when the job failed before any log of the suite exists
        reused = bool(records) and all(r["provenance"].get("reused") for r in records)
        results = app_columns(runner.results(), seed=plan.seed)
        write_csv(results, output_dir / "results.csv")
        own_cells = cells_frame({plan.arm: records})
        samples = app_columns(long_samples(task_samples(own_cells, plan.save_dir, include_text=True)), seed=plan.seed)
        write_csv(samples, output_dir / "samples.csv")
        failures = app_columns(failed_samples(own_cells, plan.save_dir), seed=plan.seed)
        if not failures.empty:
            write_csv(failures, output_dir / "failed_samples.csv")
            logger.warning(
                "%d sample(s) failed and have no score (listed in %s): %s",
                len(failures),
                output_dir / "failed_samples.csv",
                "; ".join(f"{r.task} sample {r.sample_id}: {r.error}" for r in failures.head(5).itertuples()),
            )

        # paired deltas against the baseline (evaluated earlier into the same save_dir, or by this job): exactly
        # these two configurations, selected by config_id
        ids = [plan.config_id, plan.baseline_config_id]
        names = {**arm_names(plan.save_dir), plan.config_id: plan.arm}
        compared = select_cells(plan.save_dir, ids, names, suite=plan.suite.name)
        is_baseline = plan.config_id == plan.baseline_config_id
        missing_baseline = [] if is_baseline else tasks_without_baseline(compared, plan.baseline_config_id)
        if missing_baseline:
            logger.warning(
                "No baseline (config_id %s) yet for %s in %s: those tasks have no paired deltas. Fix: run arm=%s "
                "into the same save_dir (or wait for the job running it), then re-run this command (its cells are "
                "reused).",
                plan.baseline_config_id,
                ", ".join(missing_baseline),
                plan.save_dir,
                cfg.baseline_arm,
            )
        compared_frames = [] if is_baseline else task_samples(compared, plan.save_dir, include_text=True)
        deltas = deltas_for(compared_frames, ids[1]) if compared_frames else pd.DataFrame()
        if not deltas.empty:
            deltas = app_columns(with_changed(deltas, changed_share(compared_frames, ids[1])), seed=plan.seed)
            write_csv(deltas, output_dir / "paired_deltas.csv")
        compared_results = results_from_logs(plan.save_dir, names, config_ids=ids)
        compared_results = app_columns(compared_results[compared_results["suite"] == plan.suite.name])
        plots = plot_job(compared_results, deltas, output_dir, model=plan.model["name"])
        table = results_table(compared_results, deltas, plan.baseline_config_id)
        write_csv(table, output_dir / "results_table.csv")

        provenance = {
            "git_commit": git_commit(),
            "config_id": plan.config_id,
            "save_dir": str(plan.save_dir),
            "trial_seeds": [r["seed"] for r in records],
            **(records[0]["provenance"] if records else {}),
        }
        provenance = redact(provenance)
        metrics = summary_metrics(results)
        objective = headline(results)
        files = {
            "results": output_dir / "results.csv",
            "samples": output_dir / "samples.csv",
            "paired_deltas": output_dir / "paired_deltas.csv",
            "results_table": output_dir / "results_table.csv",
            "failed_samples": output_dir / "failed_samples.csv",
            **{f"plot_{name}": path for name, path in plots.items()},
        }
        write_json(
            output_dir / JOB_RECORD,
            {
                "arm": plan.arm,
                "arm_name": plan.arm_name,
                "config_id": plan.config_id,
                "baseline_config_id": plan.baseline_config_id,
                "suite": plan.suite.name,
                "model": plan.model["name"],
                "seed": plan.seed,
                "trial_ids": [r["trial_id"] for r in records],
                "trial_seeds": [r["seed"] for r in records],
                "save_dir": str(plan.save_dir),
                "overrides": job_overrides(),
                "sweep_id": sweep_id(),
                "wandb_run_id": tracker.run_id if tracker is not None else None,
                "files": {name: str(path) for name, path in files.items() if path.exists()},
                "results_reused": reused,
                "tasks_without_baseline": missing_baseline,
                "failed_samples": failures[["suite", "task", "trial_id", "sample_id", "error"]].to_dict("records"),
                "metrics": metrics,
                "provenance": provenance,
                "memory_after_release": memory_report(),
            },
        )

        if tracker is not None:
            tracker.config({"provenance": provenance})
            summary: dict[str, Any] = {
                **metrics,
                "objective": objective,
                "arm": plan.arm,
                "config_id": plan.config_id,
                "results_reused": reused,
                "tasks_without_baseline": ", ".join(missing_baseline),
                "failed_samples": len(failures),
            }
            summary.update(delta_summary(delta_rows(deltas, compared_results)))
            tracker.summary(summary)
            tracker.table(wandb_key("tables", "results"), table)
            tracker.table(wandb_key("tables", "paired_deltas"), deltas)
            if cfg.logger.log_samples:
                tracker.table(wandb_key("tables", "samples"), samples)
            tracker.images({wandb_key("plots", name): path for name, path in plots.items()})
            if cfg.logger.log_artifact:
                tracker.artifact(
                    f"inspect-logs-{plan.config_id}-{plan.suite.name}",
                    "inspect-logs",
                    plan.save_dir / "inspect_logs" / plan.config_id,
                )
        exit_code = 0
        against = "" if is_baseline else f" vs {cfg.baseline_arm}"
        title = table_title(f"{plan.arm} [{plan.config_id}]{against}", table, {"seed": plan.seed})
        notes = [tracker.where() if tracker is not None else None]
        notes.append(f"Objective {objective:.4f}" + (" (every cell reused from the save_dir)" if reused else ""))
        log_dir = plan.save_dir / "inspect_logs" / plan.config_id
        print_report(report_text(table, title=title, files=files, log_dir=log_dir, notes=notes))
        return objective
    finally:
        if tracker is not None:
            tracker.finish(exit_code)
