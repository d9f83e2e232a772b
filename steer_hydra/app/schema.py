"""Structured configs (ConfigStore schemas) that validate every config group before any model loads, and the
resolvers that guard the directories a job creates.

The primary config `config.yaml` extends `steer_hydra_schema`, so each group option is merged into a typed node:
an unknown key, a wrong type or a value outside a closed set fails at compose time with OmegaConf's message
(which names the key and, for enums, the valid values). Control arguments are validated by instantiating the
controls (their `Args` dataclasses), still before any model loads.

Directories: Hydra creates the job's run (or sweep) directory before the job function runs, so the names that
become directories are checked while Hydra resolves those paths. `config.yaml` builds `hydra.run.dir`,
`hydra.sweep.dir`, `hydra.sweep.subdir` and `save_dir` through two resolvers registered here:
`${steer_hydra.dir_name:KEY}` (the value of KEY, refused unless it is one plain path component) and
`${steer_hydra.writable_dir:KEY}` (the value of KEY, refused unless that directory exists writable or can be
created; a relative value is made absolute against the directory the command was launched from). A refusal while
Hydra resolves one of its own keys (`hydra.*`) exits at once with the one-line
`steer_hydra: invalid configuration: ...` message, before any directory exists (Hydra prints any exception
raised there with a traceback); elsewhere (`save_dir`) it raises `ConfigError`, which pre-flight reports.
"""

from __future__ import annotations

import enum
import os
import sys
import tempfile
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional  # noqa: UP035  (OmegaConf needs typing.Optional/Dict/List)

from hydra.core.config_store import ConfigStore
from inspect_ai.util import DisplayType
from omegaconf import MISSING, OmegaConf

from steer_hydra.core.backend import BACKENDS
from steer_hydra.core.params import DEFAULT_SEED_SCOPE, SEED_SCOPES
from steer_hydra.evaluation.options import BATCHING_MODES, SPLIT_MODES, UNSUPPORTED_POLICIES
from steer_hydra.evaluation.runner import ON_UNSUPPORTED


def _choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A closed set of strings as an Enum whose member names are the values (OmegaConf validates by name)."""
    return enum.Enum(name, {v: v for v in values}, module=__name__)


# The value sets come from the library (a test pins it); backend kinds are the registry's names, which are also
# the option names of the `backend` group.
BackendKind = _choices("BackendKind", tuple(BACKENDS))
SeedScope = _choices("SeedScope", SEED_SCOPES)
ReasoningSplit = _choices("ReasoningSplit", SPLIT_MODES)
Batching = _choices("Batching", BATCHING_MODES)
OnUnsupportedParam = _choices("OnUnsupportedParam", UNSUPPORTED_POLICIES)
OnUnsupported = _choices("OnUnsupported", ON_UNSUPPORTED)
LoggerKind = _choices("LoggerKind", ("wandb", "none"))
WandbMode = _choices("WandbMode", ("auto", "online", "offline", "disabled"))
Display = _choices("Display", typing.get_args(DisplayType))


# `model` group keys that are not the model source (`ModelSource`), so not part of what a save_dir's protocol records:
# the display name, and the layer the concept controls default to (the layer a control steers is in its config_id).
MODEL_KEYS_OUTSIDE_PROTOCOL = ("name", "steering_layer")


@dataclass
class ModelConfig:
    """`model` group: a base model reference and its loading kwargs."""

    name: str = MISSING
    model_name_or_path: str = MISSING
    hf_model_kwargs: dict[str, Any] = field(default_factory=dict)
    device_map: Any = "auto"
    trust_remote_code: bool = False
    # The decoder layer the concept controls steer by default (`layer_id: ${model.steering_layer}`); None leaves
    # each control's own default. Not part of the model's identity in a save_dir's protocol.
    steering_layer: Optional[int] = None  # noqa: UP045


@dataclass
class ArmConfig:
    """`arm` group: a named pipeline configuration; `controls` maps a slot name to a `control` group node."""

    name: str = MISSING
    controls: dict[str, Any] = field(default_factory=dict)


@dataclass
class SuiteConfig:
    """`suite` group: an `InspectSuite`."""

    name: str = MISSING
    tasks: list[str] = MISSING
    limit: Optional[int] = None  # noqa: UP045
    sample_ids: Optional[dict[str, list[Any]]] = None  # noqa: UP045
    task_args: dict[str, Any] = field(default_factory=dict)
    generate_overrides: dict[str, Any] = field(default_factory=dict)
    retry_attempts: int = 1
    retry_on_error: int = 1
    max_tasks: int = 1  # tasks evaluated side by side, sharing the provider's batches (not in the save_dir protocol)


@dataclass
class ProviderConfig:
    """`provider` group: `ProviderOptions`. Shapes only: the values (e.g. `max_batch_size >= 1`) are validated by
    `ProviderOptions` itself, which `JobPlan.from_config` builds before any model loads."""

    runtime_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: Optional[dict[str, Any]] = None  # noqa: UP045
    max_batch_size: int = 8
    default_max_tokens: int = 1024
    reasoning_tags: Optional[list[str]] = field(default_factory=lambda: ["<think>", "</think>"])  # noqa: UP045
    reasoning_opened_at_start: bool = False
    reasoning_split: ReasoningSplit = ReasoningSplit.auto
    on_unsupported_param: OnUnsupportedParam = OnUnsupportedParam["raise"]
    seed_scope: SeedScope = SeedScope[DEFAULT_SEED_SCOPE]
    batching: Batching = Batching.auto  # stream on vLLM, refill where the arm allows it (Hugging Face), else static


@dataclass
class BackendConfig:
    """`backend` group: where generation runs and its options (engine kwargs, server settings)."""

    kind: BackendKind = BackendKind.huggingface
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    """`logger` group: W&B tracking (`auto` = offline unless WANDB_MODE says otherwise; `online` on request) or none."""

    kind: LoggerKind = LoggerKind.wandb
    project: str = "steer_hydra"
    entity: Optional[str] = None  # noqa: UP045
    mode: WandbMode = WandbMode.auto
    init_timeout: float = 30.0  # seconds an online init may take before the run falls back to offline
    log_samples: bool = True
    log_artifact: bool = True


@dataclass
class JudgeOptionsConfig:
    """`judge_options`: the model judge's token budget and the bounds of each call to a judge reached over the network
    (steer_hydra/app/judge.py `JudgeOptions`): Inspect retries a provider that never answers without limit unless
    told."""

    max_tokens: int = 512  # the judge's token budget per reply (its reasoning and the rating line)
    attempt_timeout: int = 120  # seconds one attempt may take; then it is abandoned and retried
    max_retries: int = 2  # retries of a failed or abandoned attempt
    timeout: int = 400  # seconds one judge call may take over all its attempts
    base_url: Optional[str] = None  # noqa: UP045 - the judge's server (http://host:port/v1); None: Inspect's setting


@dataclass
class AppConfig:
    """The whole job: one arm of one model on one suite, `num_trials` trials from `seed`."""

    model: ModelConfig = MISSING
    arm: ArmConfig = MISSING
    suite: SuiteConfig = MISSING
    provider: ProviderConfig = field(default_factory=ProviderConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    experiment_name: str = "default"
    output_root: str = "outputs"
    save_dir: str = MISSING
    seed: Optional[int] = 0  # noqa: UP045
    num_trials: int = 1
    generate_defaults: dict[str, Any] = field(default_factory=dict)
    on_unsupported: OnUnsupported = OnUnsupported["raise"]
    display: Display = Display.none
    progress: bool = True
    # The job's plots (metrics.png, paired_deltas.png beside its CSVs); a study's jobs skip them (the study draws its
    # own), which saves about half a second a job on a CPU.
    plots: bool = True
    baseline_arm: str = "baseline"
    tags: list[str] = field(default_factory=list)
    # The steering strength arms read as ${strength} (e.g. the concept arms' multiplier), so a study sweeps one
    # key for every method; arms that do not reference it ignore it (their config_id does not change).
    strength: float = 0.5
    # The model judge of the concept-steering task (`concept_judge` beside its rule scorers, bound to Inspect's model
    # role "judge"): an Inspect model string (vllm/<model> or openai/<model> with judge_options.base_url, hf/...),
    # steer_hydra/<model option> (steer_hydra/smollm2) or steer_hydra/scripted (offline, for trying the path out).
    # None: rule scorers only (steer_hydra/app/judge.py).
    judge: Optional[str] = None  # noqa: UP045
    judge_options: JudgeOptionsConfig = field(default_factory=JudgeOptionsConfig)
    # The concept the concept suites and controls read as ${concept}: a built-in concept's name (weddings, joy,
    # pirate, money, dragons, sadness, shakespearean, french) or the path of a concept file (.yaml / .yml; see
    # steer_hydra/tasks/concepts.py). Pre-flight loads it, so a bad file is refused before any model loads.
    concept: str = "weddings"
    # Keep the loaded base model (or booted vLLM engine) for the next job of this process that uses the same model
    # (a sweep under the basic launcher, a joblib/Ray worker): controls are applied to it and released from it, as on
    # a fresh load. false: every job loads its own (steer_hydra/core/resident.py).
    residency: bool = True
    # With an engine backend (backend=vllm, or vllm_serve with launch=true): fit the jobs' vectors on one Hugging
    # Face load, and train their adapters (SFT, DPO) and choose their instructions (prompt optimizers), in the
    # launching process before any engine or server starts (steer_hydra/app/prefit.py). false: each job does its
    # own as it starts (e.g. where the launching machine is a cluster's login node).
    fit_ahead: bool = True
    # The study's concept list and how many of it to run (read by the study sweeper from the command line, never
    # by a job): concepts=[a,b], concepts=<file listing them>, concepts=axbench:<folder or hub id> or
    # concepts=steereval:<...> (a published dataset's concepts; steer_hydra/tasks/concept_sets.py); concepts_limit=N.
    concepts: Optional[Any] = None  # noqa: UP045
    concepts_limit: Optional[int] = None  # noqa: UP045


SCHEMA_NAME = "steer_hydra_schema"
DIR_NAME_RESOLVER = "steer_hydra.dir_name"
WRITABLE_DIR_RESOLVER = "steer_hydra.writable_dir"
CONCEPT_NAME_RESOLVER = "steer_hydra.concept_name"
INVALID_CONFIGURATION = "steer_hydra: invalid configuration: "  # the prefix of every refused command's line


def dir_name_problem(key: str, value: Any) -> str | None:
    """Why `value` of `key` cannot be one directory name (None when it can): no `..`, no separator, not empty."""
    text = "" if value is None else str(value)
    bad = (
        not text.strip()
        or ".." in text
        or any(sep in text for sep in ("/", "\\", os.sep, "\0"))
        or text in (".", "~")
        or text.startswith("~")
    )
    if not bad:
        return None
    return (
        f"{key}={text!r} becomes a directory name, so it must be one plain path component (no '..', no '/' or "
        f"'\\', not empty). Fix: {key}=<name> with letters, digits, '-', '_' or '.' (set output_root or save_dir to "
        "choose where outputs go)."
    )


def writable_dir_problem(key: str, value: Any) -> str | None:
    """Why the directory `value` of `key` cannot be written (None when it exists writable or can be created).

    Leaves nothing behind: an empty directory is created in the nearest existing ancestor and removed at once (the
    only test that holds for root, read-only mounts and pseudo filesystems alike).
    """
    text = "" if value is None else str(value)
    if not text.strip():
        return f"{key} is empty, so outputs would land at the filesystem root. Fix: {key}=<a writable directory>."
    target = os.path.abspath(text)
    probe = target
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    fix = f"Fix: {key}=<a directory you can write to>" + (" (or save_dir=...)." if key == "output_root" else ".")
    if not os.path.isdir(probe):
        what = "the directory" if probe == target else f"its parent {probe!r}"
        return f"{key}={text!r} cannot be created: {what} is a file, not a directory. {fix}"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".steer_hydra-write-check-", dir=probe))
    except OSError as error:
        where = "it" if probe == target else f"its nearest existing parent {probe!r}"
        return f"{key}={text!r} is not writable: {where} refuses new entries ({error.strerror}). {fix}"
    return None


def _refuse(problem: str, node: Any) -> None:
    """Exit with the one-line message while Hydra resolves its own directories, else raise `ConfigError`."""
    full_key = node._get_full_key(None) if hasattr(node, "_get_full_key") else ""
    if str(full_key).startswith("hydra."):
        # Hydra resolves hydra.run.dir / hydra.sweep.* inside its error reporter, which prints a traceback for any
        # exception; a SystemExit passes it (and OmegaConf) untouched, before the directory is created.
        sys.exit(INVALID_CONFIGURATION + problem)
    from steer_hydra.core.errors import ConfigError

    raise ConfigError(problem)


def _guarded(problem_of: Callable[[str, Any], str | None], absolute: bool = False) -> Callable[..., Any]:
    """A resolver `${name:KEY}` that returns KEY's value, refused (`_refuse`) when `problem_of(KEY, value)` says.

    `absolute`: a relative value is returned joined to the directory the command was launched from
    (`hydra.runtime.cwd`, recorded when Hydra composed the config), so a job that runs elsewhere (a Ray worker
    starts in the directory its node's `ray start` ran in) writes where the launching command meant."""

    def resolver(key: str, _node_: Any, _root_: Any) -> Any:
        value = OmegaConf.select(_root_, key, throw_on_missing=True)
        if absolute and value is not None and str(value).strip() and not os.path.isabs(os.path.expanduser(str(value))):
            launched_from = OmegaConf.select(_root_, "hydra.runtime.cwd", default=None) or _launch_dir()
            value = os.path.normpath(os.path.join(str(launched_from), str(value)))
        problem = problem_of(key, value)
        if problem:
            _refuse(problem, _node_)
        return value

    return resolver


def _launch_dir() -> str:
    """The directory the running Hydra app was launched from (a job's config has no `hydra` node: Hydra keeps it in
    `HydraConfig`), else this process's working directory."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return str(HydraConfig.get().runtime.cwd)
    return os.getcwd()


def register_resolvers() -> None:
    """Register `steer_hydra.dir_name`, `steer_hydra.writable_dir` (see the module docstring) and
    `steer_hydra.concept_name` (the concept suites' names carry it, so each concept has its own cells); idempotent."""
    if not OmegaConf.has_resolver(DIR_NAME_RESOLVER):
        OmegaConf.register_new_resolver(DIR_NAME_RESOLVER, _guarded(dir_name_problem))
    if not OmegaConf.has_resolver(WRITABLE_DIR_RESOLVER):
        OmegaConf.register_new_resolver(WRITABLE_DIR_RESOLVER, _guarded(writable_dir_problem, absolute=True))
    if not OmegaConf.has_resolver(CONCEPT_NAME_RESOLVER):
        OmegaConf.register_new_resolver(CONCEPT_NAME_RESOLVER, _concept_name)


def _concept_name(key: str, _root_: Any) -> str:
    """`${steer_hydra.concept_name:KEY}`: the name of the concept KEY holds (a built-in name or a concept file)."""
    from steer_hydra.tasks.concepts import concept_name

    return concept_name(str(OmegaConf.select(_root_, key, throw_on_missing=True)))


def register_configs() -> None:
    """Store the schemas (idempotent): the primary schema and one per group for user-defined options; register the
    directory resolvers `config.yaml` uses."""
    register_resolvers()
    # `hydra/launcher=ray` is our YAML over hydra-ray-launcher's config of the same name, which Hydra then uses as its
    # schema (wanted: a misspelt key is refused) while warning that this matching by name is deprecated.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/ray' is validated against ConfigStore schema")
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=AppConfig)
    for group, node in (
        ("model", ModelConfig),
        ("arm", ArmConfig),
        ("suite", SuiteConfig),
        ("provider", ProviderConfig),
        ("backend", BackendConfig),
        ("logger", LoggerConfig),
    ):
        store.store(group=f"schema/{group}", name=group, node=node)
