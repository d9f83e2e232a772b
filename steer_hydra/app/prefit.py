"""`FitAhead`: the Hydra callback that fits a run's or sweep's vectors (on one model load), trains its adapters and
chooses its optimized instructions before any engine starts.

With an engine backend (`backend=vllm`, or `vllm_serve` with `backend.options.launch=true`), a job whose control
fits a vector from hidden states (CAA with `data=`, ActAdd with a prompt pair) fits it on the Hugging Face model of
the checkpoint before its engine starts, and caches it (`backends.vllm.fit`); a trainer (SFT, DPO) trains its
adapter and a prompt optimizer chooses its instruction there the same way (`builds_ahead`). One job at a time,
that costs an engine restart per vector, adapter or instruction on `backend=vllm` and, on a launched server, a
Hugging Face model beside the server. This callback does that work first, in the launching process, before
`LaunchServer` starts a server (it is listed before it) and before any job: the jobs then find it all cached.

Which jobs: a study's `StudyPlan.fit_jobs` (every configuration dev can choose, per concept), a basic sweep's
jobs (`callbacks.expected_jobs`), or the single run. Each job's config is composed and its controls built as the
job builds them; the backend's `fit_ahead` fits what they need. It acts only when `fit_ahead` is true and the
run's backend fits vectors (`Backend.fits_vectors_with`). Nothing here can fail a sweep: a job config that does not
compose or build is left to its job (which reports it), and a failed fit or training is one warning, after which
each job fits or trains its own as before.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from steer_hydra.app.compose import compose_config, to_plain
from steer_hydra.core.identity import canonical_json

logger = logging.getLogger(__name__)

STUDY_SWEEPER = "hydra_plugins.steer_hydra_study.study_sweeper.StudySweeper"


def _backend(config: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The backend class and options of a run's or job's config."""
    from steer_hydra.core.backend import backend_class

    spec = to_plain(config.backend)
    return backend_class(str(spec["kind"])), dict(spec["options"] or {})


def fits_ahead(config: DictConfig) -> bool:
    """Whether `config` (a run's, or a sweep's as its command line sets it) asks to fit vectors ahead: `fit_ahead`
    is true and its backend fits vectors before its engine starts."""
    if not OmegaConf.select(config, "fit_ahead", default=True):
        return False
    try:
        backend, options = _backend(config)
    except (KeyError, ValueError, ImportError):  # an unknown backend: the job names it
        return False
    return backend.fits_vectors_with(options)


def planned_jobs(config: DictConfig) -> list[list[str]]:
    """The overrides of each job of the sweep `config` whose controls may fit something: a study's `fit_jobs`, or
    every job of a basic sweep; [] for a sweeper this cannot plan (its jobs fit their own)."""
    from steer_hydra.app.callbacks import expected_jobs
    from steer_hydra.app.study import StudyRefused, plan_study

    sweeper = OmegaConf.select(config, "hydra.sweeper") or {}
    target = sweeper.get("_target_")
    if target == STUDY_SWEEPER:
        spec = {key: value for key, value in sweeper.items() if key != "_target_"}
        concepts = logging.getLogger("steer_hydra.tasks.concepts")
        quiet, concepts.disabled = concepts.disabled, True  # the sweeper plans it next and warns of what it leaves out
        try:
            plan, passthrough = plan_study(spec, list(config.hydra.overrides.task), config)
        except StudyRefused:  # the sweeper refuses it next, with its message
            return []
        finally:
            concepts.disabled = quiet
        return [list(job.overrides) for job in plan.fit_jobs(passthrough)]
    if target and not str(target).endswith("BasicSweeper"):
        return []
    return [list(job) for job in dict.fromkeys(tuple(job) for job in expected_jobs(config))]


def fit_ahead_of(configs: Iterable[DictConfig]) -> list[Path]:
    """Fit the vectors (one model load per model source and backend among them), train the adapters and choose the
    instructions the jobs of `configs` would; returns what was written (nothing when everything was cached)."""
    from steer_hydra.app.plan import build_controls
    from steer_hydra.core.source import ModelSource

    groups: dict[str, tuple[Any, ModelSource, dict[str, Any], list[Any]]] = {}
    for config in configs:
        backend, options = _backend(config)
        if not backend.fits_vectors_with(options):
            continue
        try:
            controls = build_controls(config.arm.controls)
        except Exception as error:  # noqa: BLE001 - the job reports its own config error
            logger.debug("Fit ahead: a job's controls do not build (%s); the job reports it.", error)
            continue
        source = ModelSource.from_config(to_plain(config.model))
        key = canonical_json([dataclasses.asdict(source), backend.kind, options])  # not steering_layer: one load
        groups.setdefault(key, (backend, source, options, []))[3].extend(controls)
    written: list[Path] = []
    for backend, source, options, controls in groups.values():
        written += backend.fit_ahead(controls, source, options)
    return written


def _compose(jobs: list[list[str]]) -> Iterable[DictConfig]:
    for job in jobs:
        try:
            yield compose_config(job)
        except Exception as error:  # noqa: BLE001 - the job reports its own config error
            logger.debug("Fit ahead: %s does not compose (%s); the job reports it.", job, error)


class FitAhead(Callback):
    """Builds every vector, adapter and instruction the run's or sweep's jobs would, before any engine or job starts."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if fits_ahead(config):
            self._fit(lambda: [config])

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if fits_ahead(config):
            self._fit(lambda: _compose(planned_jobs(config)))

    @staticmethod
    def _fit(configs: Any) -> None:
        start = time.monotonic()
        try:
            written = fit_ahead_of(configs())
        except Exception as error:  # noqa: BLE001 - the jobs fit their own vectors, as without this callback
            logger.warning("Fitting ahead failed (%s); each job fits or trains its own as it starts.", error)
            return
        if written:
            kinds = Counter(path.parent.name for path in written)  # the cache folders: vectors, adapters, prompts
            made = ", ".join(f"{count} in {kind}/" for kind, count in kinds.items())
            logger.info("Built ahead of the jobs in %.1f s: %s", time.monotonic() - start, made)
