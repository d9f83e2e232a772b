"""Turn a composed Hydra config into the library objects of one job (controls, suite, options, runner), no I/O.

Everything that can be wrong with a config fails here, before any model loads: control arguments (their
`Args` dataclasses name the field and the valid arguments), suite and provider options, the backend kind,
and a save_dir whose earlier protocol differs from this job's.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.controls import BaseControl
from steer_hydra.core.identity import canonical_value, config_digest
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.evaluation.provider import ProviderOptions
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.evaluation.suite import InspectSuite


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key and the fix."""


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


def build_controls(controls_cfg: Any) -> list[BaseControl]:
    """Instantiate `arm.controls` (slot name -> control node), in slot order, naming the slot on any error."""
    controls: list[BaseControl] = []
    for slot, node in (controls_cfg or {}).items():
        if node is None:
            continue
        where = f"arm.controls.{slot}"
        if not isinstance(node, Mapping) and not OmegaConf.is_dict(node) or "_target_" not in node:
            raise ConfigError(f"{where} must be a control config with a _target_ (e.g. +control@{where}=pasta).")
        try:
            control = instantiate(node, _convert_="all")
        except InstantiationException as error:
            cause = error.__cause__ or error
            raise ConfigError(f"{where}: {cause}") from cause
        if not isinstance(control, BaseControl):
            raise ConfigError(
                f"{where}: {node['_target_']} is not a steer_hydra control (got {type(control).__name__})."
            )
        controls.append(control)
    return controls


@dataclass(slots=True)
class JobPlan:
    """Everything one job runs, built and validated from the config."""

    arm: str
    config_id: str
    controls: list[BaseControl]
    suite: InspectSuite
    options: ProviderOptions
    backend: BackendSpec
    model: dict[str, Any]
    save_dir: Path
    seed: int | None
    num_trials: int
    generate_defaults: dict[str, Any]
    on_unsupported: str
    display: str
    progress: bool

    @classmethod
    def from_config(cls, cfg: DictConfig) -> JobPlan:
        plain = to_plain(cfg)
        controls = build_controls(cfg.arm.controls)
        suite_cfg = dict(plain["suite"])
        try:
            suite = InspectSuite(
                **{
                    **suite_cfg,
                    "tasks": tuple(suite_cfg["tasks"]),
                    "sample_ids": {k: tuple(v) for k, v in (suite_cfg.get("sample_ids") or {}).items()} or None,
                }
            )
        except (TypeError, ValueError) as error:
            raise ConfigError(f"suite: {error}") from error
        provider = dict(plain["provider"])
        if provider.get("reasoning_tags") is not None:
            provider["reasoning_tags"] = tuple(provider["reasoning_tags"])
        try:
            options = ProviderOptions(**provider)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"provider: {error}") from error
        backend = BackendSpec(kind=plain["backend"]["kind"], options=plain["backend"]["options"] or {})
        return cls(
            arm=plain["arm"]["name"],
            config_id=config_digest(config_descriptor_from_controls(controls)),
            controls=controls,
            suite=suite,
            options=options,
            backend=backend,
            model=dict(plain["model"]),
            save_dir=Path(plain["save_dir"]).absolute(),
            seed=plain["seed"],
            num_trials=plain["num_trials"],
            generate_defaults=dict(plain["generate_defaults"] or {}),
            on_unsupported=plain["on_unsupported"],
            display=plain["display"],
            progress=plain["progress"],
        )

    def protocol(self) -> dict[str, Any]:
        """What makes logs in `save_dir` comparable: everything but the arm (which has its own directory)."""
        return canonical_value(
            {
                "model": {k: v for k, v in self.model.items() if k != "name"},
                "backend": {"kind": self.backend.kind, "options": self.backend.options},
                "provider": self.options,
                "generate_defaults": self.generate_defaults,
                "suite": self.suite,
                "seed": self.seed,
            }
        )

    def check_protocol(self) -> None:
        """Refuse a save_dir whose logs for this suite were made under another protocol (they would be reused)."""
        path = self.save_dir / "protocol" / f"{self.suite.name}.json"
        if not path.exists():
            return
        previous = json.loads(path.read_text())
        current = self.protocol()
        if previous != current:
            changed = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
            raise ConfigError(
                f"save_dir {self.save_dir} already holds suite {self.suite.name!r} evaluated under another protocol "
                f"(changed: {', '.join(changed)}). Inspect would resume those logs as if nothing changed. Fix: set "
                "experiment_name=<new name> (or save_dir=...) for the new protocol, or restore the old settings."
            )

    def record_protocol(self) -> None:
        """Write this job's protocol and arm name into save_dir (one file per suite and per configuration)."""
        (self.save_dir / "protocol").mkdir(parents=True, exist_ok=True)
        (self.save_dir / "protocol" / f"{self.suite.name}.json").write_text(json.dumps(self.protocol(), indent=1))
        (self.save_dir / "configs").mkdir(parents=True, exist_ok=True)
        (self.save_dir / "configs" / f"{self.config_id}.json").write_text(
            json.dumps(
                {
                    "arm": self.arm,
                    "config_id": self.config_id,
                    "controls": canonical_value(config_descriptor_from_controls(self.controls)),
                },
                indent=1,
            )
        )

    def runner(self) -> SteeringEval:
        """The library runner for this job (one configuration, one suite)."""
        return SteeringEval(
            {self.arm: self.controls},
            self.model["model_name_or_path"],
            [self.suite],
            backend=self.backend,
            hf_model_kwargs=self.model.get("hf_model_kwargs") or {},
            device_map=self.model.get("device_map"),
            trust_remote_code=bool(self.model.get("trust_remote_code")),
            num_trials=self.num_trials,
            seed=self.seed,
            provider_options=self.options,
            generate_defaults=self.generate_defaults,
            on_unsupported=self.on_unsupported,
            save_dir=self.save_dir,
            progress=self.progress,
            display=self.display,
        )


def arm_names(save_dir: Path) -> dict[str, str]:
    """`{config_id: arm name}` of every configuration a job recorded in `save_dir`."""
    names = {}
    for path in sorted((save_dir / "configs").glob("*.json")) if (save_dir / "configs").is_dir() else []:
        record = json.loads(path.read_text())
        names[record["config_id"]] = record["arm"]
    return names
