"""backend=vllm_serve under a frozen server: bounded waits per request and per job, one clear error, identity."""

from __future__ import annotations

import functools
import logging
import time

import pytest

from steer_hydra.backends.vllm.serve import ServerError, ServerUnavailableError, VLLMServeBackend
from steer_hydra.core import BackendSpec

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(serve_client):
    """`client(**options)`: a vllm_serve pipeline on the loopback server, retrying after 0.05 s (the deadlines below
    count its attempts)."""
    return functools.partial(serve_client, retry_backoff=0.05)


def test_a_frozen_server_fails_a_request_within_its_deadline_then_every_request_at_once(client, loopback, caplog):
    pipeline = client(request_timeout=0.4, request_deadline=1.0, max_retries=50)
    loopback.freeze()
    began = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="steer_hydra.backends.vllm.serve"):
        with pytest.raises(ServerUnavailableError, match=r"gave up: its request_deadline=1s passed after \d attempt"):
            pipeline.generate(messages=CHAT, max_new_tokens=3)
        first = time.monotonic() - began
        assert 0.9 < first < 3.0, f"the first request took {first:.2f}s"
        held = loopback.frozen_requests
        with pytest.raises(ServerUnavailableError, match="an earlier request gave up; not retrying"):
            pipeline.generate(messages=CHAT, max_new_tokens=3)
        assert loopback.frozen_requests == held  # failed without sending anything
    assert 2 <= loopback.frozen_requests <= 3  # 0.4 s attempts in a 1 s deadline, none after giving up
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "request_deadline=1s" in errors[0] and loopback.base_url in errors[0]


def test_the_job_deadline_bounds_every_request_after_connecting(client, loopback):
    connected = time.monotonic()
    pipeline = client(request_timeout=30, request_deadline=60, job_deadline=8.0)
    assert isinstance(pipeline.generate(messages=CHAT, max_new_tokens=2), str)  # answered within the deadline
    loopback.freeze()
    with pytest.raises(ServerUnavailableError, match=r"its job_deadline=8s passed.*backend.options.job_deadline"):
        pipeline.generate(messages=CHAT, max_new_tokens=2)
    assert time.monotonic() - connected < 8 + 3  # not request_deadline=60 nor request_timeout=30


def test_the_servers_error_text_reaches_the_console_once(client, loopback, caplog):
    pipeline = client()
    loopback.fail_next(500, "CUDA out of memory. Tried to allocate 2.00 GiB", count=2)
    with caplog.at_level(logging.ERROR, logger="steer_hydra.backends.vllm.serve"):
        for _ in range(2):
            with pytest.raises(ServerError, match="HTTP 500: CUDA out of memory"):
                pipeline.generate(messages=CHAT, max_new_tokens=2)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        f"backend=vllm_serve: Server at {loopback.base_url}/v1/completions answered HTTP 500: "
        "CUDA out of memory. Tried to allocate 2.00 GiB"
    ]
    assert isinstance(pipeline.generate(messages=CHAT, max_new_tokens=2), str)  # HTTP errors condemn nothing


def test_identity_names_the_served_model_not_the_address(client, loopback):
    backend = client()._backend
    assert backend.identity() == {"kind": "vllm_serve", "served_model": "tiny", "server_version": "loopback"}
    options = {"base_url": "http://h:1", "api_key_env": "K", "model": "m", "request_timeout": 3, "job_deadline": 9}
    assert VLLMServeBackend.protocol_options(options) == {"model": "m"}
    assert BackendSpec("vllm_serve", {**options, "max_concurrency": 2}).protocol_options() == {"model": "m"}
    assert BackendSpec("vllm", {"dtype": "half"}).protocol_options() == {"dtype": "half"}  # the default: all


@pytest.mark.slow
def test_a_frozen_server_fails_the_whole_job_within_the_deadline(tiny_server, caplog):
    from steer_hydra.evaluation import SteeringEval
    from steer_hydra.tasks import smoke_suite

    options = {"base_url": tiny_server.base_url, "request_timeout": 0.5, "request_deadline": 1.5, "retry_backoff": 0.05}
    tiny_server.reset()
    tiny_server.freeze()
    run = SteeringEval(
        {"baseline": []},
        "steer_hydra:tiny",
        [smoke_suite(limit=2, max_tokens=4)],
        backend=BackendSpec("vllm_serve", options),
        generate_defaults={"temperature": 0},
        seed=0,
        progress=False,
    )
    began = time.monotonic()
    try:
        with (
            caplog.at_level(logging.ERROR, logger="steer_hydra.backends.vllm.serve"),
            pytest.raises(Exception, match="eval_set failed|request_deadline"),
        ):
            run.run()
        elapsed, held = time.monotonic() - began, tiny_server.frozen_requests
    finally:
        tiny_server.reset()
    print(f"frozen server: job failed after {elapsed:.1f}s, {held} request(s) held")
    # Without the deadline and the give-up, every request of every task attempt would wait on the server
    # (3 tasks x 2 samples x 4 task attempts x 3 transport attempts); with them only the first wave does.
    assert 1 <= held <= 8 * 3, held
    assert elapsed < 1.5 + 240, f"the job took {elapsed:.0f}s to fail"  # the rest is Inspect's own overhead
    assert any("request_deadline=1.5s" in r.getMessage() for r in caplog.records)
