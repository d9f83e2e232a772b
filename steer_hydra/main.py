"""The Hydra entry point: `python -m steer_hydra [group=option ...] [--multirun ...]` runs one job per config."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from steer_hydra.app.schema import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Compose, evaluate one arm on one suite into the shared save_dir, track; return the headline metric."""
    from steer_hydra.app.job import run_job
    from steer_hydra.app.plan import ConfigError
    from steer_hydra.app.preflight import preflight

    try:
        preflight(cfg)  # every config mistake that needs no model, before anything loads or is written
        return run_job(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as error:  # a config mistake: say what and how to fix it, no traceback
        sys.exit(f"steer_hydra: invalid configuration: {error}")


if __name__ == "__main__":
    main()
