"""The steering core: pipeline, controls, generation params, outputs, capabilities, identity and seeds."""

from steer_hydra.core.backend import Backend, BackendSpec
from steer_hydra.core.capabilities import Capability, SupportFailure, SupportReport, UnsupportedPipelineError
from steer_hydra.core.controls import (
    BaseArgs,
    BaseControl,
    DecodingDriver,
    DriverResult,
    HookSet,
    InputControl,
    OutputControl,
    Reference,
    StateControl,
    StructuralControl,
    declared_scopes,
    merge_controls,
    runtime_kwargs_schema,
)
from steer_hydra.core.identity import canonical_value, config_digest, derive_item_seed, derive_trial_seed
from steer_hydra.core.output import FINISH_REASONS, Output, infer_finish_reasons, truncate_at_stop_strings
from steer_hydra.core.params import GenerationParams
from steer_hydra.core.pipeline import SteeringPipeline
from steer_hydra.core.source import ModelSource
from steer_hydra.core.specs import ControlSpec, Factory
from steer_hydra.core.sweeps import ConfigPoint, PipelineFactory, expand_configurations, preflight

__all__ = [
    "FINISH_REASONS",
    "Backend",
    "BackendSpec",
    "BaseArgs",
    "BaseControl",
    "Capability",
    "ConfigPoint",
    "ControlSpec",
    "DecodingDriver",
    "DriverResult",
    "Factory",
    "GenerationParams",
    "HookSet",
    "InputControl",
    "ModelSource",
    "Output",
    "OutputControl",
    "PipelineFactory",
    "Reference",
    "StateControl",
    "SteeringPipeline",
    "StructuralControl",
    "SupportFailure",
    "SupportReport",
    "UnsupportedPipelineError",
    "canonical_value",
    "config_digest",
    "declared_scopes",
    "derive_item_seed",
    "derive_trial_seed",
    "expand_configurations",
    "infer_finish_reasons",
    "merge_controls",
    "preflight",
    "runtime_kwargs_schema",
    "truncate_at_stop_strings",
]
