"""The one place the app composes its Hydra config outside `@hydra.main`, and reads a composed config as plain values.

- `compose_config(overrides)`: the app's config with `overrides`, under the running app's search path when Hydra is
  initialized (so user config groups on `hydra.searchpath` count), else from the packaged `steer_hydra.conf`;
  `standalone=True` always composes from the package and leaves Hydra cleared (a command that is not the app:
  rescore, the Inspect CLI entry point).
- `job_choices()`: the running job's group choices plus its `hydra.searchpath` (empty outside the app).
- `to_plain(node)`: a resolved plain-Python copy of a config node.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONFIG_MODULE = "steer_hydra.conf"
CONFIG_NAME = "config"


def compose_config(overrides: Sequence[str], *, standalone: bool = False) -> DictConfig:
    """The app's config composed with `overrides` (Hydra validates them and raises its own errors)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from steer_hydra.app.schema import register_configs

    register_configs()
    hydra = GlobalHydra.instance()
    if not standalone and hydra.is_initialized():  # inside the app: its search path, user groups included
        return compose(CONFIG_NAME, overrides=list(overrides))
    if standalone:
        hydra.clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return compose(CONFIG_NAME, overrides=list(overrides))
    finally:
        if standalone:
            hydra.clear()


def job_choices() -> dict[str, Any]:
    """The job's group choices, plus its `hydra.searchpath` (user config groups) under that key, inside the app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    return {**hydra_cfg.runtime.choices, "hydra.searchpath": list(hydra_cfg.searchpath or [])}


def to_plain(cfg: Any) -> Any:
    """A resolved plain-Python copy of a config node (enums as their values)."""
    if isinstance(cfg, DictConfig) or OmegaConf.is_config(cfg):
        cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    if isinstance(cfg, Mapping):
        return {k: to_plain(v) for k, v in cfg.items()}
    if isinstance(cfg, list):
        return [to_plain(v) for v in cfg]
    if isinstance(cfg, enum.Enum):
        return cfg.value
    return cfg
