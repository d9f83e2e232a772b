"""The new decoding drivers on an engine backend without vLLM: backend=vllm_serve against the loopback completions
server (the tiny model through Hugging Face). PhasedDecoding and RoutedDecoding give the Hugging Face backend's
greedy tokens (their phases' stop strings travel in the requests), SearchDecoding's sampled proposals arrive as `n`
candidates per request; the logits-processor controls are refused there before anything loads."""

from __future__ import annotations

import pytest

from steer_hydra.controls.output import (
    SASA,
    ContrastiveGuidance,
    DExperts,
    KeywordRouter,
    PhasedDecoding,
    ProxyTuning,
    RoutedDecoding,
    SearchDecoding,
    ValueGuidance,
)
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.models import build_tiny_model
from steer_hydra.testing.loopback_server import LoopbackCompletionsServer

CHATS = [[{"role": "user", "content": t}] for t in ("hello there cat and dog", "a", "count one two three")]
GREEDY = {"max_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def served():
    model, tokenizer = build_tiny_model()
    reference = SteeringPipeline(model=model, tokenizer=tokenizer).steer()
    with LoopbackCompletionsServer(reference, model_name="tiny") as server:
        yield server
    reference.release()


def _pair(server, make):
    """The same controls on Hugging Face (a fresh tiny model) and on vllm_serve (the loopback server)."""
    model, tokenizer = build_tiny_model()
    hf = SteeringPipeline(model=model, tokenizer=tokenizer, controls=make()).steer()
    spec = BackendSpec("vllm_serve", {"base_url": server.base_url, "retry_backoff": 0.0})
    engine = SteeringPipeline(tokenizer=build_tiny_model()[1], controls=make(), backend=spec)
    assert engine.check().ok, engine.check()
    return hf, engine.steer()


def _phased():
    return [PhasedDecoding(phases=[{"force": "Answer:"}, {"generate": 6, "stop": ["."]}, {"force": " Done."}])]


def test_phased_decoding_gives_the_hugging_face_tokens_on_an_engine(served):
    served.reset()
    hf, engine = _pair(served, _phased)
    try:
        assert engine.generate(messages=CHATS, **GREEDY) == hf.generate(messages=CHATS, **GREEDY)
        assert engine.output_controls[0].last_spans == hf.output_controls[0].last_spans
        bodies = [r.body for r in served.completion_requests()]
        assert bodies and all("." in body["stop"] for body in bodies)  # the phase's stop string travels
    finally:
        hf.release()
        engine.release()


def test_routed_decoding_gives_the_hugging_face_tokens_on_an_engine(served):
    def make():
        router = KeywordRouter({"phased": ["count"]})
        return [RoutedDecoding(routes={"plain": [], "phased": _phased()}, router=router, default_route="plain")]

    hf, engine = _pair(served, make)
    try:
        assert engine.generate(messages=CHATS, **GREEDY) == hf.generate(messages=CHATS, **GREEDY)
        assert engine.output_controls[0].last_routes == ("plain", "plain", "phased")
    finally:
        hf.release()
        engine.release()


def test_sampled_search_decoding_proposes_n_candidates_per_request_on_an_engine(served):
    served.reset()

    def make():
        return [SearchDecoding(scorer=lambda response, row: float(len(response)), proposals=3, rounds=2, segment_len=3)]

    hf, engine = _pair(served, make)
    try:
        output = engine.generate(messages=CHATS[0], max_new_tokens=6, temperature=1.0, seed=0, return_output=True)
        bodies = [r.body for r in served.completion_requests()]
        assert [b["n"] for b in bodies] == [3] * len(bodies) and 1 <= len(bodies) <= 2
        assert engine.output_controls[0].last_trace.rollouts == 3 * len(bodies)
        assert output.generated_tokens > 0
    finally:
        hf.release()
        engine.release()


@pytest.mark.parametrize("backend", ["vllm", "vllm_serve"])
@pytest.mark.parametrize(
    "control",
    [
        ValueGuidance(value_model="steer_hydra:tiny-reward"),
        SASA(direction=[1.0] * 64),
        ContrastiveGuidance(models=["steer_hydra:tiny?seed=1"], weights=[-1.0]),
        DExperts(expert="steer_hydra:tiny?seed=1", anti_expert="steer_hydra:tiny?seed=2"),
        ProxyTuning(expert="steer_hydra:tiny?seed=1", anti_expert="steer_hydra:tiny?seed=2"),
    ],
    ids=lambda c: type(c).__name__,
)
def test_logits_processor_controls_are_refused_on_engines_naming_the_fix(backend, control):
    (failure,) = SteeringPipeline("steer_hydra:tiny", controls=[control], backend=backend).check().failures
    assert failure.control == type(control).__name__
    assert "in_process_torch" in failure.message and "Fix: use backend=huggingface" in failure.message
