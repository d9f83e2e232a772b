"""`hydra/launcher=ray` on a real two-node Ray cluster on this machine (a head and a joined node, one CPU each):
jobs run on both nodes, the results equal a serial sweep's sample for sample, a job killed mid-run is named in
`missing_cells.json` and completed by its printed command, the secret reaches the jobs but no file, and the study
sweeper launches through it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from app_helpers import FAST, job_records
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

pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install 'steer_hydra[launchers]'")
pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(900)]
RAY = str(Path(sys.executable).with_name("ray"))
KILLED = ("baseline", 2)  # job 1 of 4: the jobs launched after it must still finish


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray(*args: str, cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run([RAY, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head (`ray start --head`) and a second node joining it, one CPU each; yields (address, node env, the folder
    holding the test callbacks); `ray stop` in finally. The nodes get the callbacks' folder on PYTHONPATH, as a
    cluster's nodes get the user's code."""
    root = tmp_path_factory.mktemp("ray")
    _, plugins, _ = install_callbacks(root, KILLED)
    node_dir = root / "ray_nodes"  # the nodes' working directory: not where the sweeps are launched
    node_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    address = f"127.0.0.1:{_free_port()}"
    try:
        _ray("start", "--head", f"--port={address.split(':')[1]}", "--num-cpus=1", "--include-dashboard=false",
             cwd=node_dir, env=env)  # fmt: skip
        _ray("start", f"--address={address}", "--num-cpus=1", cwd=node_dir, env=env)
        yield address, env, root
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(node_dir, ignore_errors=True)


def test_a_sweep_on_a_two_node_ray_cluster_equals_the_serial_sweep(ray_cluster, serial_cluster_sweep, record_property):
    address, node_env, root = ray_cluster
    kill, plugins, marker = install_callbacks(root, KILLED)
    env = {"PYTHONPATH": node_env["PYTHONPATH"], "RAY_ADDRESS": address}
    launch_dir = root / "sweep"
    launch_dir.mkdir()
    # the README's Ray command (RAY_ADDRESS names the cluster, as `address: auto` reads it), the tiny model
    proc = run_steer_hydra([*SWEEP, "hydra/launcher=ray", *kill, f"+secret_token={SECRET}"], launch_dir, env)
    console = proc.stdout + proc.stderr
    assert proc.returncode != 0, console[-3000:]  # a job was killed
    sweep = the_sweep(launch_dir)
    records = job_records(sweep)
    nodes = {r["placement"]["ray_node_id"] for r in records}
    assert len(records) == 3 and len(nodes) == 2, console[-4000:]  # both nodes ran jobs
    missing = check_killed_job_is_missing(sweep, console, KILLED)
    check_secret(root, console)

    complete_and_reaggregate(sweep, missing, marker, launch_dir, env)
    compared = check_equal_to_serial(sweep, serial_cluster_sweep)
    record_property("ray_nodes", f"{len(nodes)} nodes ran {len(records)} jobs: {sorted(nodes)}")
    record_property("ray_equal_to_serial", f"{compared}/{compared} sample rows equal")
    print(f"Ray: {len(records)} jobs on nodes {sorted(nodes)}; {compared} sample rows equal to the serial sweep")


def test_the_study_sweeper_launches_its_jobs_on_ray(ray_cluster, tmp_path):
    """A concept study (dev jobs, the choice on dev, then test and cost jobs) whose every job runs on the cluster."""
    address, node_env, _ = ray_cluster
    env = {"PYTHONPATH": node_env["PYTHONPATH"], "RAY_ADDRESS": address}
    args = ["--multirun", "experiment=concept_steering", "arm=baseline,caa_concept", "strength=0.5", "concept=joy"]
    proc = run_steer_hydra([*args, *FAST, "logger=none", "hydra/launcher=ray"], tmp_path, env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (sweep,) = (tmp_path / "outputs" / "concept_steering" / "multiruns").iterdir()
    launched = pd.read_csv(sweep / "study" / "launched.csv")
    records = job_records(sweep)
    assert len(records) == len(launched) >= 6 and set(launched["stage"]) == {"dev", "test", "cost"}
    assert all(r["placement"].get("ray_node_id") for r in records)  # every job ran on a Ray worker
    assert json.loads((sweep / "aggregate" / "missing_cells.json").read_text()) == []
    summary = pd.read_csv(sweep / "study" / "study_summary.csv")
    assert set(summary["arm_name"]) == {"baseline", "caa_concept"}
