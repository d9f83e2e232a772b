"""The vLLM server that `backend=vllm_serve backend.options.launch=true` starts: command, readiness, stop.

`launch_server(config, directory)` starts one steering-enabled server for a job config (its model, the
`backend.options` launch settings) and returns the running `VLLMServer` once `GET /v1/models` answers. The server
runs `SERVER_MODULE` (what `vllm serve` runs in vLLM 0.32) with this interpreter, always in eager mode, with the
steering plugin on (`STEER_HYDRA_VLLM_STEERING=1`) and vLLM's V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0`), on a
free port, in a session of its own (its process group: API server, engine core, workers), writing
`<directory>/vllm_server.log`; `<directory>/vllm_server.json` records its pid, address, command and log.

Bounded: readiness waits at most `launch_timeout` seconds and fails at once, with the log's tail, when the server
exits. `VLLMServer.stop()` sends SIGTERM to the whole group, then SIGKILL after a grace period; on Linux the server
also gets SIGTERM when the launching process dies (`PR_SET_PDEATHSIG`), so a killed sweep leaves no server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from steer_hydra.backends.vllm.serve import ServeOptions
from steer_hydra.backends.vllm.steering import ENV_FLAG, RUNNER_ENV, forced_v2_problem, forced_v2_runner
from steer_hydra.core.files import atomic_write_text

logger = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"  # what `vllm serve` runs (vLLM 0.32)
STATE_FILE = "vllm_server.json"
LOG_FILE = "vllm_server.log"
STOP_GRACE = 30.0  # seconds between SIGTERM and SIGKILL
POLL_S = 0.5
TAIL_CHARS = 3000
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# Run in the child before the server's interpreter starts (it keeps the pid): SIGTERM when the parent dies.
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        sys.exit('the launching process exited before the server started')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class LaunchError(RuntimeError):
    """The launched server exited, or did not answer within `launch_timeout`; carries its log's tail."""


def server_entry() -> list[str]:
    """The interpreter and module the server runs: this Python with `SERVER_MODULE` (vLLM must be importable)."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "backend.options.launch=true starts a vLLM server with this Python, which cannot import vllm. Fix: pip "
            "install 'steer_hydra[vllm]' (CUDA) or run from scripts/setup_vllm.sh's .venv-vllm (CPU); or start a "
            "server elsewhere and pass backend.options.base_url=http://HOST:PORT with launch=false."
        )
    return [sys.executable, "-m", SERVER_MODULE]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the server binds it a moment later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def advertised_host(bind_host: str) -> str:
    """The host jobs connect to: the bind address, or this machine's hostname for a wildcard bind."""
    return socket.gethostname() if bind_host in WILDCARD_HOSTS else bind_host


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server_command(
    model_path: str,
    *,
    host: str,
    port: int,
    served_model_name: str,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's command line: eager mode always; `extra_args` last, so they override what precedes them."""
    command = [*server_entry(), "--model", model_path, "--host", host, "--port", str(port)]
    command += ["--served-model-name", served_model_name, "--dtype", dtype, "--enforce-eager"]
    command += ["--trust-remote-code"] if trust_remote_code else []
    return command + list(extra_args)


def server_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: this one with the steering plugin on and vLLM's V1 model runner (the one the
    plugin hooks); refuses a V2 runner forced in the environment."""
    environ = dict(os.environ if environ is None else environ)
    forced = forced_v2_runner(environ)
    if forced is not None:
        raise ValueError(forced_v2_problem(forced))
    return {**environ, ENV_FLAG: "1", RUNNER_ENV: "0"}


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (zombies, exited but not yet reaped, do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def log_tail(path: Path, chars: int = TAIL_CHARS) -> str:
    """The last `chars` characters of the server's log ('' when it has none)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - chars))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


class VLLMServer:
    """One server process group: `start()` it, `wait_ready()`, `stop()`; a context manager that stops on exit.

    Args:
        command: the server's command line (`server_command`).
        base_url: the address jobs use.
        probe_url: where readiness is checked from this machine (default `base_url`).
        log_path: the file that receives the server's stdout and stderr.
        environ: the server's environment (default `server_environment()`).
        timeout: seconds `wait_ready` waits for `GET /v1/models` (the `launch_timeout` option).
        api_key: sent as `Authorization: Bearer ...` with the readiness probe (vLLM reads VLLM_API_KEY too).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        base_url: str,
        log_path: Path,
        probe_url: str | None = None,
        environ: Mapping[str, str] | None = None,
        timeout: float = 900.0,
        api_key: str | None = None,
    ) -> None:
        self.command = list(command)
        self.base_url = base_url
        self.probe_url = probe_url or base_url
        self.log_path = Path(log_path)
        self.environ = dict(environ) if environ is not None else None
        self.timeout = timeout
        self.api_key = api_key
        self.process: subprocess.Popen[bytes] | None = None
        self._started = 0.0  # monotonic time of start()
        self.ready_after: float | None = None  # seconds from start to the first answer

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> VLLMServer:
        """Start the server in a new session (its own process group), its output into `log_path`.

        On Linux the server gets SIGTERM when the thread that called `start()` ends (`PR_SET_PDEATHSIG` follows the
        creating thread), so call it from a thread that lives as long as the server: the main thread.
        """
        if self.process is not None:
            raise RuntimeError(f"The server at {self.base_url} was started already (pid {self.pid}).")
        environ = self.environ if self.environ is not None else server_environment()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        shim = [sys.executable, "-c", _PDEATHSIG_SHIM, str(os.getpid())]
        with open(self.log_path, "ab") as sink:
            self.process = subprocess.Popen(
                [*shim, *self.command],
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._started = time.monotonic()
        return self

    def wait_ready(self) -> float:
        """Wait until `GET /v1/models` answers; return the seconds since start. Raises LaunchError (the server
        stopped) when it exits first or `timeout` passes."""
        process = self._running()
        deadline = self._started + self.timeout
        while True:
            code = process.poll()
            if code is not None:
                self.stop()
                raise LaunchError(
                    f"The vLLM server (pid {process.pid}) exited with code {code} before it answered at "
                    f"{self.probe_url}/v1/models. Its log {self.log_path} ends:\n{log_tail(self.log_path)}"
                )
            if self._answers():
                self.ready_after = time.monotonic() - self._started
                return self.ready_after
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(
                    f"The vLLM server (pid {process.pid}) did not answer at {self.probe_url}/v1/models within "
                    f"backend.options.launch_timeout={self.timeout:g}s; stopped. Fix: raise "
                    f"backend.options.launch_timeout (a large model loads slowly), or read its log "
                    f"{self.log_path}, which ends:\n{log_tail(self.log_path)}"
                )
            time.sleep(POLL_S)

    def _running(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise RuntimeError("The server was not started: call start() first.")
        return self.process

    def _answers(self) -> bool:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        request = urllib.request.Request(f"{self.probe_url}/v1/models", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive(self) -> bool:
        """Whether any process of the server's group still runs."""
        return self.process is not None and group_alive(self.process.pid)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace` seconds; idempotent."""
        process = self.process
        if process is None:
            return
        pgid = process.pid  # the session leader: its pid is the group's id
        if group_alive(pgid):
            logger.info("Stopping the vLLM server at %s (process group %d).", self.base_url, pgid)
            self._signal(pgid, signal.SIGTERM)
            if not self._gone(process, grace):
                logger.warning("The vLLM server (group %d) outlived SIGTERM by %gs; sending SIGKILL.", pgid, grace)
                self._signal(pgid, signal.SIGKILL)
                self._gone(process, 10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1)

    @staticmethod
    def _signal(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    @staticmethod
    def _gone(process: subprocess.Popen[bytes], within: float) -> bool:
        deadline = time.monotonic() + within
        while True:
            process.poll()  # reap the leader as soon as it exits
            if not group_alive(process.pid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def state(self) -> dict[str, Any]:
        """What `vllm_server.json` records."""
        return {
            "pid": self.pid,
            "pgid": self.pid,
            "base_url": self.base_url,
            "command": self.command,
            "log": str(self.log_path),
            "ready_after_s": None if self.ready_after is None else round(self.ready_after, 1),
        }

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_server(config: Mapping[str, Any], directory: Path) -> VLLMServer:
    """Start the server a (plain) job config asks for and wait until it answers; `directory` receives its log and
    `vllm_server.json`. Raises ValueError for bad options, LaunchError when the server does not come up."""
    from steer_hydra.models import resolve_model_reference

    backend = config.get("backend") or {}
    options = dict(backend.get("options") or {})
    model = config.get("model") or {}
    reference = model.get("model_name_or_path")
    if not reference:
        raise ValueError("backend.options.launch=true serves model.model_name_or_path, which is unset. Fix: set it.")
    host = str(options.get("launch_host") or "127.0.0.1")
    port = free_port(host or "0.0.0.0")
    base_url = _url(advertised_host(host), port)
    settings = ServeOptions.from_mapping(options, launched_url=base_url)  # validates the launch settings too
    dtype = (model.get("hf_model_kwargs") or {}).get("dtype")
    directory = Path(directory)
    log_path = directory / LOG_FILE
    server = VLLMServer(
        server_command(
            resolve_model_reference(str(reference)),
            host=host,
            port=port,
            served_model_name=settings.model or str(reference),
            dtype=dtype if isinstance(dtype, str) else "auto",
            trust_remote_code=bool(model.get("trust_remote_code", False)),
            extra_args=settings.launch_args,
        ),
        base_url=base_url,
        probe_url=_url("::1" if host == "::" else "127.0.0.1", port) if host in WILDCARD_HOSTS else base_url,
        log_path=log_path,
        environ=server_environment(),
        timeout=settings.launch_timeout,
        api_key=os.environ.get(settings.api_key_env) if settings.api_key_env else None,
    )
    logger.info("Starting a vLLM server for %s at %s (log: %s)", reference, base_url, log_path)
    server.start()
    try:
        write_state(server, directory)
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    write_state(server, directory)
    return server


def write_state(server: VLLMServer, directory: Path) -> Path:
    """Write `<directory>/vllm_server.json` (pid, address, command, log); return its path."""
    path = Path(directory) / STATE_FILE
    atomic_write_text(path, json.dumps(server.state(), indent=2) + "\n")
    return path
