"""RoutedDecoding: rows routed differently in one batch each get what their route gives them alone; routing by the
runtime kwarg, a keyword router and a probe fitted on the model's states; routes' runtime kwargs, declarations and
refusals."""

from __future__ import annotations

import pytest

from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.output import (
    DExperts,
    KeywordRouter,
    PhasedDecoding,
    RoutedDecoding,
    SearchDecoding,
    StoppingRules,
)
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.capabilities import Capability
from steer_hydra.models import TINY_REF

EXPERT = "steer_hydra:tiny?seed=1&hidden_size=32"
ANTI = "steer_hydra:tiny?seed=2&hidden_size=32"
PROMPTS = ["hello there cat and dog", "a", "what is the capital of france", "count one two three"]
GREEDY = {"max_new_tokens": 8, "do_sample": False}


def _row(output, pad: int) -> list[int]:
    row = output.output_ids[0].tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def _routes():
    return {
        "plain": [],
        "phased": [PhasedDecoding(phases=[{"force": "Sure:"}, {"generate": None}])],
        "guided": [DExperts(expert=EXPERT, anti_expert=ANTI, alpha=3.0)],
    }


def _alone(make_pipeline, controls, prompt: str) -> list[int]:
    pipeline = make_pipeline(controls)
    return _row(pipeline.generate(text=prompt, return_output=True, **GREEDY), pipeline.tokenizer.pad_token_id)


def test_rows_routed_differently_in_one_batch_each_get_what_their_route_gives_alone(make_pipeline):
    routed = make_pipeline([RoutedDecoding(routes=_routes())])
    pad = routed.tokenizer.pad_token_id
    chosen = ["guided", "plain", "phased", "guided"]
    batch = routed.generate(text=PROMPTS, return_output=True, runtime_kwargs={"route": chosen}, **GREEDY)
    driver = routed.output_controls[0]
    assert driver.last_routes == tuple(chosen)
    rows = [_row(o, pad) for o in batch]
    for prompt, route, row in zip(PROMPTS, chosen, rows, strict=True):
        # the same row in a pipeline holding only its route's controls (fresh instances)
        assert row == _alone(make_pipeline, _routes()[route], prompt), route
        # and the router's pipeline on that row alone
        alone = routed.generate(text=prompt, return_output=True, runtime_kwargs={"route": route}, **GREEDY)
        assert _row(alone, pad) == row
    assert rows[0] != _alone(make_pipeline, [], PROMPTS[0])  # the guided route steers
    assert routed.tokenizer.decode(rows[2]).startswith("Sure:")
    assert routed.supports_batching


def test_a_keyword_router_routes_by_the_prompt_text_and_the_default_catches_the_rest(make_pipeline):
    router = KeywordRouter({"phased": ["capital", "count"], "guided": ["cat"]})
    control = RoutedDecoding(routes=_routes(), router=router, default_route="plain")
    pipeline = make_pipeline([control])
    pipeline.generate(text=PROMPTS, **GREEDY)
    assert control.last_routes == ("guided", "plain", "phased", "phased")
    assert router("Caterpillar") is None and router("a CAT") == "guided"  # whole words, any case
    pipeline.generate(text=PROMPTS[:2], runtime_kwargs={"route": [None, "guided"]}, **GREEDY)
    assert control.last_routes == ("guided", "guided")  # the runtime kwarg wins where given


def test_a_probe_fitted_on_the_models_prompt_states_routes_new_prompts(make_pipeline):
    animals = ["the cat and the dog", "a dog in the house", "my cat sleeps", "the bird and the fish", "a cat"]
    numbers = ["count one two three", "what is 2 + 3", "count to ten", "how many numbers", "add 4 and 5"]
    data = [{"prompt": p, "route": "guided"} for p in animals] + [{"prompt": p, "route": "plain"} for p in numbers]
    control = RoutedDecoding(routes=_routes(), probe_data=data)
    pipeline = make_pipeline([control])
    pipeline.generate(messages=[[{"role": "user", "content": p}] for p in animals + numbers], **GREEDY)
    assert control.last_routes == ("guided",) * 5 + ("plain",) * 5  # its training prompts are routed to their class
    assert {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE} <= control.requirements()


def test_a_non_batching_driver_route_decodes_its_rows_one_at_a_time_with_their_own_runtime_kwargs(make_pipeline):
    calls = []

    def scorer(response: str, row: dict) -> float:
        calls.append(row.get("reference"))
        return float(len(response))

    search = SearchDecoding(scorer=scorer, proposals=2)
    control = RoutedDecoding(routes={"search": [search], "plain": []})
    pipeline = make_pipeline([control])
    assert {"route", "reward_params"} <= {e["name"] for e in control.RUNTIME_KWARGS_SCHEMA}
    kwargs = {"route": ["search", "plain", "search"], "reward_params": [{"reference": "a"}, {}, {"reference": "c"}]}
    texts = pipeline.generate(text=PROMPTS[:3], runtime_kwargs=kwargs, max_new_tokens=4, temperature=1.0, seed=0)
    assert len(texts) == 3 and calls == ["a", "a", "c", "c"]  # two proposals per searched row, each its own row
    assert search.last_trace.rollouts == 2 and control.max_rollouts_per_query() == 2


def test_declarations_follow_the_routes():
    text_only = RoutedDecoding(routes={"a": [], "b": [PhasedDecoding(phases=[{"force": "x"}])]}, default_route="a")
    assert text_only.requirements() == {Capability.SAMPLED_ROLLOUTS}
    for backend in ("huggingface", "vllm", "vllm_serve"):
        assert SteeringPipeline(TINY_REF, controls=[text_only], backend=backend).check().ok
    guided = RoutedDecoding(routes=_routes(), default_route="plain")
    (failure,) = SteeringPipeline(TINY_REF, controls=[guided], backend="vllm").check().failures
    assert failure.control == "RoutedDecoding" and "Fix: use backend=huggingface" in failure.message
    assert {e["name"] for e in text_only.RUNTIME_KWARGS_SCHEMA} == {"route", "forced_texts"}
    assert text_only.supports_refill is False
    assert text_only.descriptor() != RoutedDecoding(routes={"a": [], "b": []}, default_route="a").descriptor()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"routes": {}}, r"RoutedDecoding.routes must map route names to lists of output controls"),
        ({"routes": {"a": [SystemPrompt(text="x")]}}, r"routes\['a'\] holds .* not an output control.*Fix"),
        ({"routes": {"a": [StoppingRules(budget=3)]}}, r"lowers its effect into the whole call.*Fix"),
        (
            {"routes": {"a": [PhasedDecoding(phases=[{"force": "x"}]), PhasedDecoding(phases=[{"force": "y"}])]}},
            r"routes\['a'\] holds 2 decoding drivers",
        ),
        ({"routes": {"a": []}, "default_route": "b"}, r"default_route='b' is not a route"),
        ({"routes": {"a": []}, "probe_data": [{"prompt": "x", "route": "z"}]}, r"probe_data\[0\].route='z' is not"),
        ({"routes": {"a": []}, "router": len, "probe_data": []}, r"takes a router or probe_data, not both"),
    ],
)
def test_invalid_routes_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoutedDecoding(**kwargs)


def test_an_unroutable_row_and_an_unknown_route_are_refused_naming_the_fix(make_pipeline):
    pipeline = make_pipeline([RoutedDecoding(routes={"a": [], "b": []})])
    with pytest.raises(ValueError, match=r"could not route row 0.*Fix: set default_route"):
        pipeline.generate(text=PROMPTS[0], **GREEDY)
    with pytest.raises(ValueError, match=r"row 0 was routed to 'z', which is not a route.*Fix"):
        pipeline.generate(text=PROMPTS[0], runtime_kwargs={"route": "z"}, **GREEDY)
