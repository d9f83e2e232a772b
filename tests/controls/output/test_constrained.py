"""ConstrainedDecoding on Hugging Face: outputs satisfy regexes, choice lists and JSON schemas (greedy and sampled),
per-row constraints in one batch, eos only where the grammar accepts, batching invariance, the engine request fields,
and the Args / runtime-kwarg refusals."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from steer_hydra.backends.vllm.engine import split_request_fields
from steer_hydra.controls.output import ConstrainedDecoding, GrammarLogitsProcessor
from steer_hydra.controls.output import constrained as constrained_module
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.controls import RequestFields
from steer_hydra.evaluation.options import CONSTRAINT_RUNTIME_KWARGS, RESPONSE_SCHEMA_RUNTIME_KWARG
from steer_hydra.models import TINY_REF, build_tiny_model

PROMPTS = ["hello there cat and dog", "a", "what is the capital of france"]
REGEX = r"(cat|dog)-[0-9]{1,3}"
CHOICES = ["yes", "no", 'say "hi"\\', "naïve"]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
DRAWS = [{"do_sample": False}] + [{"do_sample": True, "temperature": 1.5, "seed": s} for s in range(3)]


def _ids(output, pad: int) -> list[int]:
    row = output.output_ids[0].tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def _texts(pipeline, prompts, runtime_kwargs=None, max_new_tokens=12, **draw):
    outputs = pipeline.generate(
        text=prompts, runtime_kwargs=runtime_kwargs, return_output=True, max_new_tokens=max_new_tokens, **draw
    )
    return [o.decode(pipeline.tokenizer)[0] for o in outputs], outputs


@pytest.mark.parametrize("draw", DRAWS, ids=["greedy", "sampled0", "sampled1", "sampled2"])
def test_outputs_match_the_regex_and_end_at_eos(make_pipeline, draw):
    pipeline = make_pipeline([ConstrainedDecoding(regex=REGEX)], chat=False)
    texts, outputs = _texts(pipeline, PROMPTS, **draw)
    assert all(re.fullmatch(REGEX, t) for t in texts), texts
    assert [o.finish_reasons for o in outputs] == [["eos"]] * len(PROMPTS)  # ended by the grammar, not the budget
    plain = make_pipeline([], chat=False).generate(text=PROMPTS, max_new_tokens=12, **draw)
    assert not any(re.fullmatch(REGEX, t) for t in plain)  # the constraint is what makes them match


@pytest.mark.parametrize("draw", DRAWS[:2], ids=["greedy", "sampled"])
def test_outputs_are_one_of_the_choices(make_pipeline, draw):
    pipeline = make_pipeline([ConstrainedDecoding(choices=CHOICES)], chat=False)
    texts, _ = _texts(pipeline, PROMPTS, **draw)
    assert all(t in CHOICES for t in texts), texts
    (output,) = [pipeline.generate(text=PROMPTS[0], return_output=True, max_new_tokens=12, do_sample=True,
                                   temperature=2.0, seed=4, n=6)]  # fmt: skip
    many = output.decode(pipeline.tokenizer)
    assert all(t in CHOICES for t in many) and len(set(many)) > 1  # every candidate of n, and not all the same


def test_a_complete_output_ends_even_where_min_new_tokens_bans_eos(make_pipeline):
    pipeline = make_pipeline([ConstrainedDecoding(choices=["yes", "no"])], chat=False)
    for draw in DRAWS[:2]:
        texts, _ = _texts(pipeline, PROMPTS, min_new_tokens=6, **draw)
        assert all(t in ("yes", "no") for t in texts), texts


@pytest.mark.parametrize("draw", DRAWS[:3], ids=["greedy", "sampled0", "sampled1"])
def test_outputs_parse_as_json_valid_for_the_schema(make_pipeline, draw):
    pipeline = make_pipeline([ConstrainedDecoding(json_schema=SCHEMA, compact_json=True)], chat=False)
    texts, outputs = _texts(pipeline, PROMPTS, max_new_tokens=24, **draw)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
        assert text == json.dumps(json.loads(text), separators=(",", ":"))  # compact: no whitespace at all
    assert [o.finish_reasons for o in outputs] == [["eos"]] * len(PROMPTS)


def test_per_row_constraints_in_one_batch_and_a_free_row_decodes_freely(make_pipeline):
    pipeline = make_pipeline([ConstrainedDecoding(compact_json=True)], chat=False)
    prompts = [*PROMPTS, "one more row"]
    kwargs = {
        "constrain_regex": [REGEX, None, None, None],
        "constrain_choices": [None, ["left", "right"], None, None],
        "constrain_json_schema": [None, None, json.dumps(SCHEMA), None],
    }
    texts, batched = _texts(pipeline, prompts, kwargs, max_new_tokens=24)
    assert re.fullmatch(REGEX, texts[0]) and texts[1] in ("left", "right")
    jsonschema.validate(json.loads(texts[2]), SCHEMA)
    free = make_pipeline([], chat=False).generate(text=prompts, max_new_tokens=24)
    assert texts[3] == free[3] and texts[:3] != free[:3]  # the row without a constraint is untouched
    alone = [_texts(pipeline, [p], {k: v[i] for k, v in kwargs.items()}, max_new_tokens=24)[1][0] for i, p in
             enumerate(prompts)]  # fmt: skip
    pad = pipeline.tokenizer.pad_token_id
    assert [_ids(o, pad) for o in alone] == [_ids(o, pad) for o in batched]  # a row alone = the row in a batch


def test_a_row_alone_equals_the_same_row_in_a_left_padded_batch(make_pipeline):
    pipeline = make_pipeline([ConstrainedDecoding(choices=CHOICES)])
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    pad = pipeline.tokenizer.pad_token_id
    batched = pipeline.generate(messages=chats, return_output=True, max_new_tokens=12)
    assert len({len(pipeline.tokenizer.apply_chat_template(c)["input_ids"]) for c in chats}) > 1  # ragged prompts
    for chat, in_batch in zip(chats, batched, strict=True):
        assert _ids(pipeline.generate(messages=chat, return_output=True, max_new_tokens=12), pad) == _ids(in_batch, pad)
    assert pipeline.supports_batching is True and ConstrainedDecoding.supports_refill is False
    assert pipeline.refill_blockers() == ["ConstrainedDecoding runs live logits processors or stopping criteria"]


def test_runtime_constraint_replaces_the_fixed_one_and_each_distinct_one_compiles_once(make_pipeline):
    control = ConstrainedDecoding(regex="[0-9]+")
    pipeline = make_pipeline([control], chat=False)
    texts, _ = _texts(pipeline, PROMPTS[:2], {"constrain_choices": [["up", "down"], None]})
    assert texts[0] in ("up", "down") and re.fullmatch("[0-9]+", texts[1])
    _texts(pipeline, PROMPTS, {"constrain_choices": ["up", "down"]})  # one list for every row
    assert control.compiled_constraints == 2  # the fixed regex and the one choice list


def test_eos_is_allowed_exactly_when_the_grammar_accepts():
    model, tokenizer = build_tiny_model()
    control = ConstrainedDecoding(regex="[0-9]{2}")
    control.steer(model, tokenizer=tokenizer, backend="huggingface")
    prompt = tokenizer(["a b c"], return_tensors="pt")["input_ids"]
    (processor,) = control.get_logits_processors(prompt, {})
    assert isinstance(processor, GrammarLogitsProcessor)
    eos, digit = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("7")
    vocab = model.config.vocab_size
    ids = prompt
    for step in range(3):
        scores = processor(ids, torch.zeros(1, vocab))[0]
        allowed = torch.isfinite(scores)
        assert bool(allowed[eos]) == (step == 2)  # only after two digits
        assert bool(allowed[digit]) == (step < 2)
        if step == 2:
            assert allowed.sum() == 1  # nothing but eos can follow a complete match
        ids = torch.cat([ids, torch.tensor([[digit]])], dim=1)
    control.cleanup()


def test_engine_backends_get_per_row_structured_outputs_instead_of_a_processor():
    control = ConstrainedDecoding(regex="[a-z]+")
    control.steer(None, tokenizer=None, backend="vllm")
    ids = torch.ones(3, 4, dtype=torch.long)
    kwargs = {"constrain_choices": [None, ["A", "B"], None], "constrain_json_schema": [None, None, SCHEMA]}
    (fields,) = control.get_logits_processors(ids, kwargs)
    assert fields == RequestFields(
        (
            {"structured_outputs": {"regex": "[a-z]+"}},
            {"structured_outputs": {"choice": ["A", "B"]}},
            {"structured_outputs": {"json": SCHEMA}},
        )
    )
    free = ConstrainedDecoding()
    free.steer(None, backend="vllm_serve")
    assert free.get_logits_processors(ids, {}) == []  # nothing to constrain: nothing to send
    (mixed,) = free.get_logits_processors(ids, {"constrain_regex": [None, "x", None]})
    assert mixed.rows == ({}, {"structured_outputs": {"regex": "x"}}, {})
    live = object()
    assert split_request_fields([live, mixed]) == ([mixed], [live])
    assert mixed.for_prompts(6) == [{}, {}, mixed.rows[1], mixed.rows[1], {}, {}]  # a rollout's repeated rows
    with pytest.raises(ValueError, match="RequestFields holds 3 rows but the engine call has 4"):
        mixed.for_prompts(4)


def test_check_accepts_every_backend_and_names_the_install_when_the_library_is_missing(monkeypatch):
    control = ConstrainedDecoding(choices=["a"])
    for backend in ("huggingface", "vllm", {"kind": "vllm_serve", "options": {"base_url": "http://127.0.0.1:1"}}):
        assert SteeringPipeline(TINY_REF, controls=[control], backend=backend).check().ok
    monkeypatch.setattr(constrained_module, "grammar_library_available", lambda: False)
    (failure,) = SteeringPipeline(TINY_REF, controls=[control]).check().failures
    assert "llguidance" in failure.message and "Fix: pip install" in failure.message
    assert SteeringPipeline(TINY_REF, controls=[control], backend="vllm").check().ok  # vLLM brings its own


def test_runtime_kwargs_are_row_scoped_and_named_for_the_provider():
    schema = {e["name"]: e for e in ConstrainedDecoding.RUNTIME_KWARGS_SCHEMA}
    assert set(schema) == {"constrain_regex", "constrain_choices", "constrain_json_schema"}
    assert all(e["scope"] == "row" for e in schema.values())
    assert RESPONSE_SCHEMA_RUNTIME_KWARG in schema  # what the provider maps response_schema to
    assert set(CONSTRAINT_RUNTIME_KWARGS) == set(schema)  # what the provider lets win over it


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"regex": "a", "choices": ["a"]}, ValueError, r"at most one of regex, choices and json_schema"),
        ({"regex": ""}, ValueError, r"ConstrainedDecoding.regex must be a non-empty regular expression"),
        ({"regex": "("}, ValueError, r"ConstrainedDecoding.regex='\(' cannot be compiled.*Fix:"),
        ({"choices": []}, ValueError, r"ConstrainedDecoding.choices must be a non-empty list"),
        ({"choices": ["a", ""]}, ValueError, r"ConstrainedDecoding.choices must be a non-empty list of non-empty"),
        ({"choices": "ab"}, TypeError, r"ConstrainedDecoding.choices must be"),
        ({"json_schema": "{not json"}, ValueError, r"ConstrainedDecoding.json_schema is a string but not JSON"),
        ({"json_schema": "[1]"}, ValueError, r"ConstrainedDecoding.json_schema must be a JSON schema object"),
        ({"json_schema": {"type": "nonsense"}}, ValueError, r"ConstrainedDecoding.json_schema=.*cannot be compiled"),
    ],
)
def test_invalid_args_are_refused_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        ConstrainedDecoding(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"constrain_regex": ["a", None], "constrain_choices": [["b"], None]}, r"Row 0 brings both runtime kwargs"),
        ({"constrain_regex": ["a", None, None]}, r"constrain_regex must be one regex constraint.*for 2 row"),
        ({"constrain_choices": [["a"], "b"]}, r"runtime kwarg constrain_choices \(row 1\) must be a non-empty list"),
        ({"constrain_regex": [None, "("]}, r"runtime kwarg constrain_regex \(row 1\)='\(' cannot be compiled"),
        ({"constrain_json_schema": 3}, r"constrain_json_schema must be one json_schema constraint"),
    ],
)
def test_bad_runtime_constraints_are_refused_naming_the_kwarg_and_row(kwargs, match):
    model, tokenizer = build_tiny_model()
    control = ConstrainedDecoding()
    control.steer(model, tokenizer=tokenizer, backend="huggingface")
    with pytest.raises(ValueError, match=match):
        control.get_logits_processors(torch.ones(2, 3, dtype=torch.long), kwargs)


def test_processors_need_steer():
    with pytest.raises(RuntimeError, match=r"Fix: call pipeline.steer\(\) first"):
        ConstrainedDecoding(regex="a").get_logits_processors(torch.tensor([[1, 2]]), {})
