"""Fixtures for the Hydra app: compose the packaged config, and run `python -m steer_hydra` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from steer_hydra.app.schema import register_configs


@pytest.fixture
def compose_cfg():
    """`compose_cfg(overrides, return_hydra_config=False)` -> the composed primary config."""
    register_configs()

    def factory(overrides=(), return_hydra_config=False):
        GlobalHydra.instance().clear()
        with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)

    yield factory
    GlobalHydra.instance().clear()


@pytest.fixture
def run_app(tmp_path):
    """`run_app(*args, env=None, cwd=tmp_path)` runs `python -m steer_hydra` offline; returns CompletedProcess."""

    def runner(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 300):
        full_env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(env or {})}
        full_env.pop("PYTEST_CURRENT_TEST", None)
        return subprocess.run(
            [sys.executable, "-m", "steer_hydra", *args],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return runner
