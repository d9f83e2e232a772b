"""`hydra/launcher=submitit_slurm` on a real one-node SLURM cluster (`eval "$(scripts/slurm_start.sh)"`): every job
is a task of one array job, the results equal a serial sweep's sample for sample, a job killed mid-run is named in
`missing_cells.json` and completed by its printed command, and the secret reaches the jobs but no file."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from app_helpers import job_records
from cluster_helpers import (
    SECRET,
    SWEEP,
    check_equal_to_serial,
    check_killed_job_is_missing,
    check_secret,
    complete_and_reaggregate,
    install_callbacks,
    run_steer_hydra,
    the_sweep,
)

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install 'steer_hydra[launchers]'")
pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(900)]
# The README's SLURM command as run here: this cluster's partition and a CPU job's resources (on a GPU cluster:
# hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1 hydra.launcher.mem_gb=64 hydra.launcher.timeout_min=240)
SLURM = [
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.partition=debug",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.timeout_min=20",
]
# the last job: submitit's launcher collects results in job order and stops at the first job that died, so jobs
# after it would still be running on SLURM when the sweep reports (they finish; a re-aggregation picks them up)
KILLED = ("pasta", 2)


@pytest.fixture
def slurm_cluster():
    """The running cluster SLURM_CONF names (scripts/slurm_start.sh starts one; .ci/run does)."""
    if not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
        pytest.skip('no SLURM cluster: as root, eval "$(scripts/slurm_start.sh)" starts one on this machine')
    state = subprocess.run(["sinfo", "-h", "-o", "%P %T"], capture_output=True, text=True, timeout=30)
    assert state.returncode == 0 and "debug" in state.stdout, state.stdout + state.stderr
    return state.stdout.strip()


def test_a_submitit_slurm_sweep_runs_as_array_tasks_and_equals_the_serial_sweep(
    slurm_cluster, serial_cluster_sweep, tmp_path, record_property
):
    kill, plugins, marker = install_callbacks(tmp_path, KILLED)
    # sbatch hands the job the submitting environment (--export=ALL): PYTHONPATH and the secret's variable
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    launch_dir = tmp_path / "slurm"
    launch_dir.mkdir()
    proc = run_steer_hydra([*SWEEP, *SLURM, *kill, f"+secret_token={SECRET}"], launch_dir, env)
    console = proc.stdout + proc.stderr
    assert proc.returncode != 0, console[-3000:]  # a job was killed
    sweep = the_sweep(launch_dir)
    records = job_records(sweep)
    arrays = {r["placement"].get("slurm_array_job_id") for r in records}
    tasks = sorted(int(r["placement"]["slurm_array_task_id"]) for r in records)
    assert len(records) == 3 and len(arrays) == 1 and None not in arrays, console[-3000:]  # one array job
    assert tasks == [0, 1, 2]  # the killed job was task 3
    missing = check_killed_job_is_missing(sweep, console, KILLED)
    check_secret(tmp_path, console)

    complete_and_reaggregate(sweep, missing, marker, launch_dir, env)
    compared = check_equal_to_serial(sweep, serial_cluster_sweep)
    (array,) = arrays
    record_property("slurm_array", f"array job {array}, tasks {tasks} finished, task 3 killed and completed")
    record_property("slurm_equal_to_serial", f"{compared}/{compared} sample rows equal")
    print(f"SLURM: array job {array} tasks {tasks}; {compared} sample rows equal to the serial sweep")
