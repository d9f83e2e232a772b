"""Sweeps: one job per override combination, aggregation against the baseline, resume, submitit_local (a process
per job; a killed job is named by the aggregate of the rest), and re-aggregation from the sweep directory."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from app_helpers import FAST, read_run

SWEEP = ["--multirun", "arm=baseline,pasta", "seed=1,2", *FAST]


def _sweep_dir(root: Path) -> Path:
    (sweep,) = (root / "outputs" / "default" / "multiruns").iterdir()
    return sweep


def _records(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/job_record.json"))]


def _log_files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in (root / "outputs").rglob("*.eval")}


def _check_sweep(sweep: Path) -> list[dict]:
    records = _records(sweep)
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
    sweep = _sweep_dir(tmp_path)
    records = _check_sweep(sweep)
    assert len({r["memory_after_release"]["pid"] for r in records}) == 1  # the basic launcher: one process
    assert all(r["memory_after_release"]["live_models"] == 0 for r in records)  # released after every job
    rss = [r["memory_after_release"]["rss_mib"] for r in records]
    assert rss[-1] - rss[1] < 100, rss  # no model's worth of growth per job after the first
    job_runs = list(sweep.glob("[0-9]*_*/wandb/offline-run-*"))  # one W&B run per job
    assert len(job_runs) == 4

    logs = _log_files(tmp_path)
    again = run_app(*SWEEP)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _log_files(tmp_path) == logs  # resumed from the logs: no sample generated, no log rewritten
    second = sorted(p for p in (tmp_path / "outputs" / "default" / "multiruns").iterdir() if p != sweep)[-1]
    assert [r["metrics"] for r in _records(second)] == [r["metrics"] for r in records]


KILLER = """
import os
import signal

from steer_hydra.core import InputControl


class Killer(InputControl):
    supports_batching = True

    def steer(self, model, tokenizer=None, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)  # the job dies as an out-of-memory kill or a node failure would
"""


@pytest.mark.slow
def test_submitit_local_runs_jobs_in_their_own_processes_and_a_killed_one_is_named(run_app, tmp_path):
    conf = tmp_path / "user_conf" / "arm"
    conf.mkdir(parents=True)
    (conf / "killer.yaml").write_text(
        "# @package arm\nname: killer\ncontrols:\n  k:\n    _target_: killer_control.Killer\n"
    )
    (tmp_path / "killer_control.py").write_text(KILLER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    args = ["--multirun", "arm=baseline,pasta,killer", "seed=1", *FAST, "hydra/launcher=submitit_local"]
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'user_conf'}]"
    proc = run_app(*args, searchpath, env=env, timeout=600)
    assert proc.returncode != 0
    sweep = _sweep_dir(tmp_path)
    records = _records(sweep)
    assert sorted(r["arm"] for r in records) == ["baseline", "pasta"]
    assert len({r["memory_after_release"]["pid"] for r in records}) == 2  # each job in its own process
    deltas = list(csv.DictReader((sweep / "aggregate" / "paired_deltas.csv").open()))
    assert deltas and {r["arm"] for r in deltas} == {"pasta"}
    (missing,) = json.loads((sweep / "aggregate" / "missing_cells.json").read_text())
    assert missing["job"] == 2 and "arm=killer" in missing["overrides"] and "seed=1" in missing["overrides"]
    assert missing["command"].startswith("python -m steer_hydra ") and "arm=killer" in missing["command"]
    assert f"hydra.run.dir={sweep / '2_rerun'}" in missing["command"] and "hydra.searchpath" in missing["command"]
    assert "arm=killer" in proc.stdout + proc.stderr  # the console names the missing cell and its command

    (sweep / "aggregate" / "paired_deltas.csv").unlink()
    again = subprocess.run(
        [sys.executable, "-m", "steer_hydra.aggregate", str(sweep), "--no-tracking"],
        env={**os.environ, **env, "WANDB_MODE": "offline"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 1, again.stderr[-2000:]  # re-aggregated, still one job missing
    assert "arm=killer" in again.stderr and (sweep / "aggregate" / "paired_deltas.csv").exists()
