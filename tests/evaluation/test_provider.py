"""The steer_hydra Inspect provider: options, construction, message conversion, config mapping, output assembly."""

from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import anyio
import pytest
import torch
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ContentImage,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    ModelAPI,
)
from inspect_ai.tool import ToolCall, ToolInfo

from steer_hydra.core.output import Output
from steer_hydra.evaluation import provider as provider_module
from steer_hydra.evaluation.options import (
    MAPPED_FIELDS,
    POLICY_FIELDS,
    REFUSED_FIELDS,
    UPSTREAM_FIELDS,
    ProviderOptions,
)
from steer_hydra.evaluation.provider import (
    RUNTIME_KWARGS_EXTRA_BODY_KEY,
    SteeringPipelineModelAPI,
    as_inspect_model,
)
from steer_hydra.models import TinySpec, build_tiny_tokenizer

# Inspect's retry helper still passes a deprecated tenacity argument.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")


class Declares:
    """A stand-in control: only what the provider reads (`enabled`, `RUNTIME_KWARGS_SCHEMA`)."""

    def __init__(self, *entries, enabled=True):
        self.RUNTIME_KWARGS_SCHEMA = list(entries)
        self.enabled = enabled


class StubPipeline:
    """The pipeline surface the provider touches; generate returns `reply` (plus eos) for every prompt."""

    def __init__(self, *, chat=True, controls=(), supports_batching=True, steered=True, reply="hello", tokenizer=None):
        self.tokenizer = tokenizer or build_tiny_tokenizer(TinySpec(chat_template=chat))
        self.controls = list(controls)
        self.supports_batching = supports_batching
        self.is_steered = steered
        self.reply = reply
        self.calls: list[dict] = []

    def _row(self):
        return self.tokenizer.encode(self.reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]

    def generate(self, *, runtime_kwargs, return_output, messages=None, text=None, **gen_kwargs):
        self.calls.append({"runtime_kwargs": runtime_kwargs, "return_output": return_output, "messages": messages,
                           "text": text, **gen_kwargs})  # fmt: skip
        n = gen_kwargs.get("n", 1)
        prompt = torch.tensor([[1, 5, 7]])
        if n > 1:
            return Output(torch.tensor([self._row()] * n), prompt, ["eos"] * n)
        prompts = messages if messages is not None else text
        return [Output(torch.tensor([self._row()]), prompt, ["eos"]) for _ in prompts]


def build(pipeline=None, **options):
    pipeline = pipeline or StubPipeline()
    return SteeringPipelineModelAPI("stub", pipeline=pipeline, options=ProviderOptions(**options))


def generate(api, input="hi", config=None, tools=()):
    if isinstance(input, str):
        input = [ChatMessageUser(content=input)]
    return anyio.run(api.generate, input, list(tools), "auto", config or GenerateConfig())


# ---------------------------------------------------------------------- 2.1 ProviderOptions
def test_options_defaults():
    options = ProviderOptions()
    assert options.runtime_kwargs == {} and options.chat_template_kwargs is None
    assert (options.max_batch_size, options.default_max_tokens) == (8, 1024)
    assert options.reasoning_tags == ("<think>", "</think>") and options.reasoning_opened_at_start is False
    assert (options.reasoning_split, options.on_unsupported_param, options.seed_scope) == ("auto", "raise", "dispatch")


def test_options_are_frozen_and_slotted():
    options = ProviderOptions()
    with pytest.raises(AttributeError):
        options.max_batch_size = 2
    assert not hasattr(options, "__dict__")


def test_options_runtime_kwargs_must_be_a_mapping():
    with pytest.raises(TypeError, match="runtime_kwargs"):
        ProviderOptions(runtime_kwargs=[("substrings", ["x"])])


def test_options_chat_template_kwargs_must_be_a_mapping_or_none():
    with pytest.raises(TypeError, match="chat_template_kwargs"):
        ProviderOptions(chat_template_kwargs=["enable_thinking"])
    assert ProviderOptions(chat_template_kwargs={"a": 1}).chat_template_kwargs == {"a": 1}


@pytest.mark.parametrize("name", ["max_batch_size", "default_max_tokens"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_options_sizes_must_be_positive_integers(name, value):
    with pytest.raises(ValueError, match=rf"ProviderOptions\.{name} must be an integer >= 1; got {value!r}\. Fix:"):
        ProviderOptions(**{name: value})


@pytest.mark.parametrize("tags", [("", "</think>"), ("<think>",), "<think>", ("<a>", 3)])
def test_options_reasoning_tags_must_be_a_pair_of_non_empty_strings(tags):
    with pytest.raises(ValueError, match="reasoning_tags"):
        ProviderOptions(reasoning_tags=tags)


def test_options_reasoning_tags_accepts_none_and_lists():
    assert ProviderOptions(reasoning_tags=None).reasoning_tags is None
    assert ProviderOptions(reasoning_tags=["<a>", "</a>"]).reasoning_tags == ("<a>", "</a>")


@pytest.mark.parametrize(
    ("name", "value"), [("reasoning_split", "bytes"), ("on_unsupported_param", "ignore"), ("seed_scope", "whole")]
)
def test_options_unknown_choices_raise(name, value):
    with pytest.raises(ValueError, match=name):
        ProviderOptions(**{name: value})


# ---------------------------------------------------------------------- 2.2 construction and hooks
def test_model_name():
    pipeline = StubPipeline()
    assert str(as_inspect_model(pipeline, model_name="arm-a")) == "steer_hydra/arm-a"
    model = as_inspect_model(pipeline)
    assert str(model) == "steer_hydra/steering-pipeline"
    assert isinstance(model.api, SteeringPipelineModelAPI)


def test_directly_built_api_also_carries_the_provider_name():
    from inspect_ai.model import Model

    assert str(Model(build(), GenerateConfig())) == "steer_hydra/stub"


def test_missing_pipeline_points_to_as_inspect_model():
    with pytest.raises(ValueError, match="as_inspect_model"):
        SteeringPipelineModelAPI("stub")


def test_unsteered_pipeline_points_to_steer():
    with pytest.raises(ValueError, match=r"steer\(\)"):
        build(StubPipeline(steered=False))


def test_base_api_gets_an_empty_config_and_ignores_connection_args(monkeypatch):
    seen = {}
    original = ModelAPI.__init__

    def spy(self, model_name, base_url=None, api_key=None, api_key_vars=(), config=GenerateConfig()):
        seen.update(base_url=base_url, api_key=api_key, config=config)
        original(self, model_name, base_url, api_key, list(api_key_vars), config)

    monkeypatch.setattr(ModelAPI, "__init__", spy)
    api = SteeringPipelineModelAPI(
        "stub", "http://x", "key", ["K"], GenerateConfig(temperature=0.3), pipeline=StubPipeline(), extra=1
    )
    assert seen["base_url"] is None and seen["api_key"] is None
    assert seen["config"] == GenerateConfig()
    assert api.base_url is None and api.api_key is None


def test_prompt_path_from_the_chat_template():
    assert build(StubPipeline(chat=True)).prompt_path == "messages"
    with pytest.warns(UserWarning, match="adapt_messages"):
        assert build(StubPipeline(chat=False)).prompt_path == "text"


def test_text_path_refuses_chat_template_kwargs():
    with pytest.raises(TypeError, match="chat_template_kwargs"):
        build(StubPipeline(chat=False), chat_template_kwargs={"enable_thinking": False})


def test_messages_path_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(StubPipeline(chat=True))


def test_batch_ceiling_clamps_unbatchable_pipelines(caplog):
    assert build(max_batch_size=3).batch_ceiling == 3
    with caplog.at_level(logging.INFO, logger="steer_hydra.evaluation.provider"):
        api = build(StubPipeline(supports_batching=False), max_batch_size=8)
    assert api.batch_ceiling == 1
    (message,) = [r.getMessage() for r in caplog.records if "clamped" in r.getMessage()]
    assert "max_batch_size=8 to 1" in message and "now 2" in message  # the number it states is max_connections()


def test_max_connections_is_twice_the_batch_ceiling():
    assert build(max_batch_size=3).max_connections() == 6  # the next batch waits while one decodes
    assert build(StubPipeline(supports_batching=False), max_batch_size=8).max_connections() == 2
    model = as_inspect_model(StubPipeline(), options=ProviderOptions(max_batch_size=5))
    assert (model.api.batch_ceiling, model.api.max_connections()) == (5, 10)


def test_max_tokens_is_the_default_max_tokens():
    assert build(default_max_tokens=77).max_tokens() == 77


def test_connection_key_is_per_instance():
    first, second = build(), build()
    assert first.connection_key() == f"steer_hydra:{id(first)}"
    assert first.connection_key() != second.connection_key()


def test_no_retries_no_auth_failures_no_required_tools():
    api = build()
    error = RuntimeError("x")
    assert api.should_retry(error) is False and api.is_auth_failure(error) is False and api.tools_required() is False


def test_declared_scopes_come_from_enabled_controls():
    controls = [
        Declares({"name": "substrings", "scope": "row"}),
        Declares({"name": "alpha"}),  # no scope: "call"
        Declares({"name": "gamma", "scope": "row"}, enabled=False),
    ]
    pipeline = StubPipeline(controls=controls)
    api = build(pipeline)
    with pytest.raises(ValueError, match="declared 'call'-scoped"):
        generate(api, config=GenerateConfig(extra_body={"runtime_kwargs": {"alpha": 1.0}}))
    generate(api, config=GenerateConfig(extra_body={"runtime_kwargs": {"gamma": ["g"], "substrings": ["s"]}}))
    assert pipeline.calls[-1]["runtime_kwargs"] == {"substrings": [["s"]]}
    assert api.inert_runtime_kwargs == frozenset({"gamma"})


def test_reasoning_split_resolution():
    assert build(reasoning_tags=None)._reasoning_split is None
    assert build()._reasoning_split == "text"  # <think> round-trips through the tiny tokenizer
    special = ("<|user|>", "<|assistant|>")
    assert build(reasoning_tags=special)._reasoning_split == "tokens"
    assert build(reasoning_tags=special, reasoning_split="text")._reasoning_split == "text"
    assert build(reasoning_split="tokens")._reasoning_split == "tokens"


def test_reasoning_tag_with_no_ids_raises_at_construction():
    tokenizer = build_tiny_tokenizer()
    encode = tokenizer.encode

    class Blank(type(tokenizer)):
        pass

    tokenizer.__class__ = Blank
    Blank.encode = lambda self, text, **kw: [] if not text.strip() else encode(text, **kw)
    with pytest.raises(ValueError, match="empty id sequence"):
        build(StubPipeline(tokenizer=tokenizer), reasoning_tags=("<open>", "   "))


# ---------------------------------------------------------------------- 2.3 message conversion and refusals
def test_messages_become_role_content_dicts():
    api = build()
    converted = api._convert_input(
        [
            ChatMessageSystem(content="be brief"),
            ChatMessageUser(content=[ContentText(text="hello "), ContentText(text="world")]),
            ChatMessageAssistant(content=[ContentReasoning(reasoning="hmm"), ContentText(text="hi")]),
        ]
    )
    assert converted == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": "hi"},
    ]


def test_tool_messages_and_tool_calls_are_refused():
    api = build()
    with pytest.raises(NotImplementedError, match="tool"):
        api._convert_input([ChatMessageUser(content="x"), ChatMessageTool(content="42", tool_call_id="1")])
    call = ToolCall(id="1", function="calc", arguments={})
    with pytest.raises(NotImplementedError, match="tool"):
        api._convert_input([ChatMessageAssistant(content="", tool_calls=[call])])


def test_non_text_content_is_refused_by_class_name():
    with pytest.raises(NotImplementedError, match="ContentImage"):
        build()._convert_input([ChatMessageUser(content=[ContentImage(image="data:image/png;base64,AAAA")])])


def test_tools_are_refused_with_not_implemented():
    with pytest.raises(NotImplementedError, match="tools") as info:
        generate(build(), tools=[ToolInfo(name="calc", description="adds")])
    assert not isinstance(info.value, ValueError)
    assert "generation-only" in str(info.value)


def test_text_path_renders_and_dispatches_text():
    pipeline = StubPipeline(chat=False)
    with pytest.warns(UserWarning):
        api = build(pipeline)
    generate(api, [ChatMessageSystem(content="be brief"), ChatMessageUser(content="hello")])
    (call,) = pipeline.calls
    assert call["text"] == ["be brief\n\nhello"] and call["messages"] is None


# ---------------------------------------------------------------------- 2.4 GenerateConfig mapping
def test_field_sets_are_disjoint_and_cover_generate_config():
    sets = [MAPPED_FIELDS, UPSTREAM_FIELDS, POLICY_FIELDS, REFUSED_FIELDS]
    for i, first in enumerate(sets):
        for second in sets[i + 1 :]:
            assert not first & second
    union = frozenset().union(*sets)
    fields = set(GenerateConfig.model_fields)
    assert union == fields, f"unclassified: {sorted(fields - union)}; stale: {sorted(union - fields)}"


@pytest.mark.parametrize("field", sorted(REFUSED_FIELDS))
@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_logprob_fields_are_refused_first(field, policy):
    value = True if field == "logprobs" else 2
    config = GenerateConfig(**{field: value}, best_of=3)
    with pytest.raises(NotImplementedError, match="generation-only"):
        build(on_unsupported_param=policy)._map_generate_config(config)


def test_runtime_kwargs_are_popped_from_extra_body():
    api = build()
    config = GenerateConfig(extra_body={RUNTIME_KWARGS_EXTRA_BODY_KEY: {"substrings": ["x"]}})
    gen_kwargs, per_sample, num_choices = api._map_generate_config(config)
    assert (gen_kwargs, per_sample, num_choices) == ({}, {"substrings": ["x"]}, 1)
    assert api._map_generate_config(GenerateConfig(extra_body={"runtime_kwargs": None}))[1] == {}
    assert api._map_generate_config(GenerateConfig())[1] == {}
    with pytest.raises(ValueError, match="runtime_kwargs"):
        api._map_generate_config(GenerateConfig(extra_body={"runtime_kwargs": [("a", 1)]}))


def test_policy_field_raises_by_default():
    with pytest.raises(ValueError, match=r"GenerateConfig\.best_of=4.*on_unsupported_param='warn'"):
        build()._map_generate_config(GenerateConfig(best_of=4))


def test_policy_field_warns_once_per_field_under_warn():
    api = build(on_unsupported_param="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            gen_kwargs, _, _ = api._map_generate_config(GenerateConfig(best_of=4, frequency_penalty=0.5))
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert gen_kwargs == {}
    assert len(messages) == 2
    assert any("best_of" in m for m in messages) and any("frequency_penalty" in m for m in messages)
    with pytest.warns(UserWarning, match="best_of"):  # once per provider instance
        build(on_unsupported_param="warn")._map_generate_config(GenerateConfig(best_of=4))


def test_other_extra_body_keys_follow_the_policy():
    with pytest.raises(ValueError, match=r"extra_body\['guided_json'\]"):
        build()._map_generate_config(GenerateConfig(extra_body={"guided_json": {}}))
    with pytest.warns(UserWarning, match=r"extra_body\['guided_json'\]"):
        gen_kwargs, _, _ = build(on_unsupported_param="warn")._map_generate_config(
            GenerateConfig(extra_body={"guided_json": {}})
        )
    assert gen_kwargs == {}


def test_upstream_fields_add_nothing():
    config = GenerateConfig(
        max_retries=2, timeout=5, stream_idle_timeout=3, system_message="sys", cache=True, batch=False,
        max_connections=4, fail_on_refusal=True,
    )  # fmt: skip
    assert build()._map_generate_config(config)[0] == {}


def test_max_tokens_and_stop_seqs():
    gen_kwargs, _, _ = build()._map_generate_config(GenerateConfig(max_tokens=32, stop_seqs=["END"]))
    assert gen_kwargs == {"max_new_tokens": 32, "stop_strings": ("END",)}
    assert build()._map_generate_config(GenerateConfig(stop_seqs=[]))[0] == {}


def test_no_temperature_attaches_no_sampling_kwargs():
    api = SteeringPipelineModelAPI("stub", pipeline=StubPipeline(), trial_seed=11)
    assert api._map_generate_config(GenerateConfig(top_p=0.9, top_k=4, seed=5))[0] == {}


def test_temperature_zero_is_greedy_only():
    api = SteeringPipelineModelAPI("stub", pipeline=StubPipeline(), trial_seed=11)
    config = GenerateConfig(temperature=0, top_p=0.9, top_k=4, seed=5)
    assert api._map_generate_config(config)[0] == {"do_sample": False}


def test_sampling_kwargs_with_seed():
    api = SteeringPipelineModelAPI("stub", pipeline=StubPipeline(), trial_seed=11)
    gen_kwargs, _, _ = api._map_generate_config(GenerateConfig(temperature=0.7, top_p=0.9, top_k=40, seed=5))
    assert gen_kwargs == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 5, "seed_scope": "dispatch",
    }  # fmt: skip
    assert isinstance(gen_kwargs["temperature"], float) and isinstance(gen_kwargs["top_k"], int)


def test_sampling_seed_falls_back_to_trial_seed_and_scope_follows_options():
    assert build()._map_generate_config(GenerateConfig(temperature=0.5))[0] == {"do_sample": True, "temperature": 0.5}
    seeded = SteeringPipelineModelAPI("stub", pipeline=StubPipeline(), trial_seed=11)
    gen_kwargs = seeded._map_generate_config(GenerateConfig(temperature=0.5))[0]
    assert (gen_kwargs["seed"], gen_kwargs["seed_scope"]) == (11, "dispatch")
    item = SteeringPipelineModelAPI(
        "stub", pipeline=StubPipeline(), trial_seed=11, options=ProviderOptions(seed_scope="item")
    )
    assert item._map_generate_config(GenerateConfig(temperature=0.5))[0]["seed_scope"] == "item"


def test_num_choices_defaults_to_one():
    api = build()
    assert api._map_generate_config(GenerateConfig())[2] == 1
    choices = api._map_generate_config(GenerateConfig(num_choices=3))[2]
    assert choices == 3 and isinstance(choices, int)


def test_missing_max_tokens_comes_from_the_provider_default():
    pipeline = StubPipeline()
    model = as_inspect_model(pipeline, options=ProviderOptions(default_max_tokens=77))
    output = anyio.run(model.generate, "hi")
    assert pipeline.calls[0]["max_new_tokens"] == 77
    assert output.completion == "hello"


# ---------------------------------------------------------------------- 2.5 output assembly
def _output(tokenizer, texts, reasons=None, *, prompt=(1, 2), generated=None, pad_to=None):
    rows = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    width = pad_to or max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    return Output(ids, torch.tensor([list(prompt)]), reasons or ["eos"] * len(rows), generated)


def test_rows_are_decoded_and_ids_untouched():
    api = build(reasoning_tags=None)
    output = _output(api.pipeline.tokenizer, ["the cat", "a dog"], pad_to=6)
    before = output.output_ids.clone()
    result = api._assemble_model_output(output)
    assert [c.message.text for c in result.choices] == ["the cat", "a dog"]
    assert torch.equal(output.output_ids, before)


def test_finish_reasons_map_per_row_or_broadcast():
    api = build(reasoning_tags=None)
    tokenizer = api.pipeline.tokenizer
    output = _output(tokenizer, ["a", "b", "c", "d"], ["length", "stop", "eos", None])
    assert [c.stop_reason for c in api._assemble_model_output(output).choices] == [
        "max_tokens", "stop", "stop", "unknown",
    ]  # fmt: skip
    ragged = SimpleNamespace(
        output_ids=torch.tensor([[5], [6]]), adapted_input_ids=None, finish_reasons=["length"],
        finish_reason="length", generated_tokens=None, decode=lambda tok: ["x", "y"],
    )  # fmt: skip
    assert [c.stop_reason for c in api._assemble_model_output(ragged).choices] == ["max_tokens", "max_tokens"]


def test_without_tags_content_is_cut_at_the_earliest_stop_string():
    api = build(reasoning_tags=None)
    tokenizer = api.pipeline.tokenizer
    result = api._assemble_model_output(_output(tokenizer, ["keep END drop"]), stop_strings=("drop", "END"))
    assert result.choices[0].message.content == "keep "
    result = api._assemble_model_output(_output(tokenizer, ["<think>a</think> b"]))
    assert result.choices[0].message.content == "<think>a</think> b"


def test_text_split_gives_reasoning_and_answer_content():
    api = build()
    result = api._assemble_model_output(_output(api.pipeline.tokenizer, ["<think>plan</think> answer", "plain"]))
    split, plain = result.choices
    assert isinstance(split.message.content, list)
    assert isinstance(split.message.content[0], ContentReasoning) and split.message.content[0].reasoning == "plan"
    assert isinstance(split.message.content[1], ContentText) and split.message.content[1].text == "answer"
    assert result.completion == "answer"
    assert plain.message.content == "plain"


def test_tokens_split_through_the_provider(caplog):
    api = build(reasoning_tags=("<|user|>", "<|assistant|>"))
    tokenizer = api.pipeline.tokenizer
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<|user|>", "<|assistant|>"])
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    closed = [open_id, *encode(" plan"), close_id, *encode(" answer stop more")]
    unclosed = [open_id, *encode(" still thinking")]
    width = max(len(closed), len(unclosed))
    rows = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in (closed, unclosed, list(unclosed))]
    output = Output(torch.tensor(rows), torch.tensor([[1, 2]]), ["stop", "length", "length"])
    with caplog.at_level(logging.WARNING, logger="steer_hydra.evaluation.provider"):
        result = api._assemble_model_output(output, stop_strings=(" stop",))
    first, second, _ = result.choices
    assert first.message.content[0].reasoning == "plan" and first.message.text == "answer"
    assert second.message.content[0].reasoning == "still thinking" and second.message.text == ""
    thinking = [r.getMessage() for r in caplog.records if "thinking" in r.getMessage()]
    assert len(thinking) == 1 and thinking[0].startswith("2 of 3")


def test_closed_empty_answer_does_not_warn(caplog):
    api = build()
    with caplog.at_level(logging.WARNING, logger="steer_hydra.evaluation.provider"):
        result = api._assemble_model_output(_output(api.pipeline.tokenizer, ["<think>plan</think>"]))
    assert result.completion == "" and result.choices[0].message.content[0].reasoning == "plan"
    assert not caplog.records


def test_choices_carry_the_model_name():
    result = build()._assemble_model_output(_output(build().pipeline.tokenizer, ["x"]))
    assert result.model == "stub"
    assert result.choices[0].message.model == "stub" and result.choices[0].message.source == "generate"


def test_usage_counts_non_pad_tokens():
    api = build()
    assert api.pipeline.tokenizer.pad_token_id == 0
    output = Output(torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]]), torch.tensor([[1, 2, 0]]), ["eos", "eos"])
    result = api._assemble_model_output(output)
    usage = result.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (2, 3, 5)
    assert result.metadata == {"returned_output_tokens": 3}
    driven = Output(torch.tensor([[5, 6, 0]]), torch.tensor([[1, 2, 0]]), ["eos"], generated_tokens=40)
    result = api._assemble_model_output(driven)
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.total_tokens) == (2, 40, 42)
    assert result.metadata == {"returned_output_tokens": 2}
    bare = Output(torch.tensor([[5, 6, 0]]), None, ["eos"])
    assert api._assemble_model_output(bare).usage.input_tokens == 0


def test_usage_without_a_pad_id_counts_every_element(monkeypatch):
    api = build()
    monkeypatch.setattr(api, "_tokenizer", SimpleNamespace(pad_token_id=None, decode=api.pipeline.tokenizer.decode))
    output = Output(torch.tensor([[5, 6, 0, 0]]), torch.tensor([[1, 2, 0]]), ["eos"])
    assert api._assemble_model_output(output).metadata == {"returned_output_tokens": 4}


# ---------------------------------------------------------------------- 2.6 dispatch shapes through generate()
def test_single_choice_dispatches_a_batch_of_one():
    pipeline = StubPipeline()
    result = generate(build(pipeline), "hello there")
    (call,) = pipeline.calls
    assert call["messages"] == [[{"role": "user", "content": "hello there"}]] and call["text"] is None
    assert call["return_output"] is True and "n" not in call
    assert len(result.choices) == 1 and result.completion == "hello"


def test_multiple_choices_dispatch_the_bare_conversation_with_n():
    pipeline = StubPipeline()
    result = generate(build(pipeline), "hello", GenerateConfig(num_choices=3))
    (call,) = pipeline.calls
    assert call["messages"] == [{"role": "user", "content": "hello"}] and call["n"] == 3
    assert len(result.choices) == 3


def test_dispatch_carries_gen_kwargs_runtime_kwargs_and_template_kwargs():
    pipeline = StubPipeline()
    api = build(pipeline, chat_template_kwargs={"enable_thinking": False})
    generate(api, "x", GenerateConfig(max_tokens=9, temperature=0, stop_seqs=["END"]))
    (call,) = pipeline.calls
    assert call["max_new_tokens"] == 9 and call["do_sample"] is False and call["stop_strings"] == ("END",)
    assert call["chat_template_kwargs"] == {"enable_thinking": False} and call["runtime_kwargs"] == {}


def test_static_call_scoped_kwarg_is_passed_as_the_same_object():
    scale = {"layers": [1, 2]}
    pipeline = StubPipeline(controls=[Declares({"name": "scale", "scope": "call"})])
    generate(build(pipeline, runtime_kwargs={"scale": scale}))
    assert pipeline.calls[0]["runtime_kwargs"]["scale"] is scale


def test_per_sample_kwargs_inert_or_row_collated():
    pipeline = StubPipeline(controls=[Declares({"name": "substrings", "scope": "row"})])
    api = build(pipeline)
    config = GenerateConfig(extra_body={"runtime_kwargs": {"substrings": ["x"], "ghost": 1}})
    generate(api, "hi", config)
    assert pipeline.calls[0]["runtime_kwargs"] == {"substrings": [["x"]]}
    assert api.inert_runtime_kwargs == frozenset({"ghost"})


@pytest.mark.parametrize("closer", ["close", "aclose"])
def test_generate_after_close_raises(closer):
    api = build()
    if closer == "close":
        api.close()
    else:
        anyio.run(api.aclose)
    with pytest.raises(RuntimeError, match="closed"):
        generate(api)


def test_provider_module_is_registered_with_inspect():
    from inspect_ai._util.registry import registry_info

    assert registry_info(provider_module.steer_hydra).name.endswith("steer_hydra")
    from importlib.metadata import entry_points

    (entry,) = [ep for ep in entry_points(group="inspect_ai") if ep.name == "steer_hydra"]
    module = entry.load()  # the app's entry module: imports this provider, the tasks, and sets the CLI builder
    assert module.provider is provider_module and provider_module._pipeline_builder is module.build_from_model_args


def test_get_model_by_name_explains_that_a_pipeline_is_needed():
    from inspect_ai.model import get_model

    with pytest.raises(ValueError, match="as_inspect_model"):
        get_model("steer_hydra/some-arm")


# ---------------------------------------------------------------------- 2.7 prompts past the context window
def _with_context(pipeline, context):
    """Give a stub pipeline a loaded model's config stating its context window (what the provider reads)."""
    pipeline.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=context))
    return pipeline


@pytest.mark.parametrize("chat", [True, False], ids=["messages", "text"])
def test_a_prompt_past_the_context_window_is_refused_before_dispatch(chat):
    pipeline = _with_context(StubPipeline(chat=chat), 48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the text path warns once at construction
        api = build(pipeline)
    long_prompt = "the cat sat on the mat " * 20
    tokens = api.prompt_tokens(api._convert_input([ChatMessageUser(content=long_prompt)]) if chat else long_prompt)
    assert tokens > 48
    with pytest.raises(provider_module.PromptTooLongError) as info:
        generate(api, long_prompt, GenerateConfig(max_tokens=8))
    message = str(info.value)
    assert "\n" not in message and f"The prompt is {tokens} tokens and max_tokens is 8" in message
    assert "context window of 48 tokens (max_position_embeddings)" in message
    assert "Fix: shorten the input, lower max_tokens" in message and "longer context" in message
    assert pipeline.calls == []  # refused before it was queued: nothing generated
    generate(api, "hi", GenerateConfig(max_tokens=8))  # a prompt that fits is served
    assert len(pipeline.calls) == 1


def test_the_context_check_counts_max_tokens_and_is_skipped_without_a_local_model():
    pipeline = _with_context(StubPipeline(), 64)
    api = build(pipeline)
    tokens = api.prompt_tokens([{"role": "user", "content": "hi"}])
    generate(api, "hi", GenerateConfig(max_tokens=64 - tokens))  # exactly fills the window: served
    with pytest.raises(provider_module.PromptTooLongError, match=f"max_tokens is {65 - tokens}"):
        generate(api, "hi", GenerateConfig(max_tokens=65 - tokens))
    unknown = StubPipeline()  # no local model (a vLLM engine or a server): the engine judges the length itself
    generate(build(unknown), "word " * 5000, GenerateConfig(max_tokens=8))
    assert len(unknown.calls) == 1


def test_a_prompt_too_long_for_the_model_fails_alone_in_an_eval(make_pipeline, tmp_path):
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.log import read_eval_log_sample_summaries
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate as generate_solver

    from steer_hydra.evaluation.suite import InspectSuite

    pipeline = make_pipeline(max_position_embeddings=64)
    samples = [Sample(id=1, input="the cat", target="x"), Sample(id=2, input="the dog " * 80, target="x")]
    samples.append(Sample(id=3, input="a bird", target="x"))
    task = Task(dataset=MemoryDataset(samples), solver=generate_solver(), scorer=includes(), name="lengths")
    suite = InspectSuite(name="s", tasks=(task,), retry_attempts=0, retry_on_error=0)
    out = suite.run(pipeline, log_dir=tmp_path, generate_defaults={"temperature": 0, "max_tokens": 4})
    assert out["lengths"]["n"] == 2 and out["lengths"]["failed"] == 1  # the others are scored
    (summaries,) = [read_eval_log_sample_summaries(log) for log in tmp_path.rglob("*.eval")]
    errors = {s.id: s.error for s in summaries}
    assert errors[1] is None and errors[3] is None
    assert "PromptTooLongError" in errors[2] and "context window of 64 tokens" in errors[2], errors[2]
