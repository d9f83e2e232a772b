"""`LaunchServer`: the Hydra callback that starts one vLLM server for a run or sweep of `backend.options.launch=true`.

It acts only when `backend.kind` is `vllm_serve` and `backend.options.launch` is true:
- `on_multirun_start` starts the server (`steer_hydra.backends.vllm_launch.launch_server`, files in the sweep
  dir) and appends `++hydra.job.env_set.STEER_HYDRA_VLLM_SERVE_URL=<address>` to `hydra.overrides.hydra`. Hydra
  re-composes each job's config from those overrides plus the job's own, so every launcher's jobs get the address
  in their environment, and nothing lands in the jobs' task overrides (their records, `override_dirname`, the
  rerun commands of missing jobs: a rerun with launch=true starts its own server). A sweep whose jobs vary the
  model or the backend is refused: one server serves one model.
- `on_run_start` (a single run) starts it in the run dir and sets that variable in this process.
- `on_multirun_end` / `on_run_end` stop it; so does an exit handler, since Hydra skips `on_multirun_end` when a job
  fails, and after Ctrl-C.

Hydra turns an exception raised by a callback into a warning and goes on; a launch that fails (bad options, a
server that exits or does not answer in time, a refused sweep) therefore ends the app with `SystemExit` and one
message, before any job runs.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

logger = logging.getLogger(__name__)

_SHARED_PREFIXES = ("model", "backend")  # what one server fixes for every job of the sweep


def launches(config: DictConfig) -> bool:
    """Whether `config` asks for a launched server: backend vllm_serve with `backend.options.launch` true."""
    kind = OmegaConf.select(config, "backend.kind")
    kind = getattr(kind, "value", kind)
    return kind == "vllm_serve" and OmegaConf.select(config, "backend.options.launch", default=False) is True


def varied_shared_keys(jobs: list[list[str]]) -> list[str]:
    """The model and backend keys whose override differs between `jobs` (each a list of `key=value` overrides)."""
    seen: dict[str, set[str | None]] = {}
    for job in jobs:
        values = {}
        for line in job:
            key, _, value = line.lstrip("+~").partition("=")
            if key.split(".", 1)[0].split("@", 1)[0] in _SHARED_PREFIXES:
                values[key] = value
        for key in {*seen, *values}:
            seen.setdefault(key, set()).add(values.get(key))
    return sorted(key for key, values in seen.items() if len(values) > 1)


@contextmanager
def _exit_on_failure() -> Iterator[None]:
    """Turn a launch failure into `SystemExit` with its message (Hydra would only warn about an exception)."""
    try:
        yield
    except (ValueError, ImportError, RuntimeError, OSError) as error:
        raise SystemExit(f"steer_hydra: backend.options.launch=true: {error}") from error


class LaunchServer(Callback):
    """Starts one steering-enabled vLLM server for the run or sweep and points every job at it; stops it after."""

    def __init__(self) -> None:
        self.server: Any = None  # a running `VLLMServer`
        self._saved_env: tuple[str, str | None] | None = None  # a single run: the variable's earlier value

    def __getstate__(self) -> dict[str, Any]:
        """A copy pickled into a launcher's worker process (joblib, Ray) carries no server (a process handle does
        not pickle): the launching process owns the server and stops it; the worker's jobs reach it by address."""
        return {**self.__dict__, "server": None, "_saved_env": None}

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not launches(config):
            return
        from steer_hydra.backends.vllm.serve import LAUNCHED_URL_ENV

        with _exit_on_failure():
            server = self._launch(config, Path(str(config.hydra.run.dir)), "run")
        self._saved_env = (LAUNCHED_URL_ENV, os.environ.get(LAUNCHED_URL_ENV))
        os.environ[LAUNCHED_URL_ENV] = server.base_url

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.stop()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not launches(config):
            return
        from steer_hydra.app.callbacks import expected_jobs
        from steer_hydra.backends.vllm.serve import LAUNCHED_URL_ENV

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            varied = varied_shared_keys(expected_jobs(config, sweep_dir))
        except Exception:  # noqa: BLE001 - a sweeper this cannot split: jobs still check the model they reach
            varied = []
        if varied:
            raise SystemExit(
                f"steer_hydra: backend.options.launch=true starts one vLLM server for the whole sweep, but its jobs "
                f"vary {varied}. Fix: run one sweep per model and backend setting, or start servers yourself and "
                "pass backend.options.base_url with launch=false."
            )
        with _exit_on_failure():
            server = self._launch(config, sweep_dir, "sweep")
        lines = config.hydra.overrides.hydra
        with read_write(lines):
            lines.append(f"++hydra.job.env_set.{LAUNCHED_URL_ENV}={server.base_url}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.stop()

    def _launch(self, config: DictConfig, directory: Path, what: str) -> Any:
        from steer_hydra.backends.vllm.launch import launch_server

        plain = {
            key: OmegaConf.to_container(config[key], resolve=True, throw_on_missing=False)
            for key in ("model", "backend")
        }
        atexit.register(self.stop)  # Hydra skips the end hooks when a job fails; Ctrl-C skips them too
        self.server = launch_server(plain, directory)
        logger.info(
            "vLLM server for this %s ready at %s after %.0fs (pid %d, log %s); it stops when the %s ends.",
            what,
            self.server.base_url,
            self.server.ready_after,
            self.server.pid,
            self.server.log_path,
            what,
        )
        return self.server

    def stop(self) -> None:
        """Stop the server (if one runs) and restore the environment a single run changed; idempotent."""
        server, self.server = self.server, None
        if self._saved_env is not None:
            name, value = self._saved_env
            self._saved_env = None
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if server is not None:
            server.stop()
