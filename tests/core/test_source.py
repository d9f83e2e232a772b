"""ModelSource: the one value that says where a pipeline's model comes from and how it loads."""

import dataclasses

import pytest

from steer_hydra.core import ModelSource, SteeringPipeline
from steer_hydra.models import TINY_REF


def test_coerce_accepts_a_reference_a_mapping_a_source_or_none():
    source = ModelSource(TINY_REF, hf_model_kwargs={"dtype": "float32"})
    assert ModelSource.coerce(source) is source
    assert ModelSource.coerce(TINY_REF) == ModelSource(model_name_or_path=TINY_REF)
    assert ModelSource.coerce(None).model_name_or_path is None
    with pytest.raises(TypeError, match="ModelSource"):
        ModelSource.coerce(3)


def test_from_config_reads_the_model_group_and_ignores_its_name():
    group = {"name": "tiny", "model_name_or_path": TINY_REF, "hf_model_kwargs": None, "device_map": None}
    source = ModelSource.from_config(group)
    assert source == ModelSource(TINY_REF, device_map=None)
    assert source.hf_model_kwargs == {} and source.trust_remote_code is False


def test_it_is_frozen_and_refuses_device_with_a_device_map():
    source = ModelSource(TINY_REF)
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.device = "cpu"
    with pytest.raises(ValueError, match="Fix: drop one"):
        ModelSource(TINY_REF, device="cpu", device_map="balanced")
    assert source.replace(device="cpu", device_map=None).device == "cpu"


def test_the_pipeline_keeps_the_source_it_was_given():
    source = ModelSource(TINY_REF, device="cpu")
    assert SteeringPipeline(source).source is source
    assert SteeringPipeline(TINY_REF).source == ModelSource(TINY_REF)
