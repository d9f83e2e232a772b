"""backend.options.launch=true without vLLM: the launcher (`vllm_launch`) and the app's `LaunchServer` callback with
stand-in servers started through the same code path (the real vLLM server: tests/backends/test_vllm_serve_launch.py).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from steer_hydra.app.serve import LaunchServer, varied_shared_keys
from steer_hydra.backends.vllm import launch as vllm_launch
from steer_hydra.backends.vllm.launch import LaunchError, VLLMServer, free_port, group_alive, launch_server
from steer_hydra.backends.vllm.serve import LAUNCHED_URL_ENV, ServeOptions, VLLMServeBackend

# A stand-in server: `MODE PORT [PIDFILE]`, or the vLLM server's arguments (`--port P ...`: mode ok, its argv and
# steering environment printed first). ok: a child in its group, then answers /v1/models; graceful: the same, and on
# SIGTERM ends its child and exits (as vLLM's server stops its engine); exit: fails at once; silent: never answers;
# stubborn: ignores SIGTERM, then answers.
STAND_IN = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    pidfile = None
    if sys.argv[1].startswith("--"):
        mode, port = "ok", int(sys.argv[sys.argv.index("--port") + 1])
        names = ("STEER_HYDRA_VLLM_STEERING", "VLLM_USE_V2_MODEL_RUNNER")
        print(json.dumps({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in names}}), flush=True)
    else:
        mode, port, pidfile = sys.argv[1], int(sys.argv[2]), (sys.argv[3:] or [None])[0]
    if mode == "exit":
        print("RuntimeError: stand-in engine failed to start", flush=True)
        sys.exit(3)
    if mode == "silent":
        time.sleep(600)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if mode == "graceful":
        signal.signal(signal.SIGTERM, lambda *_: (child.terminate(), child.wait(), sys.exit(0)))
    if pidfile:
        open(pidfile, "w").write(str(child.pid))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "stand-in"}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    print("serving", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)

# The stand-in the app tests launch: the loopback completions server over the Hugging Face pipeline of --model,
# taking the server command's arguments.
LOOPBACK_STAND_IN = textwrap.dedent(
    """
    import argparse
    from http.server import ThreadingHTTPServer

    from steer_hydra.core import SteeringPipeline
    from steer_hydra.testing.loopback_server import LoopbackCompletionsServer, _Handler

    parser = argparse.ArgumentParser()
    for name in ("--model", "--host", "--served-model-name", "--dtype"):
        parser.add_argument(name)
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()
    owner = LoopbackCompletionsServer(SteeringPipeline(args.model).steer(), model_name=args.served_model_name)
    server = ThreadingHTTPServer((args.host, args.port), type("Handler", (_Handler,), {"owner": owner}))
    server.serve_forever()
    """
)
FAST = ["suite.limit=2", "suite.generate_overrides.max_tokens=6", "progress=false", "logger=none"]
LAUNCH = ["backend=vllm_serve", "backend.options.launch=true"]


@pytest.fixture
def stand_in(tmp_path) -> Path:
    path = tmp_path / "stand_in.py"
    path.write_text(STAND_IN)
    return path


def _server(stand_in: Path, tmp_path: Path, mode: str, *, timeout: float = 30.0, pidfile: Path | None = None):
    port = free_port()
    command = [sys.executable, str(stand_in), mode, str(port), *([str(pidfile)] if pidfile else [])]
    url = f"http://127.0.0.1:{port}"
    return VLLMServer(
        command, base_url=url, log_path=tmp_path / "server.log", environ=dict(os.environ), timeout=timeout
    )


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_ready_server_answers_and_stop_ends_its_whole_process_group(stand_in, tmp_path):
    pidfile = tmp_path / "child.pid"
    server = _server(stand_in, tmp_path, "ok", pidfile=pidfile).start()
    try:
        assert 0 < server.wait_ready() < 30
        child = int(pidfile.read_text())
        assert server.alive() and _pid_alive(child) and os.getpgid(child) == server.pid
    finally:
        server.stop()
    assert not group_alive(server.pid) and not _pid_alive(child) and server.process.returncode is not None


def test_the_callback_pickles_into_a_launchers_worker_without_the_server(stand_in, tmp_path):
    callback = LaunchServer()
    callback.server = _server(stand_in, tmp_path, "ok").start()  # holds a process handle, which does not pickle
    try:
        copy = pickle.loads(pickle.dumps(callback))  # what joblib and Ray do with the sweep's callbacks
        assert copy.server is None and callback.server.alive()  # the launching process still owns and stops it
        copy.stop()
        assert callback.server.alive()
    finally:
        callback.stop()
    assert callback.server is None


def test_a_server_that_never_answers_fails_at_launch_timeout_and_is_stopped(stand_in, tmp_path):
    server = _server(stand_in, tmp_path, "silent", timeout=1.5).start()
    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"within backend.options.launch_timeout=1.5s; stopped. Fix: raise"):
        server.wait_ready()
    assert time.monotonic() - started < 10 and not group_alive(server.pid)


def test_a_server_that_exits_early_is_reported_with_its_log_tail(stand_in, tmp_path):
    server = _server(stand_in, tmp_path, "exit").start()
    with pytest.raises(LaunchError, match=r"exited with code 3 .*\n.*stand-in engine failed to start") as error:
        server.wait_ready()
    assert str(tmp_path / "server.log") in str(error.value) and not group_alive(server.pid)


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(stand_in, tmp_path):
    server = _server(stand_in, tmp_path, "stubborn").start()
    server.wait_ready()
    started = time.monotonic()
    server.stop(grace=1.0)
    assert 1.0 <= time.monotonic() - started < 10 and not group_alive(server.pid)


LAUNCHER = """
import os, sys
from pathlib import Path
from steer_hydra.backends.vllm.launch import VLLMServer
port, stand_in, log = sys.argv[1:4]
command = [sys.executable, stand_in, "graceful", port]
server = VLLMServer(command, base_url=f"http://127.0.0.1:{port}", log_path=Path(log), environ=dict(os.environ))
server.start()
server.wait_ready()
print(server.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_server_dies_with_a_launching_process_that_is_killed(stand_in, tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(free_port()), str(stand_in), str(tmp_path / "s.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = int(launcher.stdout.readline())
    assert group_alive(pid)
    launcher.kill()  # SIGKILL: no exit handler runs
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pid)


def test_launch_server_builds_the_steering_command_from_the_job_config(stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_launch, "server_entry", lambda: [sys.executable, str(stand_in)])
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = {
        "model": {"model_name_or_path": "steer_hydra:tiny", "hf_model_kwargs": {"dtype": "float32"}},
        "backend": {"kind": "vllm_serve", "options": {"launch": True, "launch_args": ["--max-model-len", 512]}},
    }
    with launch_server(config, tmp_path / "sweep") as server:
        state = json.loads((tmp_path / "sweep" / "vllm_server.json").read_text())
        first_line = json.loads(server.log_path.read_text().splitlines()[0])
        assert (
            state["pid"] == server.pid and state["base_url"] == server.base_url and state["command"] == server.command
        )
        assert state["log"] == str(tmp_path / "sweep" / "vllm_server.log")
    argv = first_line["argv"]
    assert argv[argv.index("--served-model-name") + 1] == "steer_hydra:tiny"
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    assert argv[-2:] == ["--max-model-len", "512"] and Path(argv[argv.index("--model") + 1]).is_dir()
    assert first_line["env"] == {"STEER_HYDRA_VLLM_STEERING": "1", "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert not group_alive(state["pid"])


def test_a_forced_v2_runner_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setattr(vllm_launch, "server_entry", lambda: [sys.executable, "-c", "pass"])
    config = {"model": {"model_name_or_path": "/m"}, "backend": {"options": {"launch": True}}}
    with pytest.raises(ValueError, match=r"VLLM_USE_V2_MODEL_RUNNER=1 forces vLLM's V2 model runner"):
        launch_server(config, tmp_path)
    assert not (tmp_path / "vllm_server.json").exists()


def test_launch_options_validate_and_stay_out_of_the_protocol(monkeypatch):
    monkeypatch.delenv(LAUNCHED_URL_ENV, raising=False)
    with pytest.raises(ValueError, match=r"needs options.base_url.*Fix: pass backend.options.base_url="):
        ServeOptions.from_mapping({"base_url": "???", "launch": False})
    with pytest.raises(ValueError, match=r"launch=true, but no server was launched.*Fix: run through python -m"):
        ServeOptions.from_mapping({"base_url": "???", "launch": True})
    with pytest.raises(ValueError, match=r"base_url must stay unset.*Fix: drop backend.options.base_url"):
        ServeOptions.from_mapping({"base_url": "http://h:1", "launch": True}, launched_url="http://h:2")
    with pytest.raises(ValueError, match=r"options.launch_timeout must be > 0 seconds"):
        ServeOptions.from_mapping({"launch": True, "launch_timeout": 0}, launched_url="http://h:2")
    with pytest.raises(ValueError, match=r"options.launch_args must be a list.*Fix: backend.options.launch_args=\["):
        ServeOptions.from_mapping({"launch": True, "launch_args": "--x 1"}, launched_url="http://h:2")
    monkeypatch.setenv(LAUNCHED_URL_ENV, "http://node7:8123")
    parsed = ServeOptions.from_mapping({"base_url": "???", "launch": True, "launch_args": ["--seed", 0]})
    assert parsed.base_url == "http://node7:8123" and parsed.launch_args == ("--seed", "0")
    launched = {"launch": True, "launch_host": "0.0.0.0", "launch_timeout": 5, "launch_args": ["--x"], "model": "m"}
    assert VLLMServeBackend.protocol_options(launched) == {"model": "m"}


def test_a_sweep_that_varies_the_model_or_backend_is_named():
    jobs = [
        ["model=tiny", "arm=a", "backend.options.launch=true"],
        ["model=tiny_base", "arm=b", "backend.options.launch=true"],
    ]
    assert varied_shared_keys(jobs) == ["model"]
    assert varied_shared_keys([["arm=a", "seed=1"], ["arm=b", "seed=2"]]) == []
    assert varied_shared_keys([["+backend.options.launch_args=[--a]"], []]) == ["backend.options.launch_args"]


@pytest.fixture
def loopback_launch(tmp_path, monkeypatch):
    """The app's launched server is the loopback stand-in (the tiny model on Hugging Face)."""
    script = tmp_path / "loopback_stand_in.py"
    script.write_text(LOOPBACK_STAND_IN)
    monkeypatch.setattr(vllm_launch, "server_entry", lambda: [sys.executable, str(script)])
    monkeypatch.delenv(LAUNCHED_URL_ENV, raising=False)


def test_a_sweep_runs_every_job_on_one_launched_server_and_stops_it(loopback_launch, run_main, tmp_path):
    code, out, err = run_main(*LAUNCH, *FAST, "arm=baseline,system_prompt", "--multirun")
    assert code == 0, err[-3000:]
    (sweep,) = (tmp_path / "outputs" / "default" / "multiruns").iterdir()
    state = json.loads((sweep / "vllm_server.json").read_text())
    assert not group_alive(state["pid"]) and LAUNCHED_URL_ENV not in os.environ
    assert f"vLLM server for this sweep ready at {state['base_url']}" in out + err
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/job_record.json"))]
    assert len(records) == 2
    for record in records:  # the address reached the jobs through hydra.job.env_set, not their task overrides
        assert not any("base_url" in o or LAUNCHED_URL_ENV in o for o in record["overrides"])
        assert "backend.options.launch=true" in [o.lower() for o in record["overrides"]]
    hydra_yaml = (sweep / "0_baseline_seed0" / ".hydra" / "hydra.yaml").read_text()
    assert f"{LAUNCHED_URL_ENV}: {state['base_url']}" in hydra_yaml
    assert json.loads((sweep / "aggregate" / "missing_cells.json").read_text()) == []


def test_a_single_run_launches_its_own_server(loopback_launch, run_main, tmp_path):
    code, out, err = run_main(*LAUNCH, *FAST)
    assert code == 0, err[-3000:]
    (run,) = (tmp_path / "outputs" / "default" / "runs").iterdir()
    state = json.loads((run / "vllm_server.json").read_text())
    assert not group_alive(state["pid"]) and LAUNCHED_URL_ENV not in os.environ
    assert "vLLM server for this run ready" in out + err


def test_a_sweep_over_models_is_refused_before_a_server_starts(loopback_launch, run_main, tmp_path):
    code, out, err = run_main(*LAUNCH, *FAST, "model=tiny,tiny_base", "--multirun")
    assert code == 1 and "launch=true starts one vLLM server for the whole sweep, but its jobs vary ['model']" in err
    assert not list((tmp_path / "outputs").rglob("vllm_server.json")) and "Launching" not in out + err


def test_a_server_that_fails_to_start_ends_the_app_with_its_log_tail(run_main, tmp_path, monkeypatch):
    failing = [sys.executable, "-c", "import sys; print('stand-in: CUDA out of memory'); sys.exit(3)"]
    monkeypatch.setattr(vllm_launch, "server_entry", lambda: failing)
    code, out, err = run_main(*LAUNCH, *FAST, "arm=baseline,system_prompt", "--multirun")
    assert code == 1 and "steer_hydra: backend.options.launch=true: The vLLM server" in err
    assert "exited with code 3" in err and "stand-in: CUDA out of memory" in err and "Launching" not in out + err


# `python -m steer_hydra` in a subprocess with the loopback stand-in as the server; FAIL_JOBS=1 makes each job raise.
APP = """
import os, sys
from steer_hydra.backends.vllm import launch as vllm_launch
vllm_launch.server_entry = lambda: [sys.executable, os.environ["STAND_IN"]]
if os.environ.get("FAIL_JOBS"):
    import steer_hydra.app.job as job

    def run_job(cfg, output_dir):
        raise RuntimeError("injected job failure")

    job.run_job = run_job
from steer_hydra.main import main
sys.argv = ["steer_hydra", *sys.argv[1:]]
main()
"""


def _app(tmp_path: Path, *args: str, stand_in: str = LOOPBACK_STAND_IN, **env: str) -> subprocess.Popen:
    script = tmp_path / "server_stand_in.py"
    script.write_text(stand_in)
    environ = {**os.environ, "STAND_IN": str(script), "HYDRA_FULL_ERROR": "0", **env}
    for name in ("PYTEST_CURRENT_TEST", LAUNCHED_URL_ENV):
        environ.pop(name, None)
    command = [sys.executable, "-c", APP, "--multirun", "model=tiny", *LAUNCH, *FAST, *args]
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _server_state(tmp_path: Path, *, ready: bool = False, within: float = 60.0) -> dict:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for path in (tmp_path / "outputs").rglob("vllm_server.json"):
            state = json.loads(path.read_text())
            if not ready or state["ready_after_s"] is not None:
                return state
        time.sleep(0.2)
    raise AssertionError(f"no {'ready ' if ready else ''}vllm_server.json under {tmp_path} after {within}s")


def test_a_failed_job_still_stops_the_server(tmp_path):
    app = _app(tmp_path, "arm=baseline", stand_in=STAND_IN, FAIL_JOBS="1")
    out, _ = app.communicate(timeout=120)
    assert app.returncode != 0 and "injected job failure" in out, out[-3000:]
    assert not group_alive(_server_state(tmp_path)["pid"])


def test_ctrl_c_mid_sweep_stops_the_server(tmp_path):
    app = _app(tmp_path, "arm=baseline,system_prompt", "suite.limit=20")
    state = _server_state(tmp_path, ready=True)
    time.sleep(1.0)  # the first job is running
    os.killpg(app.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends: the sweep's whole process group
    out, _ = app.communicate(timeout=60)
    assert not group_alive(state["pid"]), out[-3000:]
