"""backend=vllm_serve end to end against the loopback completions server (the tiny model through Hugging Face)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from steer_hydra.backends.vllm.serve import (
    ServeOptions,
    ServerError,
    ServerUnavailableError,
    VLLMServeBackend,
    completion_body,
    ids_from_choice,
)
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.output import StoppingRules
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import DecodingDriver, DriverResult, OutputControl
from steer_hydra.core.identity import canonical_json, derive_item_seed
from steer_hydra.models import build_tiny_model

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Hi"}],
]


def _chat_ids(tokenizer, chat) -> list[int]:
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"])


# ---------------------------------------------------------------------- generation
def test_greedy_ragged_batch_matches_hugging_face_and_posts_only_real_tokens(serve_client, loopback):
    pipeline = serve_client()
    served_outputs = pipeline.generate(messages=CHATS, max_new_tokens=10, return_output=True)
    local_outputs = loopback.pipeline.generate(messages=CHATS, max_new_tokens=10, return_output=True)
    assert [o.output_ids.tolist() for o in served_outputs] == [o.output_ids.tolist() for o in local_outputs]
    assert [o.finish_reasons for o in served_outputs] == [o.finish_reasons for o in local_outputs]
    assert pipeline.generate(messages=CHATS, max_new_tokens=10) == loopback.pipeline.generate(
        messages=CHATS, max_new_tokens=10
    )

    bodies = [r.body for r in loopback.completion_requests()[:2]]
    assert sorted(b["prompt"] for b in bodies) == sorted(_chat_ids(pipeline.tokenizer, c) for c in CHATS)
    for body in bodies:
        assert body["model"] == "tiny"  # discovered from /v1/models
        assert (body["max_tokens"], body["n"], body["temperature"]) == (10, 1, 0.0)
        assert body["return_token_ids"] is True and body["include_stop_str_in_output"] is True
        assert "seed" not in body


def test_sampled_candidates_are_grouped_by_prompt_seeded_per_row_and_seed_scope_is_inert(serve_client, loopback):
    pipeline = serve_client()
    kwargs = {"max_new_tokens": 6, "do_sample": True, "n": 3, "seed": 5, "return_output": True}
    first = pipeline.generate(messages=CHATS, **kwargs)
    assert len(first) == 6
    assert all(o.output_ids.shape[0] == 1 for o in first)
    prompts = [o.adapted_input_ids.tolist() for o in first]
    assert prompts[0] == prompts[1] == prompts[2] != prompts[3] == prompts[4] == prompts[5]
    rows = [o.output_ids[0].tolist() for o in first]
    assert len({tuple(r) for r in rows[:3]}) > 1, "the 3 candidates of one prompt should differ"

    bodies = loopback.completion_requests()
    assert sorted(b.body["seed"] for b in bodies) == sorted(derive_item_seed(5, "generate", i) for i in range(2))
    assert all(b.body["n"] == 3 and b.body["temperature"] == 1.0 for b in bodies)

    again = pipeline.generate(messages=CHATS, **kwargs)
    dispatch = pipeline.generate(messages=CHATS, seed_scope="dispatch", **kwargs)
    other = pipeline.generate(messages=CHATS, **{**kwargs, "seed": 6})
    assert [o.output_ids.tolist() for o in again] == [o.output_ids.tolist() for o in first]
    assert [o.output_ids.tolist() for o in dispatch] == [o.output_ids.tolist() for o in first]
    assert [o.output_ids.tolist() for o in other] != [o.output_ids.tolist() for o in first]


def _ascii_stop_text(reference: SteeringPipeline) -> str:
    """A stop text that occurs a few tokens into the greedy continuation (the model has random weights)."""
    out = reference.generate(messages=CHATS[0], max_new_tokens=16, return_output=True)
    ids = out.output_ids[0].tolist()
    for i in range(2, len(ids)):
        piece = reference.tokenizer.decode([ids[i]]).strip()
        if len(piece) >= 2 and piece.isascii() and piece.isalpha():
            return piece
    pytest.fail(f"no ASCII word in the tiny model's greedy continuation {ids}")


def test_system_prompt_and_stopping_rules_run_on_the_server_like_on_hugging_face(serve_client, loopback, make_pipeline):
    local = make_pipeline([SystemPrompt(text="Answer briefly.")])
    stop = _ascii_stop_text(local)

    def controls():
        return [SystemPrompt(text="Answer briefly."), StoppingRules(stop_texts=[stop], budget=12)]

    pipeline = serve_client(controls())
    local = make_pipeline(controls())
    served_outputs = pipeline.generate(messages=CHATS, return_output=True)
    local_outputs = local.generate(messages=CHATS, return_output=True)
    assert [o.output_ids.tolist() for o in served_outputs] == [o.output_ids.tolist() for o in local_outputs]
    assert served_outputs[0].finish_reason == "stop"
    assert stop in served_outputs[0].decode(pipeline.tokenizer)[0]  # ids keep the stop text
    texts = pipeline.generate(messages=CHATS)
    assert texts == local.generate(messages=CHATS)
    assert stop not in texts[0]  # decoded text is cut at the stop string

    body = loopback.completion_requests()[0].body
    assert body["stop"] == [stop] and body["max_tokens"] == 12
    system = pipeline.tokenizer.encode("Answer briefly.", add_special_tokens=False)
    assert any(body["prompt"][i : i + len(system)] == system for i in range(len(body["prompt"])))


def test_unmapped_generation_kwarg_is_refused_before_any_request(serve_client, loopback):
    pipeline = serve_client()
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size.*backend 'vllm_serve'.*huggingface"):
        pipeline.generate(text="Hello there", max_new_tokens=4, no_repeat_ngram_size=2)
    assert loopback.completion_requests() == []


class _LiveProcessorControl(OutputControl):
    """An output control that (wrongly) declares no requirements but hands out a live logits processor."""

    def requirements(self) -> frozenset[Capability]:
        return frozenset()

    def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs) -> list:
        return [_Identity()]


class _Identity:
    def __call__(self, input_ids, scores):
        return scores


def test_live_logits_processors_are_refused_at_submission(serve_client, loopback):
    pipeline = serve_client([_LiveProcessorControl()])
    with pytest.raises(ValueError, match=r"live logits processors.*_Identity.*backend=huggingface"):
        pipeline.generate(text="Hello there", max_new_tokens=4)
    assert loopback.completion_requests() == []


# ---------------------------------------------------------------------- drivers
class _LongestOfN(DecodingDriver):
    """Sampled best-of-n by length: one rollout of n candidates, the longest (pad-stripped) wins."""

    supports_batching = False

    def __init__(self, n: int = 3, num_beams: int | None = None) -> None:
        super().__init__()
        self.n, self.num_beams, self.proposals = n, num_beams, []

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.SAMPLED_ROLLOUTS})

    def decode(self, input_ids, attention_mask, *, rollout, runtime_kwargs, tokenizer, max_new_tokens, **gen):
        extra = {"num_beams": self.num_beams} if self.num_beams else {"do_sample": True}
        sequences = rollout(
            input_ids, attention_mask, max_new_tokens=max_new_tokens, num_return_sequences=self.n, **extra, **gen
        )
        self.proposals.append(sequences)
        lengths = (sequences[:, input_ids.shape[1] :] != tokenizer.pad_token_id).sum(dim=1)
        return DriverResult(sequences[int(torch.argmax(lengths)) : int(torch.argmax(lengths)) + 1])


def test_sampled_best_of_n_rolls_out_on_the_server_seeded_and_reproducible(serve_client, loopback):
    driver = _LongestOfN(n=3)
    pipeline = serve_client([driver])
    first = pipeline.generate(messages=CHATS[0], max_new_tokens=8, do_sample=True, seed=3, return_output=True)
    proposals = driver.proposals[-1]
    prompt = first.adapted_input_ids
    assert proposals.shape[0] == 3 and torch.equal(proposals[:, : prompt.shape[1]], prompt.repeat(3, 1))
    new = proposals[:, prompt.shape[1] :]
    assert first.generated_tokens == int((new != pipeline.tokenizer.pad_token_id).sum())
    body = loopback.completion_requests()[-1].body
    assert body["n"] == 3 and body["temperature"] == 1.0
    assert body["seed"] == derive_item_seed(derive_item_seed(3, "generate", 0), "rollout-0", 0)

    again = pipeline.generate(messages=CHATS[0], max_new_tokens=8, do_sample=True, seed=3, return_output=True)
    assert torch.equal(again.output_ids, first.output_ids)
    assert torch.equal(driver.proposals[-1], proposals)


def test_beam_rollouts_are_refused_naming_deal_and_the_fix(serve_client, loopback):
    pipeline = serve_client([_LongestOfN(n=2, num_beams=2)])
    with pytest.raises(ValueError, match=r"num_beams=2.*DeAL.*backend=huggingface"):
        pipeline.generate(messages=CHATS[0], max_new_tokens=4)
    assert loopback.completion_requests() == []


def test_best_of_n_control_runs_on_the_server(serve_client, loopback):
    best_of_n = pytest.importorskip("steer_hydra.controls.output.best_of_n")

    def scorer(prompt, continuations, params):
        return [float(len(c)) for c in continuations]

    pipeline = serve_client([best_of_n.BestOfN(n=3, scorer=scorer)])
    assert pipeline.check().ok
    output = pipeline.generate(messages=CHATS[0], max_new_tokens=6, do_sample=True, seed=1, return_output=True)
    assert output.output_ids.shape[0] == 1
    assert loopback.completion_requests()[-1].body["n"] == 3


# ---------------------------------------------------------------------- transport and server errors
def test_dropped_connection_is_retried_once_and_succeeds(serve_client, loopback):
    pipeline = serve_client()
    expected = pipeline.generate(messages=CHATS[0], max_new_tokens=5)
    loopback.reset()
    loopback.drop_next(1)
    assert pipeline.generate(messages=CHATS[0], max_new_tokens=5) == expected
    assert pipeline._backend.retries == 1
    first, second = loopback.completion_requests()
    assert first.body == second.body


def test_timeout_is_a_transport_error_and_is_retried(serve_client, loopback):
    pipeline = serve_client(request_timeout=0.5)
    loopback.stall_next(1.5)
    assert isinstance(pipeline.generate(messages=CHATS[0], max_new_tokens=3), str)
    assert pipeline._backend.retries == 1


def test_retries_give_up_after_max_retries_naming_the_url(serve_client, loopback):
    pipeline = serve_client(max_retries=2)
    loopback.drop_next(3)
    with pytest.raises(ServerUnavailableError, match=r"/v1/completions failed in transport 3 time\(s\)"):
        pipeline.generate(messages=CHATS[0], max_new_tokens=3)
    assert pipeline._backend.retries == 2
    assert len(loopback.completion_requests()) == 3


@pytest.mark.parametrize("status", [400, 500])
def test_http_errors_surface_with_the_servers_message_and_are_not_retried(serve_client, loopback, status):
    pipeline = serve_client()
    loopback.fail_next(status, "max_tokens exceeds the context window of 2048 tokens")
    with pytest.raises(ServerError, match=f"HTTP {status}: max_tokens exceeds the context window") as caught:
        pipeline.generate(messages=CHATS[0], max_new_tokens=3)
    assert caught.value.status == status
    assert pipeline._backend.retries == 0
    assert len(loopback.completion_requests()) == 1


def test_a_real_server_failure_surfaces_its_message(serve_client, loopback):
    pipeline = serve_client()
    with pytest.raises(ServerError, match=r"HTTP 500: IndexError: index out of range") as caught:
        pipeline.generate(input_ids=[[1, 5000, 7]], max_new_tokens=3)  # token id outside the tiny vocab
    assert caught.value.status == 500
    assert pipeline._backend.retries == 0


def test_refill_is_refused_as_a_capability_the_backend_does_not_declare(serve_client):
    pipeline = serve_client()
    assert pipeline.refill_blockers() == ["backend 'vllm_serve' has no refill engine"]
    with pytest.raises(ValueError, match=r"cannot refill: backend 'vllm_serve' has no refill engine"):
        pipeline.open_refill(2)
    with pytest.raises(NotImplementedError, match=r"Backend 'vllm_serve' has no refill engine.*Fix: use static"):
        pipeline._backend.refill_engine(2, None)


def test_unreachable_server_fails_at_steer_naming_base_url():
    _, tokenizer = build_tiny_model()
    spec = BackendSpec("vllm_serve", {"base_url": "http://127.0.0.1:9", "max_retries": 1, "retry_backoff": 0.0})
    pipeline = SteeringPipeline(tokenizer=tokenizer, backend=spec)
    with pytest.raises(ServerUnavailableError, match=r"GET http://127.0.0.1:9/v1/models failed in transport 2"):
        pipeline.steer()
    assert not pipeline.is_steered


def test_concurrency_is_bounded_by_max_concurrency(serve_client, loopback):
    pipeline = serve_client(max_concurrency=2)
    loopback.stall_next(0.3, count=6)
    ids = torch.tensor([[1, 5 + i, 7, 9] for i in range(6)])
    out = pipeline.generate(input_ids=ids, max_new_tokens=2)
    assert out.shape[0] == 6
    assert len(loopback.completion_requests()) == 6
    assert loopback.max_in_flight == 2


# ---------------------------------------------------------------------- auth and options
def test_api_key_comes_from_the_env_var_as_bearer_and_stays_out_of_the_config(serve_client, loopback, monkeypatch):
    secret = "sk-loopback-0123456789"
    monkeypatch.setenv("STEER_TEST_KEY", secret)
    loopback.api_key = secret
    try:
        pipeline = serve_client(api_key_env="STEER_TEST_KEY")
        assert isinstance(pipeline.generate(messages=CHATS[0], max_new_tokens=3), str)
    finally:
        loopback.api_key = None
    assert {r.headers.get("Authorization") for r in loopback.requests} == {f"Bearer {secret}"}
    assert [r.path for r in loopback.requests] == ["/v1/models", "/v1/completions"]
    assert secret not in repr(pipeline.backend.options)
    assert secret not in pipeline.backend.digest()
    assert secret not in canonical_json(pipeline.backend)


def test_missing_api_key_surfaces_the_servers_401(serve_client, loopback, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    loopback.api_key = "sk-needed"
    try:
        with pytest.raises(ServerError, match="HTTP 401: Invalid or missing API key"):
            serve_client()
    finally:
        loopback.api_key = None
    assert "Authorization" not in loopback.requests[0].headers


def test_explicit_served_model_name_is_sent_without_asking_the_server(serve_client, loopback):
    pipeline = serve_client(model="my-served-name")
    pipeline.generate(messages=CHATS[0], max_new_tokens=2)
    assert [r.path for r in loopback.requests] == ["/v1/completions"]
    assert loopback.requests[0].body["model"] == "my-served-name"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"needs options.base_url"),
        ({"base_url": "???"}, r"needs options.base_url"),
        ({"base_url": "localhost:8000"}, r"base_url must be an http\(s\) URL; got 'localhost:8000'"),
        ({"base_url": "http://x", "api_key": "sk-1"}, r"does not take api_key.*api_key_env"),
        ({"base_url": "http://x", "timeout": 3}, r"Unknown backend=vllm_serve option\(s\) \['timeout'\]"),
        ({"base_url": "http://x", "max_concurrency": 0}, r"max_concurrency must be >= 1; got 0"),
        ({"base_url": "http://x", "retry_backoff": "soon"}, r"retry_backoff must be a number"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options: Mapping[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        VLLMServeBackend(options)


def test_options_defaults_and_base_url_normalization():
    parsed = ServeOptions.from_mapping({"base_url": "http://host:8000/v1/", "max_retries": "5"})
    assert parsed == ServeOptions(base_url="http://host:8000", max_retries=5)
    assert (parsed.api_key_env, parsed.request_timeout, parsed.max_concurrency) == ("VLLM_API_KEY", 60.0, 8)
    assert (parsed.request_deadline, parsed.job_deadline) == (180.0, None)
    assert parsed.retry_backoff == 0.5 and parsed.model is None


def test_completion_body_is_the_token_prompt_plus_sampling_fields():
    body = completion_body([1, 2, 3], {"max_tokens": 4, "n": 2, "temperature": 0.5, "seed": 9}, model="m")
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 4,
        "n": 2,
        "temperature": 0.5,
        "seed": 9,
        "stream": False,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "return_token_ids": True,
    }


# ---------------------------------------------------------------------- token ids without return_token_ids
def test_servers_without_token_ids_are_re_tokenized_with_one_warning(serve_client, loopback, caplog):
    loopback.return_token_ids = False
    try:
        pipeline = serve_client()
        with caplog.at_level(logging.WARNING, logger="steer_hydra.backends.vllm.serve"):
            texts = pipeline.generate(messages=CHATS, max_new_tokens=10)
            pipeline.generate(messages=CHATS, max_new_tokens=10)
    finally:
        loopback.return_token_ids = True
    assert texts == loopback.pipeline.generate(messages=CHATS, max_new_tokens=10)
    assert sum("re-tokenizing" in r.getMessage() for r in caplog.records) == 1


def test_ids_from_choice_prefers_token_ids_and_restores_the_stop_token(tiny):
    _, tokenizer = tiny
    hello = tokenizer.encode("hello world", add_special_tokens=False)
    assert ids_from_choice({"token_ids": [5, 6], "text": "ignored"}, tokenizer) == [5, 6]
    assert ids_from_choice({"text": "hello world", "finish_reason": "length"}, tokenizer) == hello
    eos = tokenizer.eos_token_id
    assert ids_from_choice({"text": "hello world", "finish_reason": "stop", "stop_reason": None}, tokenizer) == [
        *hello,
        eos,
    ]
    assert ids_from_choice({"text": "hello world", "finish_reason": "stop", "stop_reason": 17}, tokenizer) == [
        *hello,
        17,
    ]
    assert ids_from_choice({"text": "hello world", "finish_reason": "stop", "stop_reason": "world"}, tokenizer) == hello
    stop = tokenizer.encode("END", add_special_tokens=False)
    assert ids_from_choice({"text": "hello world", "finish_reason": "stop", "stop_reason": "END"}, tokenizer) == [
        *hello,
        *stop,
    ]
