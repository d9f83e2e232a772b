"""Reliability suite: jobs killed at their claim, damaged logs, cell indexes and configuration records, and failures of
every kind. After each, the next command works (or is refused in one line naming the file or key and the fix), and
no file under the output root and no console line holds the sentinel secret. A submitit sweep with a failing job
(the launcher's pickles) is in test_secrets.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from app_helpers import FAST, files_holding

SECRET = "SENTINEL_reliability_fff666"  # given as +api_token=...
ENV_SECRET = "hf_SENTINEL_reliability_ggg777"  # in the environment as HF_TOKEN
SECRETS = (SECRET, ENV_SECRET)
SUITE = "smoke"

# A control that fails every sample as a refusing server would, quoting the environment's token in its error.
CONTROLS = """
import os

from steer_hydra.core import InputControl


class Refused(InputControl):
    supports_batching = True

    def adapt_messages(self, messages_batch, runtime_kwargs):
        raise RuntimeError(f"the server refused token {os.environ['HF_TOKEN']}")
"""

# `python -c KILL_AT_CLAIM ARGS`: the app, with the protocol claim followed by a marker file and a long sleep, so the
# test can kill the job right after its claim and before its first log.
KILL_AT_CLAIM = """
import os, sys, time
from pathlib import Path

from steer_hydra.app.plan import JobPlan
from steer_hydra.main import main

claim = JobPlan.claim_protocol


def claim_then_hang(self, *args, **kwargs):
    claim(self, *args, **kwargs)
    Path(os.environ["CLAIMED_MARKER"]).write_text("claimed")
    time.sleep(600)


JobPlan.claim_protocol = claim_then_hang
sys.argv[0] = "steer_hydra"
main()
"""


def _job(tmp_path: Path, *overrides: str) -> list[str]:
    return [*FAST, f"output_root={tmp_path / 'outputs'}", "logger=none", f"+api_token={SECRET}", *overrides]


def _save_dir(tmp_path: Path) -> Path:
    return tmp_path / "outputs" / "default" / "tiny" / "seed_0"


def _leaks(tmp_path: Path, consoles: list[str]) -> list[str]:
    """Files under the output root and consoles that hold a sentinel secret."""
    found = files_holding(tmp_path / "outputs", SECRETS)
    return found + [f"console {i}" for i, text in enumerate(consoles) for s in SECRETS if s in text]


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "invalid configuration" in line]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.fixture
def env(monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_job_killed_at_its_claim_does_not_block_the_corrected_command(sig, run_main, tmp_path, env):
    marker = tmp_path / "claimed"
    killed = subprocess.Popen(
        [sys.executable, "-c", KILL_AT_CLAIM, *_job(tmp_path, "suite.limit=3")],
        cwd=tmp_path,
        env={**os.environ, "CLAIMED_MARKER": str(marker)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not marker.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), killed.communicate(timeout=30)[1][-3000:] if killed.poll() is not None else "no claim"
    killed.send_signal(sig)
    out, err = killed.communicate(timeout=60)
    protocol = _save_dir(tmp_path) / "protocol"
    assert (protocol / f"{SUITE}.json").is_file() and list((protocol / "holders").iterdir())  # left behind
    assert not list(_save_dir(tmp_path).rglob("*.eval"))  # killed before its first log

    code, fixed_out, fixed_err = run_main(*_job(tmp_path, "suite.limit=2"))  # another protocol: the claim is stale
    assert code == 0, fixed_err[-3000:]
    assert f"Clearing a stale claim on suite {SUITE}" in fixed_out + fixed_err
    assert json.loads((protocol / f"{SUITE}.json").read_text())  # now the corrected job's protocol
    assert not list((protocol / "holders").iterdir())
    assert _leaks(tmp_path, [out, err, fixed_out, fixed_err]) == []


def test_damaged_logs_indexes_and_records_are_recovered_or_refused_in_one_line(run_main, tmp_path, env):
    consoles: list[str] = []

    def run(*overrides: str) -> tuple[int, str]:
        code, out, err = run_main(*_job(tmp_path, *overrides))
        consoles.extend([out, err])
        return code, out + err

    code, text = run()
    assert code == 0, text[-3000:]
    save = _save_dir(tmp_path)
    logs = sorted((save / "inspect_logs").rglob("*.eval"))
    log = logs[0]  # one task's log
    (index,) = (save / "cells").rglob(f"{SUITE}.json")
    (record,) = (save / "configs").glob("*.json")

    log.write_bytes(log.read_bytes()[:100])  # truncated: e.g. a copy cut short
    code, text = run()
    assert code == 0, text[-3000:]
    assert f"Unreadable Inspect log {log}" in text and "moved aside" in text
    assert Path(f"{log}.unreadable").is_file() and not log.exists()
    assert len(list(log.parent.glob("*.eval"))) == len(logs)  # its task evaluated again

    index.write_text("{not json")
    code, text = run()
    assert code == 0 and f"Cell index {index} is damaged" in text, text[-3000:]
    assert json.loads(index.read_text())["tasks"]  # rewritten

    record.write_text('{"arm": "basel')
    code, text = run()
    line = _one_error_line(text)
    assert code == 1 and str(record) in line and "Fix: delete" in line
    record.unlink()  # as the line says
    code, text = run()
    assert code == 0 and "are complete" in text and "no model loaded" in text, text[-3000:]
    assert _leaks(tmp_path, consoles) == []


FAILURES = {
    "server down": (["backend=vllm_serve", "backend.options.base_url=http://127.0.0.1:1"], "backend.options.base_url"),
    "no trials": (["num_trials=0"], "num_trials=0"),
    "layer out of range": (["arm=actadd", "arm.controls.actadd.layer_id=7"], "arm.controls.actadd.layer_id=7"),
    "name escapes": (["experiment_name=../../escape"], "experiment_name='../../escape'"),
    "fail_on_error=false": (["+suite.generate_overrides.fail_on_error=false"], "fail_on_error=False"),
}


@pytest.mark.parametrize("kind", list(FAILURES))
def test_a_refused_job_says_one_line_and_shows_no_secret(kind, run_main, tmp_path, env):
    overrides, named = FAILURES[kind]
    code, out, err = run_main(*_job(tmp_path, *overrides))
    line = _one_error_line(out + err)
    assert code == 1 and named in line and "Fix:" in line
    assert not (tmp_path.parent / "escape").exists() and not (tmp_path / "outputs" / "default" / "tiny").exists()
    assert _leaks(tmp_path, [out, err]) == []


def _refusing_arm(tmp_path: Path) -> str:
    """Arm `refused` (every sample fails, its error quoting HF_TOKEN) in a user config dir; the searchpath override."""
    arms = tmp_path / "user_conf" / "arm"
    arms.mkdir(parents=True)
    (arms / "refused.yaml").write_text(
        "# @package arm\nname: refused\ncontrols:\n  r:\n    _target_: reliability_controls.Refused\n"
    )
    (tmp_path / "reliability_controls.py").write_text(CONTROLS)
    return f"hydra.searchpath=[file://{tmp_path / 'user_conf'}]"


def test_a_job_whose_samples_all_fail_shows_and_writes_no_secret(run_main, tmp_path, env, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_main(*_job(tmp_path, "arm=refused", _refusing_arm(tmp_path)))
    assert code == 1 and "Error executing job with overrides" in err, err[-3000:]
    assert "+api_token=***" in err and "the server refused token ***" in err
    assert _leaks(tmp_path, [out, err]) == []
