"""One Hydra job end to end: plan -> evaluate into the shared save_dir -> results, plots -> W&B, always finished.

Order matters for the promises made to users: every config error is raised before anything is written; the
results (CSV files, plots, Inspect logs) are on disk before W&B sees them, and a W&B failure only warns; the
pipeline is released by the runner in `finally`, so a multirun in one process does not accumulate memory.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from steer_hydra.app.analysis import deltas_for, headline, long_samples, plot_job, summary_metrics, task_samples
from steer_hydra.app.plan import JobPlan, arm_names, to_plain
from steer_hydra.app.secrets import redact
from steer_hydra.app.tracking import Tracker
from steer_hydra.evaluation.frames import results_from_logs

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
    return Tracker(
        project=logger_cfg["project"],
        entity=logger_cfg.get("entity"),
        mode=logger_cfg.get("mode"),
        directory=output_dir,
        name=f"{plan.arm}-{plan.suite.name}-seed{plan.seed}",
        group=str(cfg.experiment_name),
        job_type=plan.arm,
        tags=tags,
        config=redact(to_plain(cfg)),
    )


def run_job(cfg: DictConfig, output_dir: str | Path) -> float:
    """Run one job; returns the headline metric (mean over tasks of each task's first metric)."""
    output_dir = Path(output_dir)
    plan = JobPlan.from_config(cfg)  # every config error surfaces here, before anything is written
    plan.check_protocol()
    runner = plan.runner()
    tracker = make_tracker(cfg, plan, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    logger.info("Job: arm %s [%s] on suite %s; logs under %s", plan.arm, plan.config_id, plan.suite.name, plan.save_dir)
    plan.record_protocol()  # before any log exists, so a later job with another protocol is refused
    exit_code = 1
    try:
        if tracker is not None:
            tracker.start()
        records = runner.run()[plan.arm]
        results = runner.results()
        results.to_csv(output_dir / "results.csv", index=False)
        samples = long_samples(task_samples(results, plan.save_dir, include_text=True))
        samples.to_csv(output_dir / "samples.csv", index=False)

        # paired deltas against the baseline, evaluated earlier into the same save_dir or by this job
        baseline = str(cfg.baseline_arm)
        everything = results_from_logs(plan.save_dir, arm_names(plan.save_dir))
        compared = everything[
            (everything["suite"] == plan.suite.name) & everything["config"].isin([plan.arm, baseline])
        ]
        deltas = deltas_for(task_samples(compared, plan.save_dir), baseline) if plan.arm != baseline else pd.DataFrame()
        if not deltas.empty:
            deltas.to_csv(output_dir / "paired_deltas.csv", index=False)
        plots = plot_job(compared, deltas, output_dir)

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
        (output_dir / JOB_RECORD).write_text(
            json.dumps(
                {
                    "arm": plan.arm,
                    "config_id": plan.config_id,
                    "suite": plan.suite.name,
                    "model": plan.model["name"],
                    "seed": plan.seed,
                    "save_dir": str(plan.save_dir),
                    "metrics": metrics,
                    "provenance": provenance,
                    "memory_after_release": memory_report(),
                },
                indent=1,
                default=str,
            )
        )

        if tracker is not None:
            tracker.config({"provenance": provenance})
            summary: dict[str, Any] = {**metrics, "objective": objective}
            for row in deltas.itertuples(index=False):
                key = "/".join(["delta", row.suite, row.task.replace("/", "."), row.metric])
                summary[key] = row.delta
                summary[key + "/ci_low"], summary[key + "/ci_high"] = row.ci_low, row.ci_high
            tracker.summary(summary)
            if cfg.logger.log_samples:
                tracker.table("samples", samples)
            tracker.images(plots)
            if cfg.logger.log_artifact:
                tracker.artifact(
                    f"inspect-logs-{plan.config_id}-{plan.suite.name}",
                    "inspect-logs",
                    plan.save_dir / "inspect_logs" / plan.config_id,
                )
        exit_code = 0
        logger.info("Results in %s (objective %.4f)", output_dir, objective)
        return objective
    finally:
        if tracker is not None:
            tracker.finish(exit_code)
