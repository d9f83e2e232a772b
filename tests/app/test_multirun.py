"""Sweeps in one process: one job per override combination, aggregation against the baseline, flat memory, resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from app_helpers import FAST, job_records, read_run, sweep_dir

SWEEP = ["--multirun", "arm=baseline,pasta", "seed=1,2", *FAST]


def _log_files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in (root / "outputs").rglob("*.eval")}


def _check_sweep(sweep: Path) -> list[dict]:
    records = job_records(sweep)
    assert sorted((r["arm"], r["seed"]) for r in records) == [
        ("baseline", 1),
        ("baseline", 2),
        ("pasta", 1),
        ("pasta", 2),
    ]
    deltas = list(csv.DictReader((sweep / "aggregate" / "paired_deltas.csv").open()))
    assert {r["task"] for r in deltas} == {
        "steer_hydra/short_answer",
        "steer_hydra/mcqa",
        "steer_hydra/instruction_following",
    }
    pasta_id = next(r["config_id"] for r in records if r["arm"] == "pasta")
    assert all(r["arm"] == "pasta" and r["config_id"] == pasta_id for r in deltas)
    assert all(r["seeds"] == "1,2" and int(r["n"]) == 2 for r in deltas)
    assert all(int(r["n_trials"]) == 2 for r in deltas)  # both seeds pooled per sample
    assert (sweep / "aggregate" / "summary.csv").exists() and (sweep / "aggregate" / "paired_deltas.png").exists()
    (summary_run,) = (sweep / "aggregate" / f"tiny-{pasta_id}" / "wandb").glob("offline-run-*")
    config, summary = read_run(next(summary_run.glob("run-*.wandb")))
    assert summary["jobs"] == 4 and "delta/smoke/steer_hydra.mcqa/letter_or_option/accuracy" in summary
    assert sorted(summary["job_run_ids"]) == sorted(r["wandb_run_id"] for r in records)
    assert json.loads((sweep / "aggregate" / "missing_cells.json").read_text()) == []
    return records


@pytest.mark.slow
def test_multirun_in_one_process_with_flat_memory_then_resumes_without_new_samples(run_app, tmp_path):
    proc = run_app(*SWEEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = sweep_dir(tmp_path)
    records = _check_sweep(sweep)
    assert len({r["memory_after_release"]["pid"] for r in records}) == 1  # the basic launcher: one process
    # one base, loaded by the first job and resident for the others: never a second model
    assert [r["provenance"]["model_residency"] for r in records] == ["loaded", "resident", "resident", "resident"]
    assert all(r["memory_after_release"]["resident"] for r in records)
    assert len({r["memory_after_release"]["live_models"] for r in records}) == 1
    rss = [r["memory_after_release"]["rss_mib"] for r in records]
    assert rss[-1] - rss[1] < 100, rss  # no model's worth of growth per job after the first
    job_runs = list(sweep.glob("[0-9]*_*/wandb/offline-run-*"))  # one W&B run per job
    assert len(job_runs) == 4

    logs = _log_files(tmp_path)
    again = run_app(*SWEEP, "logger=none")  # the resume is what is checked here; W&B was checked above
    assert again.returncode == 0, again.stderr[-3000:]
    assert _log_files(tmp_path) == logs  # resumed from the logs: no sample generated, no log rewritten
    second = sorted(p for p in (tmp_path / "outputs" / "default" / "multiruns").iterdir() if p != sweep)[-1]
    assert [r["metrics"] for r in job_records(second)] == [r["metrics"] for r in records]
