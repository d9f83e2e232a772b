"""`hydra/launcher=ray`: Hydra's Ray launcher, waiting for every job even when one job's worker process dies.

hydra-ray-launcher 1.2.2 submits each job as a Ray task, then collects the results in order with `ray.get`; the
first job whose worker died (killed, out of memory, node lost) raises there, the launching process exits, and Ray
cancels every job still running or queued. This launcher connects, submits and places jobs with the plugin's own
functions and only changes the collection: it waits for all of them, and a job whose worker died comes back as a failed
`JobReturn` holding Ray's error, as a job that raised does on every launcher. The sweep then ends as any sweep with
a failed job ends: the finished jobs aggregated, the missing ones in `missing_cells.json` with their commands.

Connecting is bounded: before `ray.init`, the cluster's address is resolved as Ray resolves it (`address: auto`:
`RAY_ADDRESS`, else the cluster `ray start` joined on this node) and its head must accept a TCP connection within
`hydra.launcher.ray.init.connect_timeout` seconds (default 10; Ray itself retries an unreachable address for about 14
minutes). No cluster to join, or one that does not answer, ends the sweep before any job in one line
(`RayUnreachable`) naming `RAY_ADDRESS` (or the config key the address came from) and the fix.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)

# seconds the cluster's head has to accept a connection (`hydra.launcher.ray.init.connect_timeout`, steer_hydra's key,
# taken out of `init` before `ray.init`)
CONNECT_TIMEOUT = 10.0
TIMEOUT_KEY = "connect_timeout"
ADDRESS_KEY = "hydra.launcher.ray.init.address"


class RayUnreachable(SystemExit):
    """No Ray cluster to join, or its head does not accept connections: one line, before any job is launched."""


def _bootstrap_address() -> str | None:
    """The address of the cluster `ray start` ran on this node (Ray's own bootstrap file), or None."""
    try:
        from ray._private.services import find_bootstrap_address

        return find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - another Ray layout: ray.init finds it (or says so) itself
        return None


def ray_address_problem(init: Mapping[str, object] | None, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """Why the sweep cannot connect to Ray with `init` (`hydra.launcher.ray.init`), found within `timeout` seconds
    without asking Ray, or None (a private instance, `address: null`, needs no cluster)."""
    address = (init or {}).get("address")
    if address is None:
        return None
    address, source = str(address), ADDRESS_KEY
    if address == "auto":
        if os.environ.get("RAY_ADDRESS"):
            address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
        else:
            found = _bootstrap_address()
            if not found:
                return (
                    f"{ADDRESS_KEY}=auto: no Ray cluster to join (RAY_ADDRESS is unset and no `ray start` ran on this "
                    "node). Fix: start one (ray start --head --port=6379) and set RAY_ADDRESS=HOST:6379, or "
                    f"{ADDRESS_KEY}=null for a private one-node Ray instance."
                )
            address, source = found, "the cluster `ray start` joined on this node"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"{source}={address!r} is not HOST:PORT. Fix: RAY_ADDRESS=HOST:PORT of the cluster's head node."
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except OSError as error:
        return (
            f"{source}={address}: nothing accepts connections there within {timeout:.0f}s "
            f"({type(error).__name__}), so Ray would retry for minutes. Fix: start the cluster's head there (ray start "
            f"--head --port={port}) or point RAY_ADDRESS at a running one; {ADDRESS_KEY}=null starts a private "
            "one-node instance."
        )


class RayLauncher(Launcher):
    """The plugin's launcher and config (`ray.init`, `ray.remote`); every job's result is collected. The plugin is
    imported when a sweep launches, so Hydra's plugin scan works without Ray installed."""

    def __init__(self, ray: DictConfig) -> None:
        self.ray_cfg = ray
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray
        from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        logger.info("Ray launcher: %d job(s), sweep dir %s", len(job_overrides), sweep_dir)
        init = OmegaConf.to_container(self.ray_cfg.init, resolve=True) if self.ray_cfg.init is not None else {}
        timeout = float(init.pop(TIMEOUT_KEY, None) or CONNECT_TIMEOUT)  # ours: ray.init would refuse it
        problem = ray_address_problem(init, timeout) if not ray.is_initialized() else None
        if problem is not None:
            raise RayUnreachable(f"steer_hydra: Ray: {problem}")
        start_ray(OmegaConf.create(init))
        runs: list[tuple[list[str], Any]] = []
        for num, overrides in enumerate(job_overrides, start=initial_job_idx):
            logger.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"job_id_for_{num}"  # a scheduler's job id does not exist on Ray
                sweep_config.hydra.job.num = num
            ref = launch_job_on_ray(
                self.hydra_context, self.ray_cfg.remote, sweep_config, self.task_function, Singleton.get_state()
            )
            runs.append((list(overrides), ref))
        results = []
        for num, (overrides, ref) in enumerate(runs, start=initial_job_idx):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayError as error:  # the worker died; a job's own exception is in its JobReturn
                logger.error("Job #%d (%s) did not finish on Ray: %s", num, " ".join(overrides), error)
                results.append(JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=error))
        return results
