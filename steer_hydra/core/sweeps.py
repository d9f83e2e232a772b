"""Sweeps: expand `{name: [] | [controls] | [ControlSpec, ...]}` into configuration points, preflight them, and
build one steered pipeline per configuration (`PipelineFactory`).

Invariants:
- expansion and preflight are pure: no model is loaded and no control is steered;
- `config_id` is `"baseline"` for the empty arm, else the 12-hex digest of the point's canonical descriptor, so
  the same configuration gets the same id (and log directory) in every run;
- `PipelineFactory.steered()` holds at most one configuration's pipeline at a time and always releases it; a
  configuration that loads its own model (structural, or another backend) first drops the shared base, so at most
  one model is resident;
  Hugging Face configurations without an enabled structural control that replaces the model (one that restores the
  base it edits, a LoRA adapter, runs on it) share one preloaded base model, and a tripwire (model fingerprint,
  sampled weights, registered hooks, attention implementation, tokenizer) drops that base when a configuration
  left it changed, so the next configuration never sees another's edits;
- with residency on (`core.resident`), the shared base outlives the factory: `release()` hands an unchanged base to
  the process's resident slot, and the next factory of the same model (the next job of a sweep in this process)
  takes it instead of loading; `residency` says which happened ("resident" or "loaded").
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steer_hydra.core import resident
from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.controls import BaseControl, StructuralControl, declared_scopes
from steer_hydra.core.identity import BASELINE_CONFIG_ID, config_digest, model_fingerprint
from steer_hydra.core.pipeline import SteeringPipeline
from steer_hydra.core.source import ModelSource
from steer_hydra.core.specs import ControlSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConfigPoint:
    """One configuration of a sweep: a pipeline name, its id, and a factory of its controls.

    `params` is `{}` for the baseline and fixed controls, else `{spec_name: {arg: value}}` (fixed plain params
    plus the values chosen for this point). `controls_factory()` returns the fixed instances themselves, or
    fresh instances built from the specs on every call.
    """

    arm: str
    config_id: str
    descriptor: Any
    specs: tuple[ControlSpec, ...]
    params: Mapping[str, Mapping[str, Any]]
    controls_factory: Callable[[], list[BaseControl]] = field(compare=False, repr=False)

    @property
    def is_baseline(self) -> bool:
        return self.config_id == BASELINE_CONFIG_ID


def config_descriptor_from_controls(controls: Sequence[BaseControl]) -> list[dict[str, Any]]:
    """The identity of a fixed-controls configuration: each control's class, canonical args and `enabled`."""
    return [control.descriptor() for control in controls]


def config_descriptor_from_specs(specs: Sequence[ControlSpec], chosen: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The identity of one spec combination: each spec's class, name, fixed params and chosen values."""
    return [spec.descriptor(values) for spec, values in zip(specs, chosen, strict=True)]


def expand_configurations(
    pipelines: Mapping[str, Sequence[BaseControl | ControlSpec]],
    base_model_name_or_path: str | None = None,
) -> list[ConfigPoint]:
    """Turn `{name: [] | [controls] | [ControlSpec, ...]}` into configuration points, in insertion order.

    Spec pipelines take the cartesian product of each spec's points; factories see the context
    `arm`, `base_model_name_or_path`, `combo_id` (and `search_params`).
    """
    if not isinstance(pipelines, Mapping):
        raise TypeError(
            "pipelines must be a dict {name: [controls] or [ControlSpec, ...] or []}; "
            f"got {type(pipelines).__name__}."
        )
    points: list[ConfigPoint] = []
    for name, items in pipelines.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"Pipeline names must be non-empty strings; got {name!r}.")
        if isinstance(items, (BaseControl, ControlSpec)) or not isinstance(items, (list, tuple)):
            raise TypeError(
                f"pipelines[{name!r}] must be a list ([] for the baseline, controls, or ControlSpecs); got {items!r}."
            )
        items = list(items)
        specs = [i for i in items if isinstance(i, ControlSpec)]
        controls = [i for i in items if isinstance(i, BaseControl)]
        others = [i for i in items if not isinstance(i, (ControlSpec, BaseControl))]
        if others:
            raise TypeError(f"pipelines[{name!r}] holds {others[0]!r}; items must be controls or ControlSpecs.")
        if specs and controls:
            raise ValueError(
                f"pipelines[{name!r}] mixes control instances and ControlSpecs; wrap the fixed controls in "
                "ControlSpec(cls, params={...}) (no vars) so the whole pipeline is built per point."
            )
        if not items:
            points.append(ConfigPoint(name, BASELINE_CONFIG_ID, [], (), {}, lambda: []))
        elif controls:
            points.append(_fixed_point(name, controls))
        else:
            points.extend(_spec_points(name, specs, base_model_name_or_path))
    _warn_shared_ids(points)
    return points


def _fixed_point(name: str, controls: list[BaseControl]) -> ConfigPoint:
    descriptor = config_descriptor_from_controls(controls)
    return ConfigPoint(name, config_digest(descriptor), descriptor, (), {}, lambda: list(controls))


def _spec_points(name: str, specs: list[ControlSpec], base: str | None) -> list[ConfigPoint]:
    names = [spec.name for spec in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"pipelines[{name!r}] has several ControlSpecs named {duplicates}; give each a distinct name=."
        )
    context = {"arm": name, "base_model_name_or_path": base}
    grids = [list(spec.iter_points(context)) for spec in specs]
    points = []
    for combo_id, chosen in enumerate(itertools.product(*grids)):
        point_context = {**context, "combo_id": combo_id}
        descriptor = config_descriptor_from_specs(specs, chosen)
        params = {spec.name: spec.recorded_params(values) for spec, values in zip(specs, chosen, strict=True)}

        def build(chosen: tuple = chosen, point_context: dict = point_context) -> list[BaseControl]:
            return [spec.build(values, point_context) for spec, values in zip(specs, chosen, strict=True)]

        points.append(ConfigPoint(name, config_digest(descriptor), descriptor, tuple(specs), params, build))
    return points


def _warn_shared_ids(points: list[ConfigPoint]) -> None:
    seen: dict[str, str] = {}
    for point in points:
        other = seen.setdefault(point.config_id, point.arm)
        if other != point.arm:
            logger.warning(
                "Pipelines %r and %r are the same configuration (config_id %s); they share one set of logs.",
                other,
                point.arm,
                point.config_id,
            )


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """The verdict on one configuration point before any model loads."""

    point: ConfigPoint
    failures: tuple[str, ...]
    runtime_kwargs: frozenset[str] = frozenset()

    @property
    def ok(self) -> bool:
        return not self.failures


def preflight(
    points: Sequence[ConfigPoint],
    *,
    source: ModelSource | str | None,
    backend: BackendSpec | str | None = None,
) -> list[PreflightReport]:
    """Run `check()` on a probe pipeline (no I/O) for every point; one report per point, in order."""
    reports = []
    for point in points:
        try:
            controls = point.controls_factory()
            probe = SteeringPipeline(source, controls=controls, backend=backend)
            failures = tuple(probe.check().messages())
            declared = frozenset(declared_scopes(controls))
        except Exception as error:  # a bad spec point must not hide the other points' verdicts
            failures = (f"{point.arm}: cannot build the configuration: {type(error).__name__}: {error}",)
            declared = frozenset()
        reports.append(PreflightReport(point, failures, declared))
    return reports


def _hook_count(model: torch.nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + len(m._backward_pre_hooks)
        for m in model.modules()
    )


def _weights_probe(model: torch.nn.Module, per_tensor: int = 256) -> str:
    """A cheap digest of every parameter: a strided sample of `per_tensor` values each (plus shapes).

    `model_fingerprint` hashes all weights only for small models; this catches in-place edits of large ones
    (merged adapters, added biases) without reading every weight. Offloaded (meta) tensors are skipped.
    """
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}".encode())
            if param.device.type == "meta" or param.numel() == 0:
                continue
            flat = param.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // per_tensor)][:per_tensor]
            digest.update(sample.float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _tokenizer_state(tokenizer: Any) -> str:
    payload = f"{len(tokenizer) if tokenizer is not None else None}|{getattr(tokenizer, 'chat_template', None)}"
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class PipelineFactory:
    """Builds, steers and releases one pipeline per configuration, sharing a preloaded base where it can.

    Args:
        source: the model every configuration starts from (a `ModelSource` or a model reference).
        backend: a `BackendSpec`, kind string or None (Hugging Face).
        share_base: let Hugging Face configurations without a structural control reuse one loaded base model.
    """

    def __init__(
        self,
        source: ModelSource | str | None,
        *,
        backend: BackendSpec | str | None = None,
        share_base: bool = True,
    ) -> None:
        self.source = ModelSource.coerce(source)
        self.backend = BackendSpec.coerce(backend)
        self.share_base = share_base
        self._base_model: torch.nn.Module | None = None
        self._base_tokenizer: Any = None
        self._base_state: tuple | None = None
        self._shared_base_fingerprint: str | None = None
        self.residency: str | None = None  # "resident" (taken from the process) or "loaded", once a base is held

    @property
    def backend_kind(self) -> str:
        return self.backend.kind

    @property
    def shared_base_fingerprint(self) -> str | None:
        """Fingerprint of the shared base model (None until one is loaded, or without sharing)."""
        return self._shared_base_fingerprint

    def uses_shared_base(self, controls: Sequence[BaseControl]) -> bool:
        """Whether a configuration runs on the shared base (Hugging Face, no enabled structural control)."""
        return (
            self.share_base
            and self.backend.kind == "huggingface"
            and not any(isinstance(c, StructuralControl) and c.enabled and not c.restores_base for c in controls)
        )

    def build(self, controls: Sequence[BaseControl]) -> SteeringPipeline:
        """An unsteered pipeline for `controls` (on the shared base when it qualifies)."""
        if self.uses_shared_base(controls):
            self._ensure_base()
            return SteeringPipeline(
                self.source, controls, self.backend, model=self._base_model, tokenizer=self._base_tokenizer
            )
        self.release()  # a configuration with its own model: never hold two models at once
        if not self.backend.keeps_resident():  # one that does frees any other base itself, and reuses its own
            resident.drop()
        return SteeringPipeline(self.source, controls, self.backend)

    @property
    def _residency_key(self) -> str:
        return resident.residency_key(self.source.identity(), self.backend.kind, self.backend.protocol_options())

    def _ensure_base(self) -> None:
        if self._base_model is not None:
            return
        held = resident.take(self._residency_key) if resident.is_enabled() else None
        if held is not None:
            (self._base_model, self._base_tokenizer), self.residency = held, "resident"
        else:
            loader = SteeringPipeline(self.source, backend=self.backend).steer()
            self._base_model, self._base_tokenizer = loader.model, loader.tokenizer
            loader.release()  # drops the loader's references; ours keep the model alive
            self.residency = "loaded"
        self._base_state = self._state()
        self._shared_base_fingerprint = self._base_state[0]

    def _state(self) -> tuple:
        model = self._base_model
        return (
            model_fingerprint(model),
            _weights_probe(model),
            _hook_count(model),
            getattr(getattr(model, "config", None), "_attn_implementation", None),
            _tokenizer_state(self._base_tokenizer),
        )

    def _check_tripwire(self, controls: Sequence[BaseControl]) -> None:
        if self._base_model is None or self._state() == self._base_state:
            return
        names = ", ".join(type(c).__name__ for c in controls) or "no controls"
        logger.warning(
            "The shared base model changed while a configuration (%s) ran and was not restored by cleanup(); "
            "discarding it so the next configuration loads a fresh base. Fix the control's cleanup() to undo "
            "what steer() changed.",
            names,
        )
        self._drop_base()

    @contextlib.contextmanager
    def steered(self, controls: Sequence[BaseControl]) -> Iterator[SteeringPipeline]:
        """Build and steer a pipeline for `controls`; on exit run each cleanup(), release it and free memory."""
        controls = list(controls)
        shared = self.uses_shared_base(controls)
        pipeline = self.build(controls)
        try:
            try:
                pipeline.steer()
            except BaseException:
                for control in controls:
                    if control.enabled:
                        try:
                            control.cleanup()
                        except Exception:
                            logger.exception("cleanup() of %s failed after a failed steer()", type(control).__name__)
                raise
            yield pipeline
        finally:
            try:
                pipeline.release()
            finally:
                if shared:
                    self._check_tripwire(controls)
                del pipeline
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()  # the backend's release() already collected garbage

    def _drop_base(self) -> None:
        self._base_model = None
        self._base_tokenizer = None
        self._base_state = None
        self._shared_base_fingerprint = None

    def release(self) -> None:
        """Free the shared base model and forget its fingerprint (safe to call twice); with residency on, an
        unchanged base stays resident in the process instead (`core.resident`)."""
        held = self._base_model is not None
        if held and resident.is_enabled():  # unchanged: a configuration that changed it was dropped by the tripwire
            label = f"base model {self.source.model_name_or_path}"
            resident.keep(self._residency_key, (self._base_model, self._base_tokenizer), label=label)
            self._drop_base()
            return
        self._drop_base()
        if held:
            _free_memory()


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
