"""Shared by the real-cluster tests (Ray, SLURM): the sweep they run, a one-shot job killer, a secret probe, and the
checks every launcher must pass (results equal a serial sweep's sample for sample; a killed job is named in
`missing_cells.json` and completed by its printed command)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
from app_helpers import FAST, files_holding

# The README's cluster sweep on the tiny model; logger=none: W&B is not what these tests check.
SWEEP = ["--multirun", "arm=baseline,pasta", "seed=1,2", *FAST, "logger=none"]
SECRET = "SENTINEL_cluster_token_7f3a"  # a secret-named override every cluster sweep carries

CALLBACKS = '''
"""Test-only Hydra callbacks, run inside each job wherever the launcher puts it."""
import hashlib
import os
import signal
from pathlib import Path

from hydra.experimental.callback import Callback


class KillOnce(Callback):
    """SIGKILLs the job (arm, seed) at its first generation, as an out-of-memory kill or a lost node would,
    unless `marker` exists (the test creates it before completing the job by its printed command)."""

    def __init__(self, arm, seed, marker):
        self.arm, self.seed, self.marker = arm, int(seed), marker

    def on_job_start(self, config, **kwargs):
        if config.arm.name != self.arm or int(config.seed) != self.seed or Path(self.marker).exists():
            return
        from steer_hydra.core.pipeline import SteeringPipeline

        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        SteeringPipeline.generate = SteeringPipeline.admit_refill = killed  # the first request, either mode


class SecretProbe(Callback):
    """Writes the digest of the secret the job resolved, so the test knows the job got the value."""

    def __init__(self, out):
        self.out = out

    def on_job_start(self, config, **kwargs):
        digest = hashlib.sha256(str(config.secret_token).encode()).hexdigest()
        Path(self.out, f"{config.arm.name}_{config.seed}.txt").write_text(digest)
'''


def install_callbacks(root: Path, killed: tuple[str, int]) -> tuple[list[str], Path, Path]:
    """Write the test callbacks under `root/plugins`; returns the overrides that add them to a sweep (the job
    `killed` = (arm, seed) is SIGKILLed at its first generation), the folder to put on PYTHONPATH (of the launching
    process and of every node), and the killer's marker file."""
    plugins = root / "plugins"
    probes = root / "probes"
    plugins.mkdir(parents=True, exist_ok=True)
    probes.mkdir(exist_ok=True)
    (plugins / "cluster_callbacks.py").write_text(CALLBACKS)
    marker = root / "completing"
    overrides = [
        "+hydra.callbacks.kill._target_=cluster_callbacks.KillOnce",
        f"+hydra.callbacks.kill.arm={killed[0]}",
        f"+hydra.callbacks.kill.seed={killed[1]}",
        f"+hydra.callbacks.kill.marker={marker}",
        "+hydra.callbacks.probe._target_=cluster_callbacks.SecretProbe",
        f"+hydra.callbacks.probe.out={probes}",
    ]
    return overrides, plugins, marker


def run_steer_hydra(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m steer_hydra ARGS` (or `-m steer_hydra.aggregate` when args start with it), offline."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **env}
    full_env.pop("PYTEST_CURRENT_TEST", None)
    command = [sys.executable, "-m", "steer_hydra", *args]
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def the_sweep(root: Path) -> Path:
    (sweep,) = (root / "outputs" / "default" / "multiruns").iterdir()
    return sweep


def sweep_samples(sweep: Path) -> pd.DataFrame:
    """The sweep aggregate's samples (every configuration, seed, trial, sample, scorer), in one order."""
    frame = pd.read_csv(sweep / "aggregate" / "samples.csv")
    keys = ["config_id", "seed", "trial_id", "suite", "task", "sample_id", "scorer"]
    return frame.sort_values(keys).reset_index(drop=True)


def serial_reference(root: Path, env: dict[str, str]) -> pd.DataFrame:
    """The same sweep with Hydra's basic launcher (one job after another, in one process), its samples."""
    root.mkdir(parents=True, exist_ok=True)
    proc = run_steer_hydra([*SWEEP, f"+secret_token={SECRET}"], root, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_samples(the_sweep(root))


def check_killed_job_is_missing(sweep: Path, console: str, killed: tuple[str, int]) -> dict:
    """The killed job, and only it, is in `missing_cells.json` with a command; the console names it."""
    (missing,) = json.loads((sweep / "aggregate" / "missing_cells.json").read_text())
    arm, seed = killed
    assert f"arm={arm}" in missing["overrides"] and f"seed={seed}" in missing["overrides"], missing
    assert missing["command"].startswith("python -m steer_hydra ") and f"hydra.run.dir={sweep}" in missing["command"]
    assert missing["command"] in console
    return missing


def complete_and_reaggregate(sweep: Path, missing: dict, marker: Path, cwd: Path, env: dict[str, str]) -> None:
    """Run the printed command (the killer spares it: `marker` exists), then `python -m steer_hydra.aggregate`,
    which must find no job missing."""
    marker.write_text("")
    # the printed command shows the secret as ***: the user puts the value back, as here
    args = [a.replace("***", SECRET) for a in shlex.split(missing["command"])[3:]]  # after `python -m steer_hydra`
    assert f"+secret_token={SECRET}" in args
    completed = run_steer_hydra(args, cwd, env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    again = subprocess.run(
        [sys.executable, "-m", "steer_hydra.aggregate", str(sweep), "--no-tracking"],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((sweep / "aggregate" / "missing_cells.json").read_text()) == []


def check_equal_to_serial(sweep: Path, serial: pd.DataFrame) -> int:
    """The cluster sweep's samples equal the serial sweep's, sample for sample (outputs and scores); returns how
    many rows were compared."""
    cluster = sweep_samples(sweep)
    assert len(cluster) == len(serial) > 0
    pd.testing.assert_frame_equal(cluster, serial)
    return len(cluster)


def check_secret(root: Path, console: str) -> None:
    """Every job resolved the secret's value; no file under the outputs and no console line holds it."""
    probes = sorted((root / "probes").glob("*.txt"))
    assert probes and {p.read_text() for p in probes} == {hashlib.sha256(SECRET.encode()).hexdigest()}
    assert files_holding(root / "outputs", (SECRET,)) == []
    assert SECRET not in console
