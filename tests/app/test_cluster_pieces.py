"""What lets a job run on another machine than the launching one: paths resolved against the launch directory, the
secrets' variables forwarded to Ray's workers, where the job ran in its record, progress lines only where counted.
The real clusters run in test_ray_cluster.py and test_slurm_cluster.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

from steer_hydra.app.callbacks import SweepAggregator, SweepProgress
from steer_hydra.app.job import placement
from steer_hydra.app.redaction import forward_environment_to_ray


def test_a_relative_output_root_resolves_against_the_launch_directory_wherever_the_job_runs(
    compose_cfg, tmp_path, monkeypatch
):
    launch, node = tmp_path / "launch", tmp_path / "node"
    launch.mkdir()
    node.mkdir()
    monkeypatch.chdir(launch)
    cfg = compose_cfg(["output_root=outs", "seed=3"], return_hydra_config=True)
    job_cfg = compose_cfg(["output_root=outs", "seed=3"])  # a job's config: no hydra node, HydraConfig holds it
    monkeypatch.chdir(node)  # a Ray worker starts where its node's `ray start` ran
    expected = launch / "outs" / "default" / "tiny" / "seed_3"
    assert Path(cfg.save_dir) == expected and Path(job_cfg.save_dir) == expected
    assert Path(cfg.hydra.sweep.dir).parent == launch / "outs" / "default" / "multiruns"
    absolute = compose_cfg([f"output_root={tmp_path / 'abs'}"])
    assert Path(absolute.save_dir).parent.parent.parent == tmp_path / "abs"


def test_secret_variables_travel_in_rays_runtime_env_as_references_only(monkeypatch):
    name = "STEER_HYDRA_SECRET_API_TOKEN"
    monkeypatch.setenv(name, "value-7")
    ray = OmegaConf.create({"hydra": {"launcher": {"ray": {"init": {"address": "auto"}, "remote": {}}}}})
    forward_environment_to_ray(ray, [name])
    env_vars = ray.hydra.launcher.ray.init.runtime_env.env_vars
    assert OmegaConf.to_container(env_vars, resolve=False) == {name: "${oc.env:" + name + "}"}  # no value stored
    assert OmegaConf.to_container(ray.hydra.launcher.ray.init, resolve=True)["runtime_env"]["env_vars"] == {
        name: "value-7"  # what the launcher hands Ray when it connects
    }
    other = OmegaConf.create({"hydra": {"launcher": {"_target_": "x.SlurmLauncher", "partition": "gpu"}}})
    forward_environment_to_ray(other, [name])
    assert "ray" not in other.hydra.launcher and "runtime_env" not in str(other)


def test_the_job_record_says_where_the_job_ran(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURMD_NODENAME"):
        monkeypatch.delenv(name, raising=False)
    here = placement()
    assert here["pid"] == os.getpid() and here["host"] and "ray_node_id" not in here and "slurm_job_id" not in here
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "40")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-07")
    on_slurm = placement()
    assert on_slurm["slurm_job_id"] == "41" and on_slurm["slurm_array_job_id"] == "40"
    assert on_slurm["slurm_array_task_id"] == "1" and on_slurm["slurmd_nodename"] == "gpu-07"


def test_a_launchers_worker_counts_progress_from_the_job_records_written_since_the_sweep_began(tmp_path, caplog):
    callback = SweepAggregator()
    callback._progress = SweepProgress(total=4, sweep_dir=tmp_path)
    with caplog.at_level(logging.INFO):
        callback.on_job_end(config=None, job_return=None)
        assert "Sweep: 1/4 job(s) done" in caplog.text  # the launching process counts its own jobs
        caplog.clear()
        old = tmp_path / "0_earlier" / "job_record.json"  # a record of an earlier sweep into the same dir
        old.parent.mkdir()
        old.write_text("{}")
        os.utime(old, (callback._progress.started - 60,) * 2)
        for job in ("1_a", "2_b", "3_c"):  # three jobs finished in the launcher's worker processes
            (tmp_path / job).mkdir()
            (tmp_path / job / "job_record.json").write_text("{}")
        callback._progress.pid = os.getpid() + 1  # a copy of the callback pickled into a launcher's worker
        callback.on_job_end(config=None, job_return=None)
    assert "Sweep: 3/4 job(s) done" in caplog.text and "about" in caplog.text


def test_a_ray_cluster_that_cannot_be_reached_is_named_in_one_line_within_the_bound(monkeypatch):
    import socket
    import time

    from hydra_plugins.steer_hydra_ray import ray_launcher

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_launcher, "_bootstrap_address", lambda: None)
    assert ray_launcher.ray_address_problem({"address": None}) is None  # a private instance needs no cluster
    nothing = ray_launcher.ray_address_problem({"address": "auto"})
    assert "no Ray cluster to join (RAY_ADDRESS is unset" in nothing and "address=null" in nothing

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    started = time.monotonic()
    refused = ray_launcher.ray_address_problem({"address": "auto"}, timeout=2.0)
    assert refused.startswith("RAY_ADDRESS=127.0.0.1:1: nothing accepts connections there within 2s")
    assert "ConnectionRefusedError" in refused and "Fix: start the cluster's head" in refused
    assert time.monotonic() - started < 4.0
    explicit = ray_launcher.ray_address_problem({"address": "ray://127.0.0.1:1"}, timeout=2.0)
    assert explicit.startswith("hydra.launcher.ray.init.address=ray://127.0.0.1:1: nothing accepts")
    with socket.socket() as head:  # something listening: Ray is left to connect
        head.bind(("127.0.0.1", 0))
        head.listen()
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{head.getsockname()[1]}")
        assert ray_launcher.ray_address_problem({"address": "auto"}) is None


def test_a_sweep_refused_before_any_job_leaves_no_folder_and_no_aggregate(tmp_path, caplog):
    from steer_hydra.app.callbacks import SweepAggregator

    sweep = tmp_path / "multiruns" / "2026-01-01_00-00-00_000000"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    callback = SweepAggregator()
    callback._pending = (str(sweep), OmegaConf.create({}))
    with caplog.at_level(logging.INFO):
        callback._after_failure()
    assert not sweep.exists() and "left no results" not in caplog.text and "aggregating" not in caplog.text
