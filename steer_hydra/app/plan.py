"""Turn a composed Hydra config into the library objects of one job (controls, suite, options, runner) and the job's
claim on its suite's protocol in the shared save_dir.

Everything that can be wrong with a config fails here, before any model loads: control arguments (their
`Args` dataclasses name the field and the valid arguments), suite and provider options, the backend kind,
and a save_dir whose earlier protocol differs from this job's (`store.SuiteClaim.check`).

Identity: `config_id` is the digest of the arm's controls (`baseline` for none); it keys every result. The arm's
display name (`arm`) is its YAML `name` when its controls are the arm file's defaults, else `<name>@<config_id>`,
so differently configured arms never share a name (`display_name` is the one place that builds it); `arm_name` is
the YAML `name` itself.

The protocol is the runner's (`SteeringEval.protocol`: the one evaluation setting that also keys its cells),
with secret-looking values redacted (the file is shared and read). A job claims it only right before it evaluates
its first cell (its model loaded and steered, whose backend identity then joins it), and a job that fails before
any log of the suite exists, with no other job holding the claim, removes it again (`store.claims`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from steer_hydra.analysis.compare import CellSelection
from steer_hydra.app.compose import compose_config, job_choices, to_plain
from steer_hydra.app.console import is_tty
from steer_hydra.app.judge import JudgeOptions, check_judge, judge_role
from steer_hydra.app.secrets import redact
from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.controls import BaseControl
from steer_hydra.core.errors import ConfigError
from steer_hydra.core.identity import BASELINE_CONFIG_ID, canonical_value, config_digest
from steer_hydra.core.source import ModelSource
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.evaluation.options import ProviderOptions
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.evaluation.suite import InspectSuite
from steer_hydra.store import SaveDir, SuiteClaim

logger = logging.getLogger(__name__)

__all__ = ["ConfigError", "JobPlan", "arm_default_config_id", "build_controls", "display_name", "to_plain"]

NEW_PROTOCOL_FIX = "set experiment_name=<new name> (or save_dir=...)"


def display_name(name: str, config_id: str, default_config_id: str | None) -> str:
    """The arm's readable name: `name` for its YAML defaults, else `name@config_id` (one per configuration)."""
    return name if config_id == default_config_id else f"{name}@{config_id}"


def arm_default_config_id(arm_choice: str, choices: Mapping[str, Any] | None = None) -> str | None:
    """The config_id of arm option `arm_choice` as its file defines it (under the job's model, experiment and
    concept: `choices["concept"]`, when given, is the job's top-level `concept`).

    None when the option cannot be composed (an arm given inline): such an arm always shows its config_id.
    """
    choices = job_choices() if choices is None else choices
    overrides = [f"arm={arm_choice}"] + [
        f"{group}={choices[group]}" for group in ("model", "experiment") if choices.get(group) is not None
    ]
    if choices.get("concept") is not None:  # a concept arm is named by its method whatever the concept
        overrides.append(f"concept={json.dumps(str(choices['concept']))}")
    if choices.get("hydra.searchpath"):  # the user's own groups (an arm defined outside the package)
        overrides.append(f"hydra.searchpath=[{','.join(choices['hydra.searchpath'])}]")
    try:
        cfg = _composed_arm(tuple(overrides), _search_path())
        return config_digest(config_descriptor_from_controls(build_controls(cfg.arm.controls)))
    except Exception as error:  # noqa: BLE001 - any failure only costs the short display name
        logger.debug("Cannot compose arm=%s for its default config_id: %s", arm_choice, error)
        return None


@functools.lru_cache(maxsize=64)
def _composed_arm(overrides: tuple[str, ...], search_path: tuple[str, ...]) -> DictConfig:
    """The config of an arm option as its file defines it, composed once per process (about 0.4 s each): the jobs
    of a sweep ask for the same few. Keyed by the config search path too (the files it composes from); the
    controls are built from it afresh each time, so concept data is read as it is now."""
    return compose_config(list(overrides))


def _search_path() -> tuple[str, ...]:
    """Where Hydra composes from now (the running app's search path), or () outside an initialized Hydra."""
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance()
    if not hydra.is_initialized():
        return ()
    return tuple(f"{e.provider}={e.path}" for e in hydra.config_loader().get_search_path().get_path())


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
    judge_options: JudgeOptions = field(default_factory=JudgeOptions)  # `judge_options`: its budget and call bounds
    residency: bool = True  # `residency`: keep the loaded base for the next job of this process (`core.resident`)
    _runner: SteeringEval | None = field(default=None, repr=False)
    _claim: SuiteClaim | None = field(default=None, repr=False)
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
        choices = {**job_choices(), "concept": plain.get("concept")}
        arm_choice = choices.get("arm") or name
        default_id = config_id if config_id == BASELINE_CONFIG_ID and name == "baseline" else None
        default_id = default_id or arm_default_config_id(arm_choice, choices)
        judge = plain.get("judge")
        try:
            judged = check_judge(judge, [str(t) for t in suite.tasks], suite.name)
            judge_options = JudgeOptions.from_config(plain.get("judge_options"))
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
            judge_options=judge_options,
            residency=bool(plain.get("residency", True)),
        )

    @property
    def store(self) -> SaveDir:
        """The job's save_dir (`store.SaveDir`: the owner of its layout)."""
        return SaveDir(self.save_dir)

    def protocol(self) -> dict[str, Any]:
        """The suite's protocol (`SteeringEval.protocol`): what makes its logs comparable, with the loaded backend's
        identity once a cell is about to run; secret-looking values redacted (the file is shared and read)."""
        return redact(self.runner().protocol(self.suite, self._backend_identity))

    @property
    def protocol_path(self) -> Path:
        return self.store.protocol_path(self.suite.name)

    @property
    def claim(self) -> SuiteClaim:
        """This job's claim on its suite's protocol (one per plan)."""
        if self._claim is None:
            self._claim = SuiteClaim(
                self.store,
                self.suite.name,
                arm=self.arm,
                config_id=self.config_id,
                new_protocol_fix=NEW_PROTOCOL_FIX,
                rejudge_command=f"python -m steer_hydra.rescore {self.save_dir} judge=<model>",
            )
        return self._claim

    def check_protocol(self) -> None:
        """Refuse, before any model loads, a save_dir whose logs or running jobs hold another protocol for this suite
        (`SuiteClaim.check`)."""
        self.claim.check(self.protocol())

    def claim_protocol(self, *_cell: Any, pipeline: Any = None) -> None:
        """Claim the suite's protocol and record this configuration (`SuiteClaim.claim`); called by the runner right
        before the first cell is evaluated (idempotent), with the loaded `pipeline` whose backend identity joins the
        protocol."""
        if self.claim.held:
            return
        if pipeline is not None:
            self._backend_identity = pipeline.backend_identity()
        self.claim.claim(self.protocol(), self.config_record())

    def release_claim(self) -> None:
        """Drop this job's hold; the protocol goes when no log of the suite exists and nobody alive holds it."""
        self.claim.release()

    def config_record(self) -> dict[str, Any]:
        """The configuration record this job writes into the save_dir (what tables name its config_id by)."""
        return {
            "arm": self.arm,
            "arm_name": self.arm_name,
            "config_id": self.config_id,
            "controls": canonical_value(config_descriptor_from_controls(self.controls)),
        }

    def cells(self) -> CellSelection:
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
        """The library runner for this job (one configuration, one suite; built once); it claims the protocol before
        its cell."""
        if self._runner is None:
            self._runner = self._build_runner()
        return self._runner

    def _build_runner(self) -> SteeringEval:
        from steer_hydra.tasks.concepts import concept_digest

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
            task_arg_digests={"concept": lambda concept: concept_digest(str(concept))},
            residency=self.residency,
            **self._judging(),
        )

    def _judging(self) -> dict[str, Any]:
        """The runner's `model_roles` and `scorers` for the judge (none without one): the judge bound to the
        "judge" role, `concept_judge` beside the rule scorers of each judged task."""
        if not self.judge:
            return {}
        from steer_hydra.tasks.judge import JUDGE_ROLE, concept_judge

        scorer_args = self.judge_options.scorer_args(self.judge)
        return {
            "model_roles": {JUDGE_ROLE: judge_role(self.judge, self.judge_options)},
            "scorers": {task: [concept_judge(**scorer_args)] for task in self.judged_tasks},
        }
