"""Fixtures for the decoding-driver tests: a recording `model.generate`, recording scorers, step controls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from transformers import LogitsProcessor

from steer_hydra.core import OutputControl, StateControl


class RecordingScorer:
    """A sequence scorer that applies `score(text)` to each continuation and records every call."""

    def __init__(self, score):
        self.score = score
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []

    def __call__(self, prompt: str, continuations: list[str], params: Mapping[str, Any]) -> list[float]:
        self.calls.append((prompt, list(continuations), dict(params)))
        return [self.score(text) for text in continuations]

    @property
    def seen(self) -> list[tuple[str, float]]:
        """Every (continuation, score) the scorer was shown, in order."""
        return [(text, self.score(text)) for _, texts, _ in self.calls for text in texts]


class _Ban(LogitsProcessor):
    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, self.token_id] = -float("inf")
        return scores


class _ForceAfter(LogitsProcessor):
    def __init__(self, token_id: int, prompt_len: int, after: int) -> None:
        self.token_id, self.prompt_len, self.after = token_id, prompt_len, after

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] - self.prompt_len < self.after:
            return scores
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.token_id] = 0.0
        return forced


class BanToken(OutputControl):
    """Test output control: never emit `token_id` (e.g. the pad id, so counts are unambiguous)."""

    def __init__(self, token_id: int) -> None:
        super().__init__()
        self.token_id = token_id

    def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs) -> list:
        return [_Ban(self.token_id)]


class ForceTokenAfter(OutputControl):
    """Test output control: emit `token_id` once `after` tokens follow the original prompt."""

    def __init__(self, token_id: int, after: int) -> None:
        super().__init__()
        self.token_id, self.after = token_id, after

    def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs) -> list:
        return [_ForceAfter(self.token_id, input_ids.shape[1], self.after)]


class CountingHook(StateControl):
    """Test state control: a forward hook on the first decoder layer that counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.built = 0

    def get_hooks(self, input_ids, runtime_kwargs, **kwargs):
        self.built += 1

        def hook(module, args, kwargs, output):
            self.calls += 1
            return output

        return {"forward": [{"module": "model.layers.0", "hook_func": hook}]}


@pytest.fixture
def recording_scorer():
    return RecordingScorer


@pytest.fixture
def step_controls():
    return {"ban": BanToken, "force_after": ForceTokenAfter, "counting_hook": CountingHook}


@pytest.fixture
def record_generate(monkeypatch):
    """`record_generate(model, on_call=None)` -> a list of `{"kwargs", "input_ids", "sequences"}` per generate call.

    `on_call(phase)` is called with "before"/"after" around each call (e.g. to read a hook counter).
    """

    def install(model, on_call=None):
        calls: list[dict[str, Any]] = []
        original = model.generate

        def generate(*args, **kwargs):
            if on_call:
                on_call("before")
            sequences = original(*args, **kwargs)
            if on_call:
                on_call("after")
            calls.append({"kwargs": kwargs, "input_ids": kwargs["input_ids"], "sequences": sequences})
            return sequences

        monkeypatch.setattr(model, "generate", generate)
        return calls

    return install


def rolled_out_tokens(calls, pad_token_id: int) -> int:
    """Tokens a list of recorded generate calls produced: each row's new tokens up to its trailing pads."""
    total = 0
    for call in calls:
        new = call["sequences"][:, call["input_ids"].shape[1] :]
        for row in new.tolist():
            while row and row[-1] == pad_token_id:
                row.pop()
            total += len(row)
    return total


@pytest.fixture
def count_rolled_out():
    return rolled_out_tokens
