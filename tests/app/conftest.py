"""Fixtures for the Hydra app: compose the packaged config, and run `python -m steer_hydra` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from steer_hydra.app.schema import register_configs


def with_tiny_model(overrides) -> list[str]:
    """App tests run the tiny random model unless they choose one (the default job runs SmolLM2)."""
    overrides = list(overrides)
    chosen = any(o.lstrip("+~").startswith(("model=", "experiment=")) for o in overrides)
    return overrides if chosen else ["model=tiny", *overrides]


@pytest.fixture
def compose_cfg():
    """`compose_cfg(overrides, return_hydra_config=False)` -> the composed primary config."""
    register_configs()

    def factory(overrides=(), return_hydra_config=False, default_model=False):
        GlobalHydra.instance().clear()
        overrides = list(overrides) if default_model else with_tiny_model(overrides)
        with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        # as inside the app: HydraConfig holds the job's group choices (the arm's display name is judged under the
        # job's own model option, not the default one)
        HydraConfig.instance().set_config(cfg)
        if not return_hydra_config:
            with open_dict(cfg):
                del cfg["hydra"]
        return cfg

    yield factory
    HydraConfig.instance().cfg = None
    GlobalHydra.instance().clear()


@pytest.fixture
def study():
    """`study(*overrides, return_hydra_config=False)` -> the concept study's config
    (`experiment=concept_steering`) composed with `overrides`; GlobalHydra cleared before and after."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
        yield lambda *overrides, **kw: compose("config", overrides=["experiment=concept_steering", *overrides], **kw)
    GlobalHydra.instance().clear()


@pytest.fixture
def run_app(tmp_path):
    """`run_app(*args, env=None, cwd=tmp_path)` runs `python -m steer_hydra` offline; returns CompletedProcess."""

    def runner(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 300):
        full_env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(env or {})}
        full_env.pop("PYTEST_CURRENT_TEST", None)
        return subprocess.run(
            [sys.executable, "-m", "steer_hydra", *with_tiny_model(args)],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return runner


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """`run_main(*args)` runs `python -m steer_hydra ARGS` in this process (no interpreter start): the same entry
    point and argument parsing; returns `(exit code, stdout, stderr)`."""
    from steer_hydra import main as main_module

    def runner(*args: str) -> tuple[int, str, str]:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(sys, "argv", ["steer_hydra", *with_tiny_model(args)])
        GlobalHydra.instance().clear()
        code = 0
        try:
            main_module.main()
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
            if isinstance(exited.code, str):
                sys.stderr.write(exited.code + "\n")
        finally:
            GlobalHydra.instance().clear()
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return runner


@pytest.fixture(scope="session")
def serial_cluster_sweep(tmp_path_factory):
    """The cluster tests' sweep run with Hydra's basic launcher (one job after another here): its samples, which
    every cluster's run of the same sweep must equal."""
    from cluster_helpers import serial_reference

    return serial_reference(tmp_path_factory.mktemp("serial_sweep"), {})
