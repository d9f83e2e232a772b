"""The Hydra entry point: `python -m steer_hydra [group=option ...] [--multirun ...]` runs one job per config.

`main` runs the Hydra app with secret values kept off the console: the values of secret-named overrides on the
command line and of secret env vars are replaced by `***` in whatever Python writes to stdout and stderr.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from steer_hydra.app.redaction import redacted_console
from steer_hydra.app.schema import register_configs
from steer_hydra.app.secrets import Redactor

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def app(cfg: DictConfig) -> float:
    """Compose, evaluate one arm on one suite into the shared save_dir, track; return the headline metric."""
    from steer_hydra.app.job import run_job
    from steer_hydra.app.preflight import preflight, preflight_references
    from steer_hydra.core.errors import ConfigError
    from steer_hydra.evaluation.runner import UnsupportedConfigurationError

    try:
        preflight(cfg)  # every config mistake that needs no model, before anything loads or is written
        preflight_references(cfg)  # the second models and files the arm's controls name, before the model loads
        return run_job(cfg, HydraConfig.get().runtime.output_dir)
    except (ConfigError, UnsupportedConfigurationError) as error:  # say what and how to fix it, in one line
        message = f"steer_hydra: invalid configuration: {' '.join(str(error).split())}"
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # an exception the launcher records as this job's failure: the sweep's other jobs still run, and the
            # sweep ends with this line (a SystemExit would end the launcher, and with it every later job)
            raise JobRefused(message) from None
        sys.exit(message)


class JobRefused(CompactHydraException):
    """A job of a sweep refused in one line (`steer_hydra: invalid configuration: ...`); Hydra prints the line alone."""


INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C


def main() -> Any:
    """`python -m steer_hydra ARGS`: the Hydra app, its console redacted of the secrets in ARGS and the env.

    Ctrl-C (SIGINT) ends the program with status 130 and one line: the job writes no job record and no tables
    (nothing that looks finished), and the samples that finished stay in their Inspect logs for the re-run."""
    redactor = Redactor(sys.argv[1:])
    with redacted_console(redactor):
        try:
            return app()
        except SystemExit as exited:  # its message is printed after this block: redact it here
            if isinstance(exited.code, str) and redactor:
                raise SystemExit(redactor.text(exited.code)) from None
            raise
        except KeyboardInterrupt as interrupted:
            detail = " ".join(str(interrupted).split()) or "Interrupted."
            print(
                f"steer_hydra: interrupted (Ctrl-C). {detail} No job record or results table was written for the "
                "unfinished job. Fix: re-run the same command to resume (finished samples are reused from the logs).",
                file=sys.stderr,
            )
            raise SystemExit(INTERRUPTED_EXIT) from None


if __name__ == "__main__":
    main()
