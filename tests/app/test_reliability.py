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


# A control that presses Ctrl-C (SIGINT to the job) PRESSES times, once, when the second task's first prompts arrive:
# the first task has finished and logged its samples, the second is running. Later calls press nothing, however the
# collator splits the second task's rows into batches. It counts the prompts it sees in a file.
INTERRUPTING = """
import os, signal, time
from pathlib import Path

from steer_hydra.core import InputControl

SEEN = 0
PRESSED = False


class Interrupting(InputControl):
    supports_batching = True

    def adapt_messages(self, messages_batch, runtime_kwargs):
        global SEEN, PRESSED
        after = int(os.environ.get("INTERRUPT_AFTER", "0"))
        if after and SEEN >= after and not PRESSED:
            PRESSED = True
            for _ in range(int(os.environ["PRESSES"])):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        SEEN += len(messages_batch)
        with open(os.environ["PROMPTS_FILE"], "a") as handle:
            handle.write(f"{len(messages_batch)}\\n")
        return messages_batch
"""

# `python -c WITH_CTRL_C ARGS`: the app with Python's own Ctrl-C handler (a test runner's child may inherit SIGINT
# ignored).
WITH_CTRL_C = """
import signal, sys

from steer_hydra.main import main

signal.signal(signal.SIGINT, signal.default_int_handler)
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


def _samples_in_logs(save_dir: Path) -> dict[str, tuple[str, list[str]]]:
    """`{task: (status, ids of its finished samples)}` of the newest log of each task under save_dir."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    found: dict[str, tuple[str, list[str]]] = {}
    for info in sorted(list_eval_logs(str(save_dir / "inspect_logs")), key=lambda i: i.mtime or 0):
        log = read_eval_log(info.name)
        finished = [str(s.id) for s in log.samples or [] if s.error is None and s.scores]
        found[log.eval.task] = (log.status, finished)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_mid_job_exits_130_writes_no_record_and_loses_no_finished_sample(presses, tmp_path, env):
    """Ctrl-C while the second of three tasks generates: exit 130 with one line, no job record or table, the first
    task's samples kept; the re-run generates exactly the samples no log holds finished. One press lets Inspect
    write the running task's log as `cancelled`; a second press ends the run before it can (its log stays
    `started`), with the same line and the same resume."""
    arms = tmp_path / "user_conf" / "arm"
    arms.mkdir(parents=True)
    (arms / "interrupting.yaml").write_text(
        "# @package arm\nname: interrupting\ncontrols:\n  r:\n    _target_: interrupting_controls.Interrupting\n"
    )
    (tmp_path / "interrupting_controls.py").write_text(INTERRUPTING)
    prompts = tmp_path / "prompts.txt"
    limit = 4
    args = [
        "model=tiny",
        f"output_root={tmp_path / 'outputs'}",
        "logger=none",
        "progress=false",
        f"+api_token={SECRET}",
        f"suite.limit={limit}",
        "suite.generate_overrides.max_tokens=8",
        "arm=interrupting",
        f"hydra.searchpath=[file://{tmp_path / 'user_conf'}]",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PROMPTS_FILE": str(prompts),
        "PRESSES": str(presses),
        "HYDRA_FULL_ERROR": "0",
    }

    def run(**extra: str) -> subprocess.CompletedProcess:
        prompts.write_text("")
        return subprocess.run(
            [sys.executable, "-c", WITH_CTRL_C, *args],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )

    interrupted = run(INTERRUPT_AFTER=str(limit))  # the first task's prompts are all through
    assert interrupted.returncode == 130, interrupted.stderr[-3000:]
    lines = [line for line in interrupted.stderr.splitlines() if line.startswith("steer_hydra: interrupted")]
    assert len(lines) == 1 and "Traceback" not in interrupted.stderr, interrupted.stderr[-3000:]
    assert "re-run the same command" in lines[0] and "did not finish" in lines[0]
    assert "terminate called" not in interrupted.stderr  # no thread left generating at exit
    assert not list((tmp_path / "outputs").rglob("job_record.json"))  # nothing that looks like a finished job
    assert not list((tmp_path / "outputs").rglob("results.csv")) and "Objective" not in interrupted.stdout
    kept = _samples_in_logs(_save_dir(tmp_path))
    assert kept["steer_hydra/short_answer"] == ("success", [f"sa-{i:02d}" for i in range(1, limit + 1)])
    if presses == 1:
        assert any(status == "cancelled" for status, _ in kept.values()), kept
    finished = sum(len(ids) for _, ids in kept.values())

    resumed = run()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    generated = sum(int(n) for n in prompts.read_text().split())
    assert generated == 3 * limit - finished  # every finished sample reused, every other one generated once
    assert len(list((tmp_path / "outputs").rglob("job_record.json"))) == 1
    done = _samples_in_logs(_save_dir(tmp_path))
    assert {task: (status, len(ids)) for task, (status, ids) in done.items()} == {
        task: ("success", limit) for task in done
    } and len(done) == 3
    assert _leaks(tmp_path, [interrupted.stdout, interrupted.stderr, resumed.stdout, resumed.stderr]) == []


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


@pytest.mark.slow
def test_a_ray_sweep_whose_cluster_cannot_be_reached_ends_in_one_line_within_seconds(run_app, tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    started = time.monotonic()
    done = run_app(
        "--multirun",
        *FAST,
        "logger=none",
        f"output_root={tmp_path / 'outputs'}",
        "hydra/launcher=ray",
        "hydra.launcher.ray.init.connect_timeout=3",
        env={"RAY_ADDRESS": "127.0.0.1:1"},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("steer_hydra: Ray:")]
    assert len(lines) == 1 and "RAY_ADDRESS=127.0.0.1:1" in lines[0] and "Fix:" in lines[0]
    assert time.monotonic() - started < 120  # Ray alone retries this address for about 14 minutes
    assert not list((tmp_path / "outputs").rglob("multirun.yaml"))  # no sweep folder left behind


@pytest.mark.slow
def test_a_refused_job_of_a_sweep_fails_alone_and_the_later_jobs_run(run_app, tmp_path):
    done = run_app("--multirun", *FAST, "logger=none", f"output_root={tmp_path / 'outputs'}", "num_trials=0,1")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "invalid configuration" in line]
    assert len(lines) == 1 and "num_trials=0" in lines[0] and "Traceback" not in done.stderr
    (record,) = (tmp_path / "outputs").rglob("job_record.json")  # the job after the refused one ran
    assert json.loads(record.read_text())["trial_ids"] == [0]
    (missing,) = (tmp_path / "outputs").rglob("missing_cells.json")
    assert len(json.loads(missing.read_text())) == 1 and "num_trials=0" in missing.read_text()


@pytest.mark.slow
def test_a_sweep_of_a_protocol_key_within_one_save_dir_is_refused_before_any_job(run_app, tmp_path):
    done = run_app("--multirun", *FAST, "logger=none", f"output_root={tmp_path / 'outputs'}", "suite.limit=1,2,3")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("steer_hydra: invalid sweep:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "suite.limit: 1 -> 2" in lines[0] and "experiment_name" in lines[0] and "Fix:" in lines[0]
    assert not (tmp_path / "outputs").exists()  # nothing launched, nothing written
