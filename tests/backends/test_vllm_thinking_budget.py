"""ThinkingBudget on a real vLLM engine (backend=vllm): the same driver gives the same tokens and the same budget
structure (thinking tokens, waits, forced closes) as on Hugging Face for greedy decoding. One engine for the module.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from vllm_real import CHATS, ENGINE_OPTIONS, MIN_AGREEMENT, TINY64, agreement, rows, steered

from steer_hydra.controls.output import ThinkingBudget
from steer_hydra.core import BackendSpec

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

MAX_NEW_TOKENS = 48
# "Calm" is a token the tiny64 model writes while thinking: a close tag it emits on its own (early in one row,
# past the floor in another), so the floor's wait string and a model-written close both happen
CONFIGS = {
    "cap": {"max_thinking_tokens": 6, "answer_prefix": " answer:"},
    "floor_and_cap": {
        "tags": ["<think>", "Calm"],
        "min_thinking_tokens": 10,
        "max_thinking_tokens": 30,
        "max_waits": 2,
    },
}


def _drivers() -> list[ThinkingBudget]:
    return [ThinkingBudget(**kwargs, enabled=i == 0) for i, kwargs in enumerate(CONFIGS.values())]


@pytest.fixture(scope="module")
def pipelines():
    """The driver pair (one enabled at a time) on Hugging Face and on an offline vLLM engine."""
    with ExitStack() as stack:
        hf = stack.enter_context(steered(TINY64, _drivers()))
        engine = stack.enter_context(steered(TINY64, _drivers(), BackendSpec("vllm", ENGINE_OPTIONS)))
        yield hf, engine


def _run(pipeline, config: str) -> tuple[list, ThinkingBudget]:
    drivers = pipeline.output_controls
    for driver, name in zip(drivers, CONFIGS, strict=True):
        driver.enabled = name == config
    outputs = pipeline.generate(messages=CHATS, max_new_tokens=MAX_NEW_TOKENS, return_output=True)
    return outputs, next(d for d in drivers if d.enabled)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_budget_forcing_on_vllm_gives_the_hugging_face_tokens_and_structure(pipelines, config, record_property):
    hf, engine = pipelines
    expected, hf_driver = _run(hf, config)
    served, engine_driver = _run(engine, config)
    assert agreement(f"thinking_budget {config}", rows(hf, expected), rows(engine, served), record_property) >= (
        MIN_AGREEMENT
    )
    assert engine_driver.last_budgets == hf_driver.last_budgets
    assert [o.finish_reasons for o in served] == [o.finish_reasons for o in expected]
    budgets = engine_driver.last_budgets
    assert all(b.new_tokens <= MAX_NEW_TOKENS for b in budgets)
    if config == "cap":
        assert {(b.thinking_tokens, b.forced_close) for b in budgets} == {(6, True)}
    else:  # every path of the floor and the cap is taken by some row
        assert any(b.waits for b in budgets)
        assert any(b.closed and not b.forced_close for b in budgets)
        assert any(b.forced_close and b.thinking_tokens == 30 for b in budgets)
