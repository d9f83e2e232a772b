"""`hydra/launcher=ray`: Hydra's Ray launcher, waiting for every job even when one job's worker process dies.

hydra-ray-launcher 1.2.2 submits each job as a Ray task, then collects the results in order with `ray.get`; the
first job whose worker died (killed, out of memory, node lost) raises there, the launching process exits, and Ray
cancels every job still running or queued. This launcher connects, submits and places jobs with the plugin's own
functions and only changes the collection: it waits for all of them, and a job whose worker died comes back as a failed
`JobReturn` holding Ray's error, as a job that raised does on every launcher. The sweep then ends as any sweep with
a failed job ends: the finished jobs aggregated, the missing ones in `missing_cells.json` with their commands.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

logger = logging.getLogger(__name__)


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
        start_ray(self.ray_cfg.init)
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
