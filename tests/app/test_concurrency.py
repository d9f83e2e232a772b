"""Concurrent jobs in one save_dir: three processes at once (different arms, same suite and seed) racing for the
protocol claim and the shared files of a fresh save_dir; two jobs of the same configuration at once evaluating
each cell once."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
import threading

import pytest
from app_helpers import FAST

from steer_hydra.app import job as job_module
from steer_hydra.app.plan import JobPlan

ARMS = ["baseline", "pasta", "system_prompt"]
ONE_TASK = [*FAST, "suite.tasks=[steer_hydra/short_answer]"]  # one task keeps 3 processes short


def _values(path):
    """`{(arm, config_id, task, scorer, metric): value}` of a results.csv."""
    return {
        (r["arm"], r["config_id"], r["task"], r["scorer"], r["metric"]): r["value"] for r in csv.DictReader(path.open())
    }


@pytest.mark.slow
def test_parallel_jobs_into_one_save_dir_all_finish_and_equal_a_sequential_run(compose_cfg, tmp_path):
    sequential = {}
    for arm in ARMS:  # the reference: one job after another, in this process
        out = tmp_path / "sequential" / arm
        job_module.run_job(
            compose_cfg([*ONE_TASK, f"output_root={tmp_path / 'seq'}", "logger=none", f"arm={arm}"]), out
        )
        sequential[arm] = _values(out / "results.csv")

    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    # a fresh save_dir: every job races for the protocol claim and the shared files
    experiment = "race"
    procs = {
        arm: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "steer_hydra",
                f"arm={arm}",
                *ONE_TASK,
                "logger=none",
                f"output_root={tmp_path / 'par'}",
                f"experiment_name={experiment}",
                f"hydra.run.dir={tmp_path / 'par' / experiment / 'runs' / arm}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for arm in ARMS
    }
    errors = {arm: proc.communicate(timeout=600)[1] for arm, proc in procs.items()}
    for arm, proc in procs.items():
        assert proc.returncode == 0, (experiment, arm, errors[arm][-3000:])
    save_dir = tmp_path / "par" / experiment / "tiny" / "seed_0"
    json.loads((save_dir / "protocol" / "smoke.json").read_text())  # whole, valid files
    configs = [json.loads(p.read_text()) for p in (save_dir / "configs").glob("*.json")]
    assert sorted(c["arm"] for c in configs) == sorted(ARMS)
    for arm in ARMS:
        run_dir = tmp_path / "par" / experiment / "runs" / arm
        record = json.loads((run_dir / "job_record.json").read_text())
        cells = save_dir / "cells" / record["config_id"] / "trial_0" / "smoke.json"
        assert len(json.loads(cells.read_text())["tasks"]) == 1  # every cell complete
        assert _values(run_dir / "results.csv") == sequential[arm]
        assert record["results_reused"] is False
        if arm == "baseline":
            continue
        path = run_dir / "paired_deltas.csv"
        deltas = list(csv.DictReader(path.open())) if path.exists() else []
        assert {r["config_id"] for r in deltas} <= {record["config_id"]}
        # the baseline may still be running: the tasks it lacks are named, the others have deltas
        covered = {f"smoke/{r['task']}" for r in deltas}
        assert covered | set(record["tasks_without_baseline"]) == {"smoke/steer_hydra/short_answer"}


def test_two_jobs_of_one_configuration_at_once_generate_each_sample_once(compose_cfg, tmp_path, monkeypatch, caplog):
    from inspect_ai.log import list_eval_logs, read_eval_log

    cfg = compose_cfg(
        ["model=tiny", "suite.limit=2", "suite.generate_overrides.max_tokens=4", "logger=none", "progress=false"]
        + [f"output_root={tmp_path}"]
    )
    plans = [JobPlan.from_config(cfg) for _ in range(2)]
    both_claimed = threading.Barrier(2)
    claim = JobPlan.claim_protocol

    def claim_together(self, *cell, **kwargs):  # both jobs reach the cell before either evaluates it
        claim(self, *cell, **kwargs)
        both_claimed.wait(120)

    monkeypatch.setattr(JobPlan, "claim_protocol", claim_together)
    errors = []

    def job(plan):  # what run_job does around the evaluation
        try:
            plan.check_protocol()
            plan.runner().run()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(repr(error))
        finally:
            plan.release_claim()

    threads = [threading.Thread(target=job, args=(plan,)) for plan in plans]
    with caplog.at_level(logging.INFO, logger="steer_hydra.evaluation.runner"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not errors, errors
    assert "Waiting for another job evaluating this cell" in caplog.text
    cell = plans[0].save_dir / "inspect_logs" / "baseline" / "trial_0" / "smoke"
    logs = [read_eval_log(info) for info in list_eval_logs(str(cell), recursive=True)]
    assert len(logs) == 3 and {log.status for log in logs} == {"success"}  # one log per task
    assert sorted(len(log.samples) for log in logs) == [2, 2, 2]  # each sample generated once
