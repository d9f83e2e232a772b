"""submitit_local: a process per job; a killed job is named by the aggregate of the rest, and the sweep is
re-aggregated from its directory."""

from __future__ import annotations

import csv
import json
import logging
import os

import pytest
from app_helpers import FAST, job_records, sweep_dir

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
def test_submitit_local_runs_jobs_in_their_own_processes_and_a_killed_one_is_named(run_app, tmp_path, caplog):
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
    sweep = sweep_dir(tmp_path)
    records = job_records(sweep)
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
    from steer_hydra.aggregate import main as aggregate_main

    with caplog.at_level(logging.WARNING):
        code = aggregate_main([str(sweep), "--no-tracking"])  # the re-aggregation command, in this process
    assert code == 1  # re-aggregated, still one job missing
    assert "arm=killer" in caplog.text and (sweep / "aggregate" / "paired_deltas.csv").exists()
