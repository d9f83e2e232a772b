"""Turn a composed Hydra config into the library objects of one job (controls, suite, options, runner), and own
the job's claims in the shared save_dir (its protocol per suite, its configuration record).

Everything that can be wrong with a config fails here, before any model loads: control arguments (their
`Args` dataclasses name the field and the valid arguments), suite and provider options, the backend kind,
and a save_dir whose earlier protocol differs from this job's.

Identity: `config_id` is the digest of the arm's controls (`baseline` for none); it keys every result. The arm's
display name (`arm`) is its YAML `name` when its controls are the arm file's defaults, else `<name>@<config_id>`,
so differently configured arms never share a name (`display_name` is the one place that builds it).

Concurrency: jobs share `save_dir/protocol/<suite>.json` and `save_dir/configs/<config_id>.json`; both are
written atomically, and the protocol check-and-claim runs under the save_dir's file lock. A job claims only
right before it evaluates its first cell (its model loaded and steered), and a job that fails before any log of
the suite exists, with no other job holding the claim, removes it again.

Claims: the protocol of a suite is held while a log of the suite exists or a job holding it runs. A job's hold is
a holder file `save_dir/protocol/holders/<suite>.<host>.<pid>.<uuid>` whose JSON names the job's process
(`core.files.process_identity`: host, boot, pid namespace, pid, start time) and which the job touches every
`HOLDER_REFRESH_S` seconds until it releases it. A holder is stale when its process is gone (checked on its own
host: the pid is free, a zombie, or another process's) or, on any host, when it was not touched for
`HOLDER_LEASE_S` seconds (a job killed with SIGKILL or SIGTERM cannot remove its own). The next claim or release
clears stale holders with a warning, and a protocol that neither a log nor a live holder backs; a refusal names
what holds the protocol (logs, running jobs). Damaged shared files (the protocol, the configuration records) fail
in `check_protocol`, before any model loads, naming the file and the fix.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from steer_hydra.analysis.compare import CellSelection
from steer_hydra.analysis.logs import CONFIGS_DIR
from steer_hydra.app.console import is_tty
from steer_hydra.app.judge import check_judge, judge_role
from steer_hydra.app.secrets import redact
from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.controls import BaseControl
from steer_hydra.core.files import locked, on_this_host, process_gone, process_identity, read_json, write_json
from steer_hydra.core.identity import BASELINE_CONFIG_ID, canonical_value, config_digest
from steer_hydra.core.source import ModelSource
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.evaluation.options import ProviderOptions
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.evaluation.suite import RETRY_FIELDS, InspectSuite

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
HOLDERS_DIR = "holders"  # save_dir/protocol/holders/<suite>.<host>.<pid>.<uuid>: one per job holding a claim
HOLDER_REFRESH_S = 60.0  # a job touches its holder this often while it runs
HOLDER_LEASE_S = 600.0  # a holder not touched for this long is stale on any host (its job is gone)
# `model` keys that do not change what a log holds: the display name, and the layer the concept controls default to
# (the layer a control steers is part of its config_id).
MODEL_KEYS_OUTSIDE_PROTOCOL = ("name", "steering_layer")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key and the fix."""


def display_name(name: str, config_id: str, default_config_id: str | None) -> str:
    """The arm's readable name: `name` for its YAML defaults, else `name@config_id` (one per configuration)."""
    return name if config_id == default_config_id else f"{name}@{config_id}"


def _choices() -> dict[str, Any]:
    """The job's group choices, plus its `hydra.searchpath` (user config groups) under that key, inside the app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    return {**hydra_cfg.runtime.choices, "hydra.searchpath": list(hydra_cfg.searchpath or [])}


def arm_default_config_id(arm_choice: str, choices: Mapping[str, Any] | None = None) -> str | None:
    """The config_id of arm option `arm_choice` as its file defines it (under the job's model, experiment and
    concept: `choices["concept"]`, when given, is the job's top-level `concept`).

    None when the option cannot be composed (an arm given inline): such an arm always shows its config_id.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    choices = _choices() if choices is None else choices
    overrides = [f"arm={arm_choice}"] + [
        f"{group}={choices[group]}" for group in ("model", "experiment") if choices.get(group) is not None
    ]
    if choices.get("concept") is not None:  # a concept arm is named by its method whatever the concept
        overrides.append(f"concept={json.dumps(str(choices['concept']))}")
    if choices.get("hydra.searchpath"):  # the user's own groups (an arm defined outside the package)
        overrides.append(f"hydra.searchpath=[{','.join(choices['hydra.searchpath'])}]")
    try:
        if GlobalHydra.instance().is_initialized():  # inside the app: its search path, user groups included
            cfg = compose("config", overrides=overrides)
        else:
            with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
                cfg = compose("config", overrides=overrides)
        return config_digest(config_descriptor_from_controls(build_controls(cfg.arm.controls)))
    except Exception as error:  # noqa: BLE001 - any failure only costs the short display name
        logger.debug("Cannot compose arm=%s for its default config_id: %s", arm_choice, error)
        return None


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


@dataclass(frozen=True, slots=True)
class Holder:
    """One job's hold on a suite's protocol: its file, what the file says (`{}` when unreadable) and its age."""

    path: Path
    info: Mapping[str, Any]
    age_s: float

    @classmethod
    def read(cls, path: Path, suite: str) -> Holder | None:
        """The holder at `path` when it holds `suite` (None for another suite's, or a file gone meanwhile)."""
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            info = read_json(path)
        except (OSError, ValueError):  # empty or unreadable: judged by its name and age only
            info = None
        if not isinstance(info, Mapping):
            return cls(path, {}, age) if path.name.startswith(f"{suite}.") else None
        return cls(path, info, age) if info.get("suite") == suite else None

    def describe(self) -> str:
        """`pid 12 on host h, arm pasta, claimed 2026-01-01T00:00:00Z`, or the file's name when it says nothing."""
        if not self.info:
            return f"holder {self.path.name}"
        pid, host, arm, claimed = (self.info.get(key) for key in ("pid", "host", "arm", "claimed_utc"))
        return f"pid {pid} on host {host}, arm {arm}, claimed {claimed}"

    def stale_reason(self) -> str | None:
        """Why this holder no longer holds anything (its job is gone), or None while its job may still run."""
        if self.info and on_this_host(self.info):
            return "its process is gone" if process_gone(self.info) else None
        if self.age_s > HOLDER_LEASE_S:
            return (
                f"not refreshed for {self.age_s / 60:.0f} min (a running job refreshes it every "
                f"{HOLDER_REFRESH_S:.0f} s; the lease is {HOLDER_LEASE_S / 60:.0f} min)"
            )
        return None


def _refresh_holder(path: Path, stop: threading.Event) -> None:
    """Touch `path` every `HOLDER_REFRESH_S` seconds until `stop` is set (or the file is gone)."""
    while not stop.wait(HOLDER_REFRESH_S):
        try:
            os.utime(path)
        except OSError:
            return


@dataclass(slots=True)
class JobPlan:
    """Everything one job runs, built and validated from the config."""

    arm: str  # display name (see `display_name`)
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
    arm_name: str = ""  # the arm's YAML `name`
    baseline_config_id: str = BASELINE_CONFIG_ID
    experiment: str = ""  # `experiment_name`: recorded in every Inspect log's metadata
    judge: str | None = None  # `judge`: the model judge of the suite's concept tasks (`app.judge`), or None
    judged_tasks: tuple[str, ...] = ()  # the suite's tasks the judge scores
    _holder: Path | None = field(default=None, repr=False)
    _holder_stop: threading.Event | None = field(default=None, repr=False)
    _backend_identity: dict[str, Any] | None = field(default=None, repr=False)

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
        name = plain["arm"]["name"]
        config_id = config_digest(config_descriptor_from_controls(controls))
        choices = {**_choices(), "concept": plain.get("concept")}
        arm_choice = choices.get("arm") or name
        default_id = config_id if config_id == BASELINE_CONFIG_ID and name == "baseline" else None
        default_id = default_id or arm_default_config_id(arm_choice, choices)
        judge = plain.get("judge")
        try:
            judged = check_judge(judge, [str(t) for t in suite.tasks], suite.name)
        except ValueError as error:
            raise ConfigError(str(error)) from error
        baseline = str(plain.get("baseline_arm") or "baseline")
        baseline_id = default_id if baseline == arm_choice else None
        if baseline_id is None:
            baseline_id = BASELINE_CONFIG_ID if baseline == "baseline" else arm_default_config_id(baseline, choices)
        if baseline_id is None:
            raise ConfigError(
                f"baseline_arm={baseline!r} is not an arm option that composes. Fix: set baseline_arm to one of the "
                "arm group's options (e.g. baseline_arm=baseline)."
            )
        return cls(
            arm=display_name(name, config_id, default_id),
            config_id=config_id,
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
            arm_name=name,
            baseline_config_id=baseline_id,
            experiment=str(plain.get("experiment_name") or ""),
            judge=judge,
            judged_tasks=judged,
        )

    def protocol(self) -> dict[str, Any]:
        """What makes logs in `save_dir` comparable: everything but the arm (which has its own directory) and the
        suite's retry policy; once a cell is about to run, the backend's `identity()` (a server's served model
        rather than its address); the content of the suite's concept, when its tasks read one; the judge, when there
        is one (absent otherwise, so earlier protocols still match). Values that look like secrets are redacted
        (the file is shared and read)."""
        backend: dict[str, Any] = {"kind": self.backend.kind, "options": self._backend_protocol_options()}
        if self._backend_identity is not None:
            backend["identity"] = self._backend_identity
        suite = {f.name: getattr(self.suite, f.name) for f in fields(self.suite) if f.name not in RETRY_FIELDS}
        concept = (suite.get("task_args") or {}).get("concept")
        if concept is not None:  # a concept file's path says nothing of its content: an edited file is another one
            from steer_hydra.tasks.concepts import concept_digest

            suite["concept_content"] = concept_digest(str(concept))
        return redact(
            canonical_value(
                {
                    "model": {k: v for k, v in self.model.items() if k not in MODEL_KEYS_OUTSIDE_PROTOCOL},
                    "backend": backend,
                    "provider": self.options,
                    "generate_defaults": self.generate_defaults,
                    "suite": suite,
                    "seed": self.seed,
                    **({"judge": self.judge} if self.judge else {}),
                }
            )
        )

    def _backend_protocol_options(self) -> dict[str, Any]:
        """Backend options that bear on what is generated, as the backend declares (a server's address does not)."""
        return self.backend.protocol_options()

    @property
    def protocol_path(self) -> Path:
        return self.save_dir / "protocol" / f"{self.suite.name}.json"

    @property
    def _lock_path(self) -> Path:
        return self.save_dir / LOCK_FILE

    def check_protocol(self) -> None:
        """Refuse a save_dir whose logs or running jobs for this suite hold another protocol (they would be
        reused), a damaged protocol file that something holds, and damaged configuration records; read-only."""
        self._check_config_records()
        if not self.protocol_path.exists():
            return
        try:
            if not self._protocol_changes():
                return
        except ConfigError:  # damaged: an error only while something holds it (the claim clears it otherwise)
            with locked(self._lock_path):
                live, logs = self._holds()
                if live or logs:
                    raise
            return
        with locked(self._lock_path):
            live, logs = self._holds()
            changed = self._protocol_changes() if self.protocol_path.exists() else []
            if changed and (live or logs):
                raise ConfigError(self._refusal(changed, live, logs))

    def _read_protocol(self) -> dict[str, Any]:
        """The suite's recorded protocol; a damaged file raises ConfigError naming it and the fix."""
        try:
            previous = read_json(self.protocol_path)
        except ValueError as error:
            previous, reason = None, str(error.__cause__ or error)
        else:
            reason = f"a JSON {type(previous).__name__}, not an object"
        if not isinstance(previous, dict):
            raise ConfigError(
                f"{self.protocol_path} is damaged ({reason}). It records the protocol (model, backend, provider, "
                f"generation settings, suite, seed) of the logs and running jobs of suite {self.suite.name!r} in "
                f"save_dir {self.save_dir}. Fix: if they were made with this command's settings, delete the file and "
                "re-run (the job writes it again); otherwise set experiment_name=<new name> (or save_dir=...)."
            )
        return previous

    def _protocol_changes(self) -> list[str]:
        """`key: old -> new` of the recorded protocol against this job's (empty when they match)."""
        previous, current = self._read_protocol(), self.protocol()
        if "identity" not in current["backend"]:  # not loaded yet: compared at the claim
            previous.get("backend", {}).pop("identity", None)
        return changed_leaves(previous, current) if previous != current else []

    def _refusal(self, changed: list[str], live: list[Holder], logs: list[Path]) -> str:
        """What holds the other protocol (logs, running jobs) and how to go on; one line."""
        held = []
        if logs:
            cells = sorted({log.parent.relative_to(self.save_dir).as_posix() for log in logs})
            shown = ", ".join(cells[:3]) + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")
            held.append(f"{len(logs)} Inspect log(s) in {shown}")
        if live:
            held.append(f"{len(live)} running job(s) with a claim on it ({'; '.join(h.describe() for h in live[:3])})")
        holding = f", held by {' and by '.join(held)}" if held else ""
        message = (
            f"save_dir {self.save_dir} holds suite {self.suite.name!r} under another protocol "
            f"({self.protocol_path}; changed: {'; '.join(changed[:6])}){holding}. "
        )
        if logs:
            message += "Inspect would resume those logs as if nothing changed. "
        else:
            message += "No log of the suite exists yet. "
        message += (
            "Fix: set experiment_name=<new name> (or save_dir=...) for the new protocol, or restore the old settings"
        )
        if any(change.startswith("judge:") for change in changed) and logs:
            message += (
                "; to judge the finished logs without generating again, run python -m steer_hydra.rescore "
                f"{self.save_dir} judge=<model>"
            )
        if live and not logs:
            message += "; or wait for those jobs to end (a job that ends without a log releases its claim)"
        remote = [holder for holder in live if not (holder.info and on_this_host(holder.info))]
        if remote:
            message += (
                f"; a claim from another host counts until its job has not refreshed it for {HOLDER_LEASE_S / 60:.0f} "
                f"min: if that job is gone, delete {remote[0].path}"
            )
        return message + "."

    def _check_config_records(self) -> None:
        """Every `save_dir/configs/*.json` must be a whole configuration record: every job's results table and a
        sweep's aggregate read them all (the arm names), so a damaged one would fail only after the evaluation."""
        folder = self.save_dir / CONFIGS_DIR
        damaged = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                record = read_json(path)
            except (OSError, ValueError) as error:
                damaged.append(f"{path} ({error.__cause__ or error})")
                continue
            if not isinstance(record, dict) or not {"config_id", "arm"} <= set(record):
                damaged.append(f"{path} (not a configuration record: it needs 'config_id' and 'arm')")
        if damaged:
            raise ConfigError(
                f"save_dir {self.save_dir} has {len(damaged)} damaged configuration record(s): {'; '.join(damaged)}. "
                "Every job's results and a sweep's aggregate read these records (the arm names). Fix: delete the "
                "file(s) and re-run; the results stay in the Inspect logs, and a record is written again when a job "
                "of its configuration next evaluates a cell (until then tables name that configuration by its "
                "config_id)."
            )

    def _holds(self) -> tuple[list[Holder], list[Path]]:
        """The live holders and the logs of this suite in save_dir (stale holders are left alone)."""
        live = [holder for holder in self._holders() if holder.stale_reason() is None]
        return live, self._suite_logs()

    def _holders(self) -> list[Holder]:
        folder = self.save_dir / "protocol" / HOLDERS_DIR
        found = (Holder.read(path, self.suite.name) for path in sorted(folder.iterdir())) if folder.is_dir() else ()
        return [holder for holder in found if holder is not None]

    def _suite_logs(self) -> list[Path]:
        return sorted((self.save_dir / "inspect_logs").glob(f"*/trial_*/{self.suite.name}/**/*.eval"))

    def _clear_stale_claims(self) -> None:
        """Under the save_dir lock: remove stale holders (a warning each), then the protocol when no log of the
        suite exists and no live holder remains."""
        live = []
        for holder in self._holders():
            reason = holder.stale_reason()
            if reason is None:
                live.append(holder)
                continue
            logger.warning(
                "Clearing a stale claim on suite %s: %s left %s and %s.",
                self.suite.name,
                holder.describe(),
                holder.path,
                reason,
            )
            holder.path.unlink(missing_ok=True)
        if not live and self.protocol_path.exists() and not self._suite_logs():
            logger.info(
                "No log of suite %s exists and no running job holds its protocol: removing %s.",
                self.suite.name,
                self.protocol_path,
            )
            self.protocol_path.unlink(missing_ok=True)

    def claim_protocol(self, *_cell: Any, pipeline: Any = None) -> None:
        """Check and claim this suite's protocol and record this configuration, atomically under the save_dir lock.

        Called by the runner right before the first cell is evaluated (idempotent), with the loaded `pipeline`
        whose backend identity joins the protocol; `release_claim` undoes a claim that no log came to back.
        Stale claims (see the module docstring) are cleared first.
        """
        if self._holder is not None:
            return
        if pipeline is not None:
            self._backend_identity = pipeline.backend_identity()
        with locked(self._lock_path):
            self._clear_stale_claims()
            if self.protocol_path.exists():
                changed = self._protocol_changes()
                if changed:
                    live, logs = self._holds()
                    raise ConfigError(self._refusal(changed, live, logs))
            else:
                write_json(self.protocol_path, self.protocol())
            identity = process_identity()
            host = re.sub(r"[^A-Za-z0-9_-]", "-", str(identity["host"]))
            holder = (
                self.save_dir
                / "protocol"
                / HOLDERS_DIR
                / f"{self.suite.name}.{host}.{identity['pid']}.{uuid.uuid4().hex}"
            )
            write_json(
                holder,
                {
                    "suite": self.suite.name,
                    "config_id": self.config_id,
                    "arm": self.arm,
                    "claimed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    **identity,
                },
            )
            self._holder = holder
            self._holder_stop = threading.Event()
            threading.Thread(
                target=_refresh_holder, args=(holder, self._holder_stop), name="steer_hydra-claim", daemon=True
            ).start()
            write_json(
                self.save_dir / CONFIGS_DIR / f"{self.config_id}.json",
                {
                    "arm": self.arm,
                    "arm_name": self.arm_name,
                    "config_id": self.config_id,
                    "controls": canonical_value(config_descriptor_from_controls(self.controls)),
                },
            )

    def release_claim(self) -> None:
        """Drop this job's hold on the protocol; remove the claim if no log of the suite exists and nobody (alive)
        holds it."""
        if self._holder is None:
            return
        if self._holder_stop is not None:
            self._holder_stop.set()
            self._holder_stop = None
        with locked(self._lock_path):
            self._holder.unlink(missing_ok=True)
            self._holder = None
            self._clear_stale_claims()

    def selection(self) -> CellSelection:
        """The cells this job reports: its configuration and the baseline, its trials, its suite, its save_dir."""
        return CellSelection(
            save_dirs={self.seed: self.save_dir},
            config_ids=[self.config_id],
            baseline_config_id=self.baseline_config_id,
            suite=self.suite.name,
            model=self.model["name"],
            trial_ids=tuple(range(self.num_trials)),
            names={self.config_id: self.arm},
        )

    @property
    def source(self) -> ModelSource:
        """The `model` group as the `ModelSource` every pipeline of this job loads."""
        return ModelSource.from_config(self.model)

    def runner(self) -> SteeringEval:
        """The library runner for this job (one configuration, one suite); it claims the protocol before its cell."""
        return SteeringEval(
            {self.arm: self.controls},
            self.source,
            [self.suite],
            backend=self.backend,
            num_trials=self.num_trials,
            seed=self.seed,
            provider_options=self.options,
            generate_defaults=self.generate_defaults,
            on_unsupported=self.on_unsupported,
            save_dir=self.save_dir,
            progress=self.progress and is_tty(),  # a live bar on a terminal, quiet in logs and pipes
            display=self.display,
            before_cell=self.claim_protocol,
            log_metadata={
                "arm_name": self.arm_name,
                "model": self.model["name"],
                "experiment": self.experiment,
                "seed": self.seed,
            },
            **self._judging(),
        )

    def _judging(self) -> dict[str, Any]:
        """The runner's `model_roles` and `scorers` for the judge (none without one): the judge bound to the
        "judge" role, `concept_judge` beside the rule scorers of each judged task."""
        if not self.judge:
            return {}
        from steer_hydra.tasks.judge import JUDGE_ROLE, concept_judge

        return {
            "model_roles": {JUDGE_ROLE: judge_role(self.judge)},
            "scorers": {task: [concept_judge()] for task in self.judged_tasks},
        }


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_leaves(previous: Any, current: Any) -> list[str]:
    """`key.path: old -> new` for every leaf that differs between two protocols (`<absent>` for a missing leaf)."""
    before, after = _leaves(previous), _leaves(current)
    absent = "<absent>"
    return [
        f"{key}: {before.get(key, absent)!r} -> {after.get(key, absent)!r}"
        for key in sorted(set(before) | set(after))
        if before.get(key, absent) != after.get(key, absent)
    ]
