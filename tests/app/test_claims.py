"""Claims in a shared save_dir: a claim left by a killed job is cleared, a live one is kept, a refusal says what
holds the protocol, and damaged shared files fail in one line before any model loads."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest
from app_helpers import FAST

from steer_hydra.app import job as job_module
from steer_hydra.app.plan import JobPlan
from steer_hydra.core.errors import ConfigError
from steer_hydra.core.files import write_json
from steer_hydra.evaluation import runner as runner_module
from steer_hydra.store.claims import HOLDER_LEASE_S


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plan(compose_cfg, tmp_path, *overrides) -> JobPlan:
    return JobPlan.from_config(compose_cfg([*FAST, f"output_root={tmp_path}", "logger=none", *overrides]))


def _holders(plan: JobPlan) -> list:
    folder = plan.save_dir / "protocol" / "holders"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _claim_as_killed_job(plan: JobPlan, monkeypatch, pid: int) -> None:
    """Claim as the process `pid` would have, and leave the claim behind as a SIGKILL would."""
    with monkeypatch.context() as patch:
        patch.setattr(os, "getpid", lambda: pid)
        plan.claim_protocol()
    stop = getattr(plan, "_holder_stop", None)
    if stop is not None:  # the killed job's refresher died with it
        stop.set()


def test_a_claim_left_by_a_dead_job_is_cleared_and_the_corrected_command_runs(
    compose_cfg, tmp_path, monkeypatch, caplog
):
    killed = _plan(compose_cfg, tmp_path, "suite.limit=3")
    _claim_as_killed_job(killed, monkeypatch, _dead_pid())
    assert killed.protocol_path.exists() and len(_holders(killed)) == 1

    # a later job of the same protocol that fails before any log clears the dead claim on release
    failing = _plan(compose_cfg, tmp_path, "suite.limit=3")
    failing.check_protocol()
    with caplog.at_level(logging.INFO, logger="steer_hydra.app.plan"):
        failing.claim_protocol()
        failing.release_claim()
    assert _holders(failing) == [] and not failing.protocol_path.exists()
    stale = [r for r in caplog.records if "stale claim" in r.getMessage()]
    assert len(stale) == 1 and "its process is gone" in stale[0].getMessage(), caplog.text

    # the same again, and this time the corrected command (another protocol) runs at once
    _claim_as_killed_job(_plan(compose_cfg, tmp_path, "suite.limit=3"), monkeypatch, _dead_pid())
    corrected = compose_cfg([*FAST, f"output_root={tmp_path}", "logger=none", "suite.tasks=[steer_hydra/mcqa]"])
    caplog.clear()
    with caplog.at_level(logging.INFO):
        job_module.run_job(corrected, tmp_path / "corrected")
    assert "stale claim" in caplog.text
    record = json.loads((tmp_path / "corrected" / "job_record.json").read_text())
    assert record["metrics"] and not record["failed_samples"]
    assert json.loads(failing.protocol_path.read_text())["suite"]["limit"] == 2  # the corrected command's protocol
    assert _holders(failing) == []  # its own holder released, the dead one gone


def test_a_live_claim_is_kept_and_the_refusal_says_what_holds_the_protocol(compose_cfg, tmp_path):
    running = _plan(compose_cfg, tmp_path, "suite.limit=3")  # a job of this process: alive
    running.claim_protocol()
    other = _plan(compose_cfg, tmp_path)
    with pytest.raises(ConfigError) as refused:
        other.check_protocol()
    message = str(refused.value)
    assert "suite.limit: 3 -> 2" in message and f"pid {os.getpid()}" in message
    assert (
        "1 running job(s)" in message
        and "No log of the suite exists yet" in message
        and "wait for those jobs" in message
    )
    assert "Inspect log" not in message and "resume those logs" not in message  # there are none
    assert "\n" not in message
    with pytest.raises(ConfigError, match="1 running job"):
        other.claim_protocol()
    assert len(_holders(running)) == 1 and running.protocol_path.exists()

    log = running.save_dir / "inspect_logs" / "baseline" / "trial_0" / "smoke" / "task.eval"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"")  # a log of the suite: the protocol now stays after the job ends
    running.release_claim()
    assert running.protocol_path.exists() and _holders(running) == []
    with pytest.raises(ConfigError) as refused:
        other.check_protocol()
    message = str(refused.value)
    assert "1 Inspect log(s) in inspect_logs/baseline/trial_0/smoke" in message and "running job" not in message
    assert "experiment_name=<new name>" in message


def test_a_claim_from_another_host_is_kept_until_its_lease_expires(compose_cfg, tmp_path, caplog):
    first = _plan(compose_cfg, tmp_path, "suite.limit=3")
    remote = first.save_dir / "protocol" / "holders" / "smoke.elsewhere.4242.abc"
    info = {"suite": "smoke", "host": "elsewhere", "boot_id": "b", "pid_namespace": None, "pid": 4242}
    write_json(remote, {**info, "start_time": 1, "arm": "baseline", "claimed_utc": "2026-01-01T00:00:00Z"})
    first.claim_protocol()
    first.release_claim()
    assert first.protocol_path.exists() and remote.exists()  # the other host's job may still run
    other = _plan(compose_cfg, tmp_path)
    with pytest.raises(ConfigError, match=f"pid 4242 on host elsewhere.*delete {remote}"):
        other.check_protocol()

    old = time.time() - HOLDER_LEASE_S - 60
    os.utime(remote, (old, old))  # its job stopped refreshing it: gone
    other.check_protocol()
    with caplog.at_level(logging.WARNING, logger="steer_hydra.app.plan"):
        other.claim_protocol()
    assert "not refreshed for" in caplog.text and not remote.exists()
    assert json.loads(other.protocol_path.read_text())["suite"]["limit"] == 2
    other.release_claim()


def _no_model(monkeypatch):
    def no_model(self, controls):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(runner_module.PipelineFactory, "steered", no_model)


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "invalid configuration" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_a_damaged_configuration_record_fails_in_one_line_before_any_model_loads(run_main, tmp_path, monkeypatch):
    save_dir = tmp_path / "o" / "default" / "tiny" / "seed_0"
    damaged = save_dir / "configs" / "0123abcd.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"arm": "pas')  # another configuration's record, cut short
    _no_model(monkeypatch)
    code, _, stderr = run_main(*FAST, f"output_root={tmp_path / 'o'}", "logger=none", "arm=pasta")
    line = _error_line(stderr)
    assert code == 1 and str(damaged) in line and "Fix: delete" in line
    assert not (save_dir / "inspect_logs").exists()


def test_a_damaged_protocol_file_fails_in_one_line_while_logs_hold_it(run_main, tmp_path, monkeypatch):
    save_dir = tmp_path / "o" / "default" / "tiny" / "seed_0"
    protocol = save_dir / "protocol" / "smoke.json"
    protocol.parent.mkdir(parents=True)
    protocol.write_text("{")
    log = save_dir / "inspect_logs" / "baseline" / "trial_0" / "smoke" / "task.eval"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"")
    _no_model(monkeypatch)
    code, _, stderr = run_main(*FAST, f"output_root={tmp_path / 'o'}", "logger=none")
    line = _error_line(stderr)
    assert code == 1 and f"{protocol} is damaged" in line and "Fix: " in line and "experiment_name" in line
