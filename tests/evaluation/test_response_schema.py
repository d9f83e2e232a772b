"""Inspect's `GenerateConfig.response_schema` through the provider: enforced by an enabled ConstrainedDecoding (a real
eval on the tiny model), refused or warned about without one (the unsupported-parameter policy)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import GenerateConfig, ResponseSchema
from inspect_ai.scorer import includes
from inspect_ai.util import JSONSchema

from steer_hydra.controls.output import ConstrainedDecoding
from steer_hydra.evaluation import ProviderOptions, as_inspect_model, runtime_kwargs_solver
from steer_hydra.evaluation.options import RESPONSE_SCHEMA_RUNTIME_KWARG
from steer_hydra.testing.evals import eval_one

pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

SCHEMA = JSONSchema(
    type="object",
    properties={"answer": JSONSchema(type="string", enum=["paris", "rome"]), "sure": JSONSchema(type="boolean")},
    required=["answer", "sure"],
    additionalProperties=False,
)
PROMPTS = ["capital of france?", "capital of italy?", "hello", "name a city", "a b c"]


def schema_task(metadata: list[dict] | None = None) -> Task:
    samples = [
        Sample(input=prompt, target="paris", metadata={"runtime_kwargs": (metadata or [{}] * len(PROMPTS))[i]})
        for i, prompt in enumerate(PROMPTS)
    ]
    return Task(
        dataset=MemoryDataset(samples),
        solver=[runtime_kwargs_solver()],
        scorer=includes(),
        config=GenerateConfig(response_schema=ResponseSchema(name="city", json_schema=SCHEMA)),
    )


def run(model, task, tmp_path, **kwargs):
    return eval_one(task, model, log_dir=tmp_path, max_tokens=32, **kwargs)


@pytest.mark.parametrize("temperature", [0, 1.2], ids=["greedy", "sampled"])
def test_an_enabled_constrained_decoding_enforces_the_response_schema(make_pipeline, tmp_path, temperature):
    pipeline = make_pipeline([ConstrainedDecoding(compact_json=True)])
    model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=4))
    log = run(model, schema_task(), tmp_path, temperature=temperature, seed=3)
    assert log.status == "success" and len(log.samples) == len(PROMPTS)
    expected = SCHEMA.model_dump(exclude_none=True)
    for sample in log.samples:
        jsonschema.validate(json.loads(sample.output.completion), expected)
        assert sample.output.stop_reason == "stop"  # the grammar ended it, not max_tokens
    assert model.api.inert_runtime_kwargs == frozenset()


def test_a_per_sample_constraint_wins_over_the_response_schema(make_pipeline, tmp_path):
    pipeline = make_pipeline([ConstrainedDecoding()])
    model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=4))
    metadata = [{"constrain_choices": ["A", "B"]}] * len(PROMPTS)
    log = run(model, schema_task(metadata), tmp_path, temperature=0)
    assert log.status == "success"
    assert {s.output.completion for s in log.samples} <= {"A", "B"}


def test_without_the_control_the_policy_applies(make_pipeline, tmp_path):
    pipeline = make_pipeline([])
    strict = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=4))
    log = run(strict, schema_task(), tmp_path / "raise", temperature=0)
    assert log.status == "error" and "response_schema" in log.error.message
    assert "+control@arm.controls.constrained=constrained_decoding" in log.error.message
    lenient = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=4, on_unsupported_param="warn"))
    with pytest.warns(UserWarning, match="response_schema"):
        log = run(lenient, schema_task(), tmp_path / "warn", temperature=0)
    assert log.status == "success"
    assert not all(_is_json(s.output.completion) for s in log.samples)  # nothing constrained them


def test_a_disabled_control_declares_nothing_so_the_policy_applies(make_pipeline):
    api = as_inspect_model(make_pipeline([ConstrainedDecoding(enabled=False)])).api
    config = GenerateConfig(response_schema=ResponseSchema(name="city", json_schema=SCHEMA))
    with pytest.raises(ValueError, match=r"GenerateConfig\.response_schema"):
        api._map_generate_config(config)
    enabled = as_inspect_model(make_pipeline([ConstrainedDecoding()])).api
    _, per_sample, _ = enabled._map_generate_config(config)
    assert per_sample == {RESPONSE_SCHEMA_RUNTIME_KWARG: SCHEMA.model_dump(exclude_none=True)}
    static = ProviderOptions(runtime_kwargs={"constrain_regex": "[a-z]+"})
    _, per_sample, _ = as_inspect_model(
        make_pipeline([ConstrainedDecoding()]), options=static
    ).api._map_generate_config(config)
    assert per_sample == {}  # a static constraint of the options wins too


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
