"""`SteeringEval`: every configuration x trial x suite, one steered pipeline at a time, resumable from the logs.

Invariants:
- every configuration is preflighted (`check()`) before any model loads;
- one pipeline is built, steered and released per configuration (`PipelineFactory.steered`), even when a suite
  fails; the shared base model is freed at the end of `run()`;
- each (configuration, trial) gets one trial seed (`derive_trial_seed(seed, config_id, trial_id)`), handed to the
  provider as the seed of requests that set none;
- each (configuration, trial, suite) cell has its own log directory in the save_dir (`store.SaveDir`, the one
  owner of its layout); the `.eval` logs there are the record of the run and the only checkpoint: re-running into
  the same `save_dir` completes only missing samples (a changed protocol needs a new `save_dir`);
- a finished cell without failed samples leaves a small index (its task results, log locations and its key:
  `store.comparable.cell_key` of the suite's evaluation setting and the trial seed, the same setting a save_dir's
  protocol records); a configuration whose cells are all indexed under the same key, with their logs present,
  readable and complete (no invalidated samples), is reused without loading a model (provenance `reused: True`); a
  cell whose log is unreadable is evaluated again, and its log moved aside under the cell's lock
  (`logs.readable_logs`);
- extra scoring (`scorers`, e.g. a model judge, and the `model_roles` its models come from) is part of a cell's
  key, so a cell scored without it is not reused as one scored with it; a role given as a callable is built once,
  at the first cell evaluated (none when every cell is reused), and released at the end of `run()`;
- Inspect is not imported here at module level: frames read the logs lazily.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.analysis.frames import attach_params, cells_frame, results_frame, runs_frame, summarize_runs
from steer_hydra.analysis.logs import log_complete, read_log_header, readable_logs, resolve_log_path, samples_frame
from steer_hydra.analysis.stats import paired_deltas
from steer_hydra.core import resident
from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.controls import declared_scopes
from steer_hydra.core.identity import canonical_value, derive_trial_seed, model_fingerprint
from steer_hydra.core.rendering import has_chat_template
from steer_hydra.core.source import ModelSource
from steer_hydra.core.sweeps import (
    PipelineFactory,
    config_descriptor_from_controls,
    expand_configurations,
    preflight,
)
from steer_hydra.evaluation.suite import InspectSuite, task_name
from steer_hydra.store import Cell, SaveDir, cell_key, evaluation_setting, protocol
from steer_hydra.store.comparable import generation_scope, generation_setting
from steer_hydra.store.generations import GenerationStore

logger = logging.getLogger(__name__)

ON_UNSUPPORTED = ("raise", "skip")

__all__ = [
    "SteeringEval",
    "paired_deltas",
    "runs_frame",
    "samples_frame",
    "summarize_runs",
]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class UnsupportedConfigurationError(ValueError):
    """A configuration the backend cannot run (`SteeringEval.check_support`), found before any model loads."""


class SteeringEval:
    """Evaluate steering configurations (fixed controls, `ControlSpec` sweeps, the empty baseline) on suites.

    Args:
        pipelines: `{arm: [] | [Control, ...] | [ControlSpec, ...]}`; `[]` is the baseline arm.
        source: the model every configuration starts from: a `ModelSource`, or a model reference
            (e.g. `steer_hydra:tiny`).
        suites: `InspectSuite`s with distinct names.
        backend: where generation runs (a `BackendSpec`, a kind string or None for Hugging Face).
        num_trials: repetitions of every (configuration, suite); each trial has its own seed and log directory.
        seed: the seed the run is launched with; trial seeds are `derive_trial_seed(seed, config_id, trial_id)`.
            None: unseeded.
        provider_options: `ProviderOptions` for the Inspect provider (static runtime kwargs, batch size...).
        generate_defaults: generation settings for every suite (a suite's `generate_overrides` win).
        on_unsupported: "raise" (one error listing every unsupported configuration) or "skip" (warn, run the rest).
        save_dir: where logs go (`save_dir/inspect_logs/...`); re-running into it resumes. None: a temporary
            directory (not resumable).
        progress: draw a live bar over the samples (done / total, rate, ETA; `evaluation.progress`).
        display: Inspect's display inside each cell ("none", "plain", ...).
        before_cell: called as `before_cell(config_id, trial_id, suite_name, pipeline=pipeline)` once the
            configuration's pipeline is built and steered, right before each cell is evaluated (not for reused
            cells); the Hydra job claims its save_dir protocol here, so a run that fails earlier claims nothing.
        log_metadata: extra metadata for every Inspect log header (e.g. the experiment), beside the arm, its
            config_id, controls, trial and base model that every log carries (`inspect view` shows them).
        model_roles: Inspect model roles for every cell (`{"judge": "openai/gpt-4o-mini"}`): a model string, an
            Inspect `Model`, or a callable with a `name` that builds the `Model` when the first cell needs it (its
            `release()`, if any, is called at the end of `run()`). Inspect counts them in a task's identity.
        scorers: `{task name: [Inspect scorers]}` appended to those tasks' own scorers in every suite that runs
            them (e.g. a model judge beside rule scorers; its model comes through `model_roles`).
        task_arg_digests: `{task arg: digest function}` for task args that name content (a concept file): the
            digest of the content joins the suite's evaluation setting, so an edited file is another setting.
        residency: keep the loaded base model (or booted engine) in this process after `run()` for the next run
            of the same model, and take one a previous run left (`core.resident`); provenance `model_residency`
            says which happened. False frees anything resident and loads afresh.
    """

    def __init__(
        self,
        pipelines: Mapping[str, Sequence[Any]],
        source: ModelSource | str | None,
        suites: Sequence[InspectSuite],
        *,
        backend: Any = None,
        num_trials: int = 1,
        seed: int | None = None,
        provider_options: Any = None,
        generate_defaults: Mapping[str, Any] | None = None,
        on_unsupported: str = "raise",
        save_dir: str | Path | None = None,
        progress: bool = True,
        display: str = "none",
        before_cell: Callable[..., None] | None = None,
        log_metadata: Mapping[str, Any] | None = None,
        model_roles: Mapping[str, Any] | None = None,
        scorers: Mapping[str, Sequence[Any]] | None = None,
        task_arg_digests: Mapping[str, Callable[[Any], str]] | None = None,
        residency: bool = False,
    ) -> None:
        if not isinstance(pipelines, Mapping):
            raise TypeError(
                "pipelines must be a dict {name: [controls] | [ControlSpec, ...] | []}; "
                f"got {type(pipelines).__name__}."
            )
        if isinstance(num_trials, bool) or not isinstance(num_trials, int) or num_trials < 1:
            raise ValueError(f"num_trials must be an integer >= 1; got {num_trials!r}.")
        if on_unsupported not in ON_UNSUPPORTED:
            raise ValueError(f"on_unsupported must be one of {ON_UNSUPPORTED}; got {on_unsupported!r}.")
        if isinstance(suites, InspectSuite):
            suites = [suites]
        suites = list(suites or [])
        if not suites:
            raise ValueError("suites is empty; pass at least one InspectSuite.")
        names = [s.name for s in suites]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Suite names must be distinct (they name log directories); repeated: {duplicates}.")
        self.pipelines = dict(pipelines)
        self.source = ModelSource.coerce(source)
        self.suites = suites
        self.backend = backend
        self.num_trials = num_trials
        self.seed = seed
        self.provider_options = provider_options
        self.generate_defaults = dict(generate_defaults or {})
        self.on_unsupported = on_unsupported
        self.save_dir = save_dir
        self.progress = progress
        self.display = display
        self.before_cell = before_cell
        self.log_metadata = dict(log_metadata or {})
        self.model_roles = dict(model_roles or {})
        self.scorers = {task: list(found) for task, found in (scorers or {}).items() if found}
        self.task_arg_digests = dict(task_arg_digests or {})
        self.residency = residency
        self._built_roles: dict[str, Any] | None = None
        self._results: dict[str, list[dict[str, Any]]] | None = None
        self._log_root: Path | None = None
        self._params_by_config: dict[str, Mapping[str, Mapping[str, Any]]] = {}

    @property
    def base_model_name_or_path(self) -> str | None:
        """The base model reference (the source's `model_name_or_path`)."""
        return self.source.model_name_or_path

    # ------------------------------------------------------------------------------------------ run
    def check_support(self) -> list[Any]:
        """`check()` every configuration against the backend (no model loads); one report per configuration.

        Raises `UnsupportedConfigurationError` naming each refused control and its fix when one is unsupported and
        `on_unsupported="raise"` (with "skip", `run` skips those configurations with a warning).
        """
        points = expand_configurations(self.pipelines, self.base_model_name_or_path)
        reports = preflight(points, source=self.source, backend=self.backend)
        bad = [r for r in reports if not r.ok]
        if bad and self.on_unsupported == "raise":
            lines = [f"  - {r.point.arm} [{r.point.config_id}]: {m}" for r in bad for m in r.failures]
            raise UnsupportedConfigurationError(
                "Unsupported pipeline configuration(s):\n"
                + "\n".join(lines)
                + "\nFix the configurations, or pass on_unsupported='skip' to run the others."
            )
        return reports

    def run(self) -> dict[str, list[dict[str, Any]]]:
        """Evaluate every configuration x trial x suite; returns `{arm: [run record, ...]}`.

        A run record holds `config_id`, `trial_id`, `seed`, `trial_seed`, `params`, `suites` (`{suite: {task:
        {"metrics", "n", "failed", "log"}}}`, logs relative to `save_dir`) and `provenance`.
        """
        reports = self.check_support()
        bad = [r for r in reports if not r.ok]
        for report in bad:
            logger.warning(
                "Skipping unsupported configuration: %s [%s]: %s",
                report.point.arm,
                report.point.config_id,
                "; ".join(report.failures),
            )
        active = [r for r in reports if r.ok]
        self._warn_protocol(active)

        if self.save_dir is None:
            store = SaveDir(tempfile.mkdtemp(prefix="steering-eval-"))
            logger.info("No save_dir given: logs go to %s; this run is not resumable.", store.root)
        else:
            store = SaveDir(self.save_dir)
            store.root.mkdir(parents=True, exist_ok=True)
        self._log_root = store.root
        self._params_by_config = {r.point.config_id: r.point.params for r in reports}

        results: dict[str, list[dict[str, Any]]] = {name: [] for name in self.pipelines}
        n_cells = len(active) * self.num_trials * len(self.suites)
        logger.info(
            "Evaluating %d configuration(s) x %d trial(s) x %d suite(s) = %d cell(s)",
            len(active),
            self.num_trials,
            len(self.suites),
            n_cells,
        )
        resident.configure(self.residency)
        factory = PipelineFactory(self.source, backend=self.backend)
        bar = contextlib.ExitStack()
        if self.progress:  # registers an Inspect hook: imported only when a bar is wanted
            from steer_hydra.evaluation.progress import sample_progress

            bar.enter_context(sample_progress(enabled=True, desc="samples"))
        cell = 0
        try:
            for report in active:
                point = report.point
                reused = self._reused_records(point, store)
                if reused is not None:
                    logger.info(
                        "Reusing %s [%s]: all %d cell(s) are complete in %s; no model loaded.",
                        point.arm,
                        point.config_id,
                        len(reused) * len(self.suites),
                        store.root,
                    )
                    results[point.arm].extend(reused)
                    cell += len(reused) * len(self.suites)
                    continue
                controls = point.controls_factory()
                with factory.steered(controls) as pipeline:
                    static = self._static_provenance(pipeline, factory, controls)
                    for trial in range(self.num_trials):
                        seed_t = self._trial_seed(point.config_id, trial)
                        generations = self._generations(store, point.config_id, trial)
                        suites_out: dict[str, dict[str, Any]] = {}
                        for suite in self.suites:
                            cell += 1
                            here = Cell(point.config_id, trial, suite.name)
                            log_dir = store.log_dir(here)
                            logger.info(
                                "Cell %d/%d: %s [%s] trial %d suite %s",
                                cell,
                                n_cells,
                                point.arm,
                                point.config_id,
                                trial,
                                suite.name,
                            )
                            if self.before_cell is not None:
                                self.before_cell(point.config_id, trial, suite.name, pipeline=pipeline)
                            # one job at a time per cell: a second job of this configuration waits, then resumes
                            # the cell from its logs (nothing left to generate) instead of generating it again
                            with _root_log_level_kept(), store.locked_cell(here, on_wait=_log_cell_wait):
                                out = suite.run(
                                    pipeline,
                                    log_dir=log_dir,
                                    options=self.provider_options,
                                    trial_seed=seed_t,
                                    model_name=_logged_model_name(log_dir) or model_label(controls, point.config_id),
                                    generate_defaults=self.generate_defaults,
                                    generations=generations,
                                    display=self.display,
                                    model_roles=self._roles(),
                                    scorers={t: s for t, s in self.scorers.items() if t in _task_names(suite)},
                                    **self._log_labels(point, controls, trial),
                                )
                            suites_out[suite.name] = {
                                task: {**result, "log": _relative_to_root(result.get("log"), log_dir, store.root)}
                                for task, result in out.items()
                            }
                            self._index_cell(store, here, suite, suites_out[suite.name], static)
                        results[point.arm].append(self._record(point, trial, suites_out, static))
        finally:
            bar.close()
            factory.release()
            self._release_roles()
        self._results = results
        return results

    def _roles(self) -> dict[str, Any] | None:
        """The model roles for a cell: callables built once (the first time a cell needs them)."""
        if not self.model_roles:
            return None
        if self._built_roles is None:
            self._built_roles = {
                role: value() if callable(value) else value for role, value in self.model_roles.items()
            }
        return self._built_roles

    def _release_roles(self) -> None:
        if self._built_roles is None:
            return
        self._built_roles = None
        for value in self.model_roles.values():
            release = getattr(value, "release", None) if callable(value) else None
            if callable(release):
                release()

    def _scoring_identity(self) -> dict[str, Any]:
        """What the extra scoring adds to a cell's key: each role's model name and each task's extra scorers."""
        from inspect_ai.util import registry_info

        identity: dict[str, Any] = {}
        if self.model_roles:
            identity["model_roles"] = {role: _role_name(value) for role, value in self.model_roles.items()}
        if self.scorers:
            identity["scorers"] = {
                task: [registry_info(scorer).name.split("/")[-1] for scorer in found]
                for task, found in self.scorers.items()
            }
        return identity

    def _log_labels(self, point: Any, controls: Sequence[Any], trial: int) -> dict[str, Any]:
        """`tags` and `metadata` of a cell's Inspect logs: arm, config_id, controls, trial, base model, extras."""
        metadata = {
            "arm": point.arm,
            "config_id": point.config_id,
            "controls": canonical_value(config_descriptor_from_controls(controls)),
            "trial_id": trial,
            "base_model": self.base_model_name_or_path,
            **self.log_metadata,
        }
        return {"tags": [point.arm, point.config_id], "metadata": metadata}

    def _trial_seed(self, config_id: str, trial: int) -> int | None:
        return derive_trial_seed(self.seed, config_id, trial) if self.seed is not None else None

    def _record(
        self, point: Any, trial: int, suites_out: dict[str, Any], static: Mapping[str, Any], *, reused: bool = False
    ) -> dict[str, Any]:
        return {
            "config_id": point.config_id,
            "trial_id": trial,
            "seed": self.seed,
            "trial_seed": self._trial_seed(point.config_id, trial),
            "params": {spec: dict(kwargs) for spec, kwargs in point.params.items()},
            "suites": suites_out,
            "provenance": {**static, "recorded_utc": datetime.now(UTC).isoformat(), "reused": reused},
        }

    def setting(self, suite: InspectSuite) -> dict[str, Any]:
        """What makes `suite`'s evaluations comparable (`store.comparable.evaluation_setting`): the source, the
        backend's generation options, the provider options, the generation settings, the suite and extra scoring."""
        return evaluation_setting(
            self._generation_setting(),
            suite=suite.identity(self.task_arg_digests),
            scoring=self._scoring_identity(),
        )

    def _generation_setting(self) -> dict[str, Any]:
        return generation_setting(
            source=self.source,
            backend=BackendSpec.coerce(self.backend),
            provider=self.provider_options,
            generate_defaults=self.generate_defaults,
        )

    def _generations(self, store: SaveDir, config_id: str, trial: int) -> GenerationStore | None:
        """Where a configuration's trial keeps its generations (None without a save_dir, or a setting with no
        content form): every suite of the trial, and every later run into the save_dir, reads them."""
        if self.save_dir is None:
            return None
        try:
            setting = self._generation_setting()
        except TypeError:
            return None
        scope = generation_scope(
            setting, config_id=config_id, trial_id=trial, trial_seed=self._trial_seed(config_id, trial)
        )
        return store.generations(scope)

    def protocol(self, suite: InspectSuite, backend_identity: Any = None) -> dict[str, Any]:
        """`suite`'s protocol in a save_dir (`store.comparable.protocol`): its setting and the launch seed, plus the
        loaded backend's identity when given."""
        return protocol(self.setting(suite), seed=self.seed, backend_identity=backend_identity)

    def _cell_key(self, config_id: str, trial: int, suite: InspectSuite) -> str | None:
        """The cell's key, or None when its setting has no content form (e.g. a suite of `Task` objects): such a
        cell is never reused on a guess."""
        try:
            setting = self.setting(suite)
        except TypeError:
            return None
        return cell_key(setting, self._trial_seed(config_id, trial))

    def _index_cell(
        self, store: SaveDir, cell: Cell, suite: InspectSuite, tasks: Mapping[str, Any], static: Any
    ) -> None:
        key = self._cell_key(cell.config_id, cell.trial_id, suite)
        if key is None or self.save_dir is None or not tasks or any(t.get("failed") for t in tasks.values()):
            return  # a cell with failed samples stays unindexed: a re-run retries them (Inspect reuses the rest)
        if not all(_log_is_complete(t.get("log"), store.root) for t in tasks.values()):
            return  # e.g. invalidated samples: only a complete log makes a complete cell
        store.write_index(cell, key=key, tasks=tasks, static=static)  # a concurrent reader sees old or new

    def _reused_records(self, point: Any, store: SaveDir) -> list[dict[str, Any]] | None:
        """The records of a configuration whose every cell is indexed under the current key, with its logs complete
        (readable, not invalidated: `log_complete`), else None."""
        if self.save_dir is None:
            return None
        records = []
        for trial in range(self.num_trials):
            suites_out: dict[str, Any] = {}
            static: Any = None
            for suite in self.suites:
                key = self._cell_key(point.config_id, trial, suite)
                index = store.read_index(Cell(point.config_id, trial, suite.name))
                if index is None:
                    return None
                logs = [t.get("log") for t in index.get("tasks", {}).values()]
                if (
                    key is None
                    or index.get("key") != key
                    or not all(log and (store.root / log).exists() for log in logs)
                ):
                    return None
                if not all(_log_is_complete(log, store.root) for log in logs):
                    return None
                suites_out[suite.name] = index["tasks"]
                static = static or index.get("static") or {}
            records.append(self._record(point, trial, suites_out, static, reused=True))
        return records

    def _warn_protocol(self, active: Sequence[Any]) -> None:
        if self.seed is not None:
            keys = set(self.generate_defaults)
            for suite in self.suites:
                keys |= set(suite.generate_overrides)
            if "temperature" not in keys:
                warnings.warn(
                    f"seed={self.seed} is set but no temperature is: the seed only matters when sampling. Set "
                    "generate_defaults={'temperature': 0} for greedy decoding, or a temperature > 0 to sample.",
                    UserWarning,
                    stacklevel=3,
                )
        static = getattr(self.provider_options, "runtime_kwargs", None) or {}
        declared: set[str] = set()
        for report in active:
            declared |= set(report.runtime_kwargs)
        inert = sorted(set(static) - declared)
        if inert and active:
            warnings.warn(
                f"Static runtime kwarg(s) {inert} in provider_options.runtime_kwargs are declared by no control of "
                "any configuration, so they are inert on every arm. Check the names against the controls' "
                "RUNTIME_KWARGS_SCHEMA.",
                UserWarning,
                stacklevel=3,
            )

    def _static_provenance(self, pipeline: Any, factory: PipelineFactory, controls: Sequence[Any]) -> dict[str, Any]:
        tokenizer = getattr(pipeline, "tokenizer", None)
        model = getattr(pipeline, "model", None)
        return {
            "toolkit_version": _version("steer_hydra"),
            "inspect_ai_version": _version("inspect-ai") or _version("inspect_ai"),
            "inspect_evals_version": _version("inspect-evals") or _version("inspect_evals"),
            "torch_version": _version("torch"),
            "transformers_version": _version("transformers"),
            "backend": factory.backend_kind,
            "backend_identity": pipeline.backend_identity() if hasattr(pipeline, "backend_identity") else None,
            "base_model": self.base_model_name_or_path,
            "prompt_path": ("messages" if has_chat_template(tokenizer) else "text") if tokenizer is not None else None,
            "shared_base_fingerprint": factory.shared_base_fingerprint if factory.uses_shared_base(controls) else None,
            "model_fingerprint": model_fingerprint(model) if model is not None else None,
            "model_residency": factory.residency if factory.uses_shared_base(controls) else pipeline.residency,
            **_control_provenance(pipeline, controls, self.provider_options),
        }

    # ------------------------------------------------------------------------------------------ frames
    def _require_results(self) -> dict[str, list[dict[str, Any]]]:
        if self._results is None:
            raise RuntimeError("No results yet: call run() first (a failed run leaves no results).")
        return self._results

    def results(self) -> pd.DataFrame:
        """One row per (arm, trial, suite, task, metric key); see `frames.results_frame`."""
        return results_frame(self._require_results())

    def runs_frame(
        self,
        metrics: Sequence[str] | str,
        *,
        params: Mapping[str, tuple[str, str]] | None = None,
        suite: str | None = None,
        task: str | None = None,
    ) -> pd.DataFrame:
        """`frames.runs_frame` of this run, plus `{column: (spec, arg)}` parameter columns."""
        frame = runs_frame(self.results(), metrics, suite=suite, task=task)
        return attach_params(frame, self._params_by_config, params)

    def samples_frame(
        self,
        scores: Sequence[str] | str | None,
        *,
        metadata_keys: Sequence[str] = (),
        params: Mapping[str, tuple[str, str]] | None = None,
        suite: str | None = None,
        task: str | None = None,
        include_text: bool = False,
    ) -> pd.DataFrame:
        """`logs.samples_frame` of this run's cells (logs read from `save_dir`, metrics or not), plus parameter
        columns; `scores=None` takes every scorer in the logs."""
        frame = samples_frame(
            cells_frame(self._require_results()),
            self._log_root,
            scores=scores,
            metadata_keys=metadata_keys,
            suite=suite,
            task=task,
            include_text=include_text,
        )
        return attach_params(frame, self._params_by_config, params)

    def paired_deltas(
        self,
        scores: Sequence[str] | str,
        *,
        suite: str | None = None,
        task: str | None = None,
        baseline: str = "baseline",
        **kwargs: Any,
    ) -> pd.DataFrame:
        """`stats.paired_deltas` of one (suite, task) of this run against `baseline` (an arm or a config_id)."""
        samples = self.samples_frame(scores, suite=suite, task=task)
        return paired_deltas(samples, scores, baseline=baseline, **kwargs)


def _role_name(value: Any) -> str:
    """A model role's model as named in a cell key: the string, the `Model`'s name, or a builder's `name`."""
    if isinstance(value, str):
        return value
    name = getattr(value, "name", None)
    return str(name) if callable(value) and name is not None else str(value)


def _task_names(suite: InspectSuite) -> set[str]:
    return {task_name(task) for task in suite.tasks}


def _control_provenance(pipeline: Any, controls: Sequence[Any], options: Any) -> dict[str, Any]:
    """What the arm's controls mean for the provider: batch ceiling, declared and inert static kwargs, vectors."""
    if options is None:
        from steer_hydra.evaluation.options import ProviderOptions  # the suite runs Inspect anyway

        options = ProviderOptions()
    declared = declared_scopes(controls)
    static = options.runtime_kwargs or {}
    return {
        "batch_ceiling": options.batch_ceiling(pipeline),
        "batching": options.batching_in_force(pipeline),
        "declared_runtime_kwargs": declared,
        "inert_static_runtime_kwargs": sorted(set(static) - set(declared)),
        "steering_vector_hashes": {
            f"{type(c).__name__}[{i}]": c.vector_hash for i, c in enumerate(controls) if c.enabled and c.vector_hash
        },
        # what controls chose or built at steer() (an optimized instruction, a trained adapter's cache entry)
        "controls_built": {
            f"{type(c).__name__}[{i}]": built for i, c in enumerate(controls) if c.enabled and (built := c.provenance())
        },
    }


@contextlib.contextmanager
def _root_log_level_kept() -> Iterator[None]:
    """Undo Inspect's one-time `getLogger().setLevel(WARNING)`, so the caller's INFO lines (one per cell) survive."""
    root = logging.getLogger()
    level = root.level
    try:
        yield
    finally:
        if root.level != level:
            root.setLevel(level)


def _log_cell_wait(lock: Path) -> None:
    """Say that this job waits for another job evaluating the same cell (it holds the cell's lock)."""
    logger.info("Waiting for another job evaluating this cell (it holds %s); then resuming it from its logs.", lock)


def model_label(controls: Sequence[Any], config_id: str) -> str:
    """The model name in Inspect logs (`steer_hydra/<label>`): the enabled controls' class names and the
    config_id's first 6 characters (`pasta@ede177`), `baseline` for none.

    It is a function of the config_id alone (the controls' classes are part of its digest), never of the arm's
    display name: Inspect's task identity includes the model name, so a log directory (one per config_id) must
    always see the same name to resume.
    """
    names = [type(c).__name__.lower() for c in controls if getattr(c, "enabled", True)]
    return f"{'+'.join(names)}@{config_id[:6]}" if names else config_id


def _logged_model_name(log_dir: Path) -> str | None:
    """The model name (after `steer_hydra/`) of a log already in the cell's `log_dir`, None when there is none.

    Resuming needs the same task identity, which includes the model name: a cell begun under another naming
    (e.g. before `model_label`, when the name was the config_id) keeps the name it started with.
    """
    if not log_dir.is_dir() or not any(log_dir.rglob("*.eval")):
        return None
    for _, header in readable_logs(log_dir, move=True):  # under the cell lock: an unreadable log is moved aside
        model = str(header.eval.model)
        return model.split("/", 1)[1] if "/" in model else model
    return None


def _log_is_complete(log: str | None, root: Path) -> bool:
    """Whether a cell's log (a location relative to `root`) is readable and complete (`logs.log_complete`)."""
    header = read_log_header(resolve_log_path(log, root)) if log else None
    return header is not None and log_complete(header)


def _relative_to_root(log: str | None, log_dir: Path, root: Path) -> str | None:
    """A log location relative to the cell's `log_dir` rewritten relative to `save_dir` (others unchanged)."""
    if not log or "://" in log or Path(log).is_absolute():
        return log
    try:
        return (log_dir / log).relative_to(root).as_posix()
    except ValueError:
        return str(log_dir / log)
