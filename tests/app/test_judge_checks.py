"""The judge's checks and bounds: a judge that cannot be made or reached is refused before any model loads, in one
line (bounded), every call to a network judge is bounded, the token budget is a config key, and an offline scripted
judge tries the path out."""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import socket
import threading
import time

import pytest
from inspect_ai._util.registry import registry_params

from steer_hydra.app import judge as judge_app
from steer_hydra.app.judge import SCRIPTED, JudgeOptions, judge_problems, probe_server, scripted_judge
from steer_hydra.app.plan import JobPlan
from steer_hydra.app.preflight import preflight
from steer_hydra.core.errors import ConfigError
from steer_hydra.tasks.judge import parse_rating

CONCEPT_JOB = ["model=tiny", "suite=concept_steering", "suite.limit=2", "logger=none", "progress=false"]


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def answering_url():
    """An HTTP server that answers every request with 404 (reachable, as a server that knows no /models is)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_probe_tells_a_closed_port_and_a_silent_socket_from_a_server_in_bounded_time(silent_port, answering_url):
    assert "ConnectionRefusedError" in probe_server("http://127.0.0.1:1/v1")
    started = time.monotonic()
    silent = probe_server(f"http://127.0.0.1:{silent_port}/v1", timeout=1.0)
    assert silent is not None and "gave no HTTP answer within 1s" in silent
    assert time.monotonic() - started < 1.0 + 2.0
    assert probe_server(answering_url) is None  # any HTTP answer, 404 included, means reachable


def _network_provider(monkeypatch) -> None:
    """Take the vllm provider as installed (its openai package may be missing here): only the server is checked."""
    monkeypatch.setattr(judge_app, "_provider_problem", lambda provider, judge, where: None)


def test_a_judge_whose_server_is_down_or_silent_is_refused_in_one_line(monkeypatch, silent_port, answering_url):
    _network_provider(monkeypatch)
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    (closed,) = judge_problems("vllm/judge-model", JudgeOptions(base_url="http://me:pw123@127.0.0.1:1/v1"))
    assert closed.startswith("judge=vllm/judge-model: its server http://me:***@127.0.0.1:1/v1 (judge_options.base_url)")
    assert "ConnectionRefusedError" in closed and "Fix: start the server" in closed and "pw123" not in closed
    monkeypatch.setattr(judge_app, "PROBE_TIMEOUT", 1.0)
    monkeypatch.setenv("VLLM_BASE_URL", f"http://127.0.0.1:{silent_port}/v1")
    started = time.monotonic()
    (silent,) = judge_problems("vllm/judge-model")
    assert "(VLLM_BASE_URL) gave no HTTP answer within 1s" in silent and time.monotonic() - started < 3.0
    monkeypatch.setenv("VLLM_BASE_URL", answering_url)
    assert judge_problems("vllm/judge-model") == []
    monkeypatch.delenv("VLLM_BASE_URL")
    (unnamed,) = judge_problems("vllm/judge-model")  # Inspect would start vLLM inside the job
    assert "no server is named" in unnamed and "judge_options.base_url=http://HOST:PORT/v1" in unnamed


@pytest.mark.parametrize(
    ("judge", "expected"),
    [
        ("gpt4", "names no model"),
        ("nosuchprovider/model", "Inspect has no model provider 'nosuchprovider'"),
        ("mockllm/model", f"Fix: judge={SCRIPTED}"),
        ("steer_hydra/no_such_option", "not an option of the model group"),
        ("hf/no-such-org/no-such-model-xyz", "judge=hf/no-such-org/no-such-model-xyz (the Hub id"),
    ],
)
def test_a_judge_that_cannot_be_made_is_named_with_the_fix(judge, expected, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = judge_problems(judge)
    assert expected in problem and "Fix:" in problem


@pytest.mark.skipif(importlib.util.find_spec("openai") is not None, reason="the openai package is installed here")
def test_a_missing_provider_package_is_named_before_any_model_loads(compose_cfg, tmp_path):
    cfg = compose_cfg([*CONCEPT_JOB, f"output_root={tmp_path}", "judge=openai/gpt-4o-mini"])
    with pytest.raises(ConfigError, match=r"judge=openai/gpt-4o-mini: OpenAI API requires .* pip install openai"):
        preflight(cfg)


def test_preflight_refuses_a_bad_judge_and_bad_judge_options_in_one_line(compose_cfg, tmp_path):
    with pytest.raises(ConfigError) as refused:
        preflight(compose_cfg([*CONCEPT_JOB, f"output_root={tmp_path}", "judge=mockllm/model"]))
    assert "\n" not in str(refused.value) and "judge=mockllm/model" in str(refused.value)
    with pytest.raises(ConfigError, match=r"judge_options.max_retries=-1 must be an integer >= 0"):
        preflight(
            compose_cfg([*CONCEPT_JOB, f"output_root={tmp_path}", f"judge={SCRIPTED}", "judge_options.max_retries=-1"])
        )
    preflight(compose_cfg([*CONCEPT_JOB, f"output_root={tmp_path}", f"judge={SCRIPTED}"]))  # passes


def test_every_call_to_a_network_judge_is_bounded_and_the_budget_is_a_config_key(compose_cfg, tmp_path):
    overrides = [*CONCEPT_JOB, f"output_root={tmp_path}", "judge_options.max_tokens=64", "judge_options.max_retries=1"]
    network = JobPlan.from_config(compose_cfg([*overrides, f"judge={SCRIPTED}"]))
    scorer = network._judging()["scorers"]["steer_hydra/concept_steering"][0]
    # the scripted judge runs in this process: the budget, no call bounds
    assert registry_params(scorer) == {"max_tokens": 64}
    assert JudgeOptions(max_retries=1).scorer_args("openai/gpt-4o-mini") == {
        "max_tokens": 512,
        "timeout": 400,
        "attempt_timeout": 120,
        "max_retries": 1,
    }
    assert JudgeOptions().scorer_args("steer_hydra/smollm2") == {"max_tokens": 512}


def test_the_scripted_judge_answers_offline_in_the_format_and_the_same_way_twice():
    model = scripted_judge()
    assert str(model) == SCRIPTED
    first = asyncio.run(model.generate("Rate this text."))
    second = asyncio.run(model.generate("Rate this text."))
    assert parse_rating(first.completion) in (0, 1, 2) and first.completion == second.completion
    ratings = {parse_rating(asyncio.run(model.generate(f"text {i}")).completion) for i in range(12)}
    assert ratings == {0, 1, 2}
