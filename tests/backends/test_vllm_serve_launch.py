"""backend.options.launch=true on real vLLM: one launched server runs a CAA sweep of the app like backend=vllm, and
no server process outlives the sweep (success, a failed job, Ctrl-C).

Each sweep is `python -m steer_hydra --multirun` in a subprocess (offline, logger=none) on the tiny head-dim-64
model in float32, with a CAA arm whose vector is given (a file) and one whose vector is fitted from pairs: a launched
server runs the model group's checkpoint, so the vector is fitted on its Hugging Face model first (the cache
backend=vllm uses) and sent as a given vector. Sweeps that do not depend on each other run at the same time to keep
the file short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from vllm_real import HIDDEN, TINY64, finish_sweep, start_sweep

from steer_hydra.backends.vllm.launch import group_alive
from steer_hydra.controls.state.vectors import SteeringVector

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
SWEEP_TIMEOUT_S = 600
FITTED_ARM = """# @package arm
defaults:
  - /control@controls.caa: caa
name: caa_fitted
controls:
  caa:
    layer_id: 1
    multiplier: 8.0
"""
ARM = """# @package arm
defaults:
  - /control@controls.caa: caa
name: {name}
controls:
  caa:
    data: null
    steering_vector: {vector}
    layer_id: 1
    multiplier: 8.0
"""
LAUNCH = ["backend=vllm_serve", "backend.options.launch=true", "backend.options.launch_args=[--max-model-len,512]"]
ENGINE = ["backend=vllm", "backend.options.max_model_len=512"]
KEY = ["arm", "seed", "task", "sample_id"]
# A test callback that holds job 1 of a sweep (after writing `marker`), so Ctrl-C lands mid-sweep whatever the timing.
HOLD = """
import time
from pathlib import Path

from hydra.experimental.callback import Callback


class Hold(Callback):
    def __init__(self, marker):
        self.marker = marker

    def on_job_start(self, config, **kwargs):
        if int(config.hydra.job.num) == 1:
            Path(self.marker).write_text("")
            time.sleep(300)
"""


@pytest.fixture(scope="module")
def conf(tmp_path_factory) -> Path:
    """A config dir with arm `caa_given` (a random vector for the tiny64 model) and `caa_broken` (a vector of the
    wrong width: the job raises when it steers), and the `Hold` callback's module (`holdjob.py`, on PYTHONPATH)."""
    root = tmp_path_factory.mktemp("conf")
    (root / "holdjob.py").write_text(HOLD)
    generator = torch.Generator().manual_seed(0)
    for name, width in (("caa_given", HIDDEN), ("caa_broken", HIDDEN // 2)):
        vector = SteeringVector(torch.randn(width, generator=generator), layer=1).save(root / f"{name}.safetensors")
        (root / "arm").mkdir(exist_ok=True)
        (root / "arm" / f"{name}.yaml").write_text(ARM.format(name=name, vector=vector))
    (root / "arm" / "caa_fitted.yaml").write_text(FITTED_ARM)  # conf/control/caa.yaml's pairs, fitted
    return root


def _sweep(cwd: Path, conf: Path, *args: str) -> subprocess.Popen:
    """Start `python -m steer_hydra --multirun ...` of the tiny64 model in `cwd`, with `conf` on the search path."""
    command = ["model=tiny", f"model.model_name_or_path='{TINY64}'", "+model.hf_model_kwargs.dtype=float32"]
    command += ["suite.limit=2", "suite.generate_overrides.max_tokens=8", "progress=false", "logger=none"]
    pythonpath = os.pathsep.join([str(conf), os.environ.get("PYTHONPATH", "")])
    return start_sweep(cwd, [*command, f"hydra.searchpath=[file://{conf}]", *args], PYTHONPATH=pythonpath)


def _finish(process: subprocess.Popen, cwd: Path) -> str:
    return finish_sweep(process, cwd, SWEEP_TIMEOUT_S)


def _sweep_dir(cwd: Path) -> Path:
    (sweep,) = (cwd / "outputs" / "default" / "multiruns").iterdir()
    return sweep


def _server_state(cwd: Path, *, ready: bool = False, within: float = SWEEP_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for path in (cwd / "outputs").rglob("vllm_server.json") if (cwd / "outputs").is_dir() else ():
            state = json.loads(path.read_text())
            if not ready or state.get("ready_after_s") is not None:
                return state
        time.sleep(0.5)
    log = (cwd / "out.log").read_text()
    raise AssertionError(f"no {'ready ' if ready else ''}vllm_server.json under {cwd}:\n{log[-4000:]}")


def _wait_for_file(path: Path, within: float = SWEEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {within}s"
        time.sleep(0.2)


def _gone(pgid: int, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not group_alive(pgid)


def test_one_launched_server_runs_the_sweep_like_the_engine_and_stops_with_it(tmp_path, conf):
    # greedy: the seed does not change a completion, so the engine runs seed 1 only (each of its jobs boots an engine)
    served = _sweep(tmp_path / "serve", conf, "arm=baseline,caa_given,caa_fitted", "seed=1,2", *LAUNCH)
    engine = _sweep(tmp_path / "engine", conf, "arm=baseline,caa_given,caa_fitted", "seed=1", *ENGINE)
    out_served, out_engine = _finish(served, tmp_path / "serve"), _finish(engine, tmp_path / "engine")
    assert served.returncode == 0, out_served[-4000:]
    assert engine.returncode == 0, out_engine[-4000:]
    state = _server_state(tmp_path / "serve")
    assert out_served.count(f"ready at {state['base_url']}") == 1 and _gone(state["pid"], within=0)
    records = [json.loads(p.read_text()) for p in _sweep_dir(tmp_path / "serve").glob("*/job_record.json")]
    assert len(records) == 6 and not any("base_url" in o for r in records for o in r["overrides"])
    samples = pd.read_csv(_sweep_dir(tmp_path / "serve") / "aggregate" / "samples.csv")
    expected = pd.read_csv(_sweep_dir(tmp_path / "engine") / "aggregate" / "samples.csv")
    assert len(samples) == 2 * len(expected) > 0
    both = samples.merge(expected.drop(columns="seed"), on=KEY[:1] + KEY[2:], suffixes=("", "_engine"))
    assert len(both) == len(samples)
    differ = both[both["completion"] != both["completion_engine"]]
    assert differ.empty, differ[[*KEY, "completion", "completion_engine"]].to_string()
    by_arm = samples.pivot_table(index=KEY[1:], columns="arm", values="completion", aggfunc="first")
    assert (by_arm["baseline"] != by_arm["caa_given"]).any()  # the vector reached the server
    assert (by_arm["baseline"] != by_arm["caa_fitted"]).any()  # the fitted one too


def test_a_failed_job_and_ctrl_c_mid_sweep_leave_no_server(tmp_path, conf):
    failing = _sweep(tmp_path / "fail", conf, "arm=caa_broken", "seed=1", *LAUNCH)
    held = tmp_path / "job_1_started"
    hold = ["+hydra.callbacks.hold._target_=holdjob.Hold", f"+hydra.callbacks.hold.marker={held}"]
    interrupted = _sweep(tmp_path / "interrupt", conf, "arm=baseline,caa_given", "seed=1,2", *LAUNCH, *hold)
    state = _server_state(tmp_path / "interrupt", ready=True)
    _wait_for_file(held)  # job 0 ran on the server; job 1 is held
    os.killpg(interrupted.pid, signal.SIGINT)  # what Ctrl-C sends: the sweep's whole process group
    out = _finish(interrupted, tmp_path / "interrupt")
    assert interrupted.returncode != 0 and not list(_sweep_dir(tmp_path / "interrupt").glob("3_*")), out[-4000:]
    assert _gone(state["pid"]), out[-4000:]
    out = _finish(failing, tmp_path / "fail")
    assert failing.returncode != 0 and "hidden size is 256" in out, out[-4000:]
    assert _gone(_server_state(tmp_path / "fail")["pid"]), out[-4000:]
