"""The config schema mirrors the library: same fields as the classes it configures, value sets from their constants."""

import dataclasses
import typing

from inspect_ai.util import DisplayType

from steer_hydra.app import schema
from steer_hydra.app.schema import MODEL_KEYS_OUTSIDE_PROTOCOL
from steer_hydra.core import ModelSource
from steer_hydra.core.backend import BACKENDS, canonical_kind
from steer_hydra.core.params import SEED_SCOPES
from steer_hydra.evaluation.options import BATCHING_MODES, SPLIT_MODES, UNSUPPORTED_POLICIES, ProviderOptions
from steer_hydra.evaluation.runner import ON_UNSUPPORTED
from steer_hydra.evaluation.suite import InspectSuite


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _values(enum_cls) -> set[str]:
    return {member.value for member in enum_cls}


def test_provider_and_suite_groups_have_the_fields_of_the_classes_they_build():
    assert _names(schema.ProviderConfig) == _names(ProviderOptions)
    assert _names(schema.SuiteConfig) == _names(InspectSuite)


def test_provider_group_defaults_are_the_library_defaults():
    library = ProviderOptions()
    for f in dataclasses.fields(schema.ProviderConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        default = default.value if hasattr(default, "value") else default
        default = tuple(default) if isinstance(default, list) else default
        assert default == getattr(library, f.name), f.name


def test_model_group_is_a_model_source_with_a_name():
    # tokenizer_name_or_path and device are Python-only (a job loads the tokenizer of its model and lets
    # device_map place it); adding them to the group would change every save_dir's recorded protocol. The group's
    # own keys (the name, the layer the concept controls default to) stay out of the protocol.
    extra = set(MODEL_KEYS_OUTSIDE_PROTOCOL)
    assert _names(schema.ModelConfig) - extra == _names(ModelSource) - {"tokenizer_name_or_path", "device"}


def test_value_sets_are_the_library_constants():
    assert _values(schema.Batching) == set(BATCHING_MODES)
    assert _values(schema.ReasoningSplit) == set(SPLIT_MODES)
    assert _values(schema.OnUnsupportedParam) == set(UNSUPPORTED_POLICIES)
    assert _values(schema.SeedScope) == set(SEED_SCOPES)
    assert _values(schema.OnUnsupported) == set(ON_UNSUPPORTED)
    assert _values(schema.Display) == set(typing.get_args(DisplayType))
    assert {canonical_kind(kind) for kind in _values(schema.BackendKind)} == set(BACKENDS)
