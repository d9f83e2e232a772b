"""FewShot: a system message with a directive and labeled positive/negative examples, selected per row."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.input.retemplate import encode_with_system, merge_system, real_rows
from steer_hydra.core.controls import BaseArgs, InputControl


class FewShot(InputControl):
    """In-context examples (Brown et al., 2020) drawn from a positive and a negative pool.

    Each row gets `k_positive` examples from the positive pool and `k_negative` from the negative pool,
    drawn with a `random.Random` seeded by `seed` and the row's own prompt text, so an arm is reproducible
    and a prompt gets the same examples whatever batch it lands in. The call-scoped runtime kwargs
    `positive_examples` / `negative_examples` replace the pool draws for every row. The block (directive,
    then the labeled examples) becomes the system message (after an existing system message's text).
    On text or token input the row is decoded and re-templated with the block as the system message.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        directive: str | None = None
        positive_example_pool: list[dict] | None = None
        negative_example_pool: list[dict] | None = None
        k_positive: int | None = None
        k_negative: int | None = None
        example_template: str = "Prompt: {prompt}\nResponse: {response}"
        seed: int = 0

        def validate(self) -> None:
            for polarity in ("positive", "negative"):
                pool = getattr(self, f"{polarity}_example_pool")
                k = getattr(self, f"k_{polarity}")
                if pool is not None and k is None:
                    raise ValueError(f"FewShot.k_{polarity} is required with {polarity}_example_pool.")
                if k is not None:
                    if pool is None:
                        raise ValueError(f"FewShot.k_{polarity} needs {polarity}_example_pool.")
                    if not 0 <= k <= len(pool):
                        raise ValueError(f"FewShot.k_{polarity}={k} must be in [0, {len(pool)}] (the pool size).")
                for example in pool or ():
                    try:
                        self.example_template.format(**example)
                    except KeyError as error:
                        raise ValueError(
                            f"FewShot.{polarity}_example_pool example {example!r} lacks field {error} used by "
                            f"example_template {self.example_template!r}."
                        ) from None

    RUNTIME_KWARGS_SCHEMA = [
        {
            "name": "positive_examples",
            "type": "list[dict]",
            "required": False,
            "scope": "call",
            "help": "Positive examples for every row of the call (replaces the pool draw).",
        },
        {
            "name": "negative_examples",
            "type": "list[dict]",
            "required": False,
            "scope": "call",
            "help": "Negative examples for every row of the call (replaces the pool draw).",
        },
    ]
    supports_batching = True

    def select(self, prompt: str, runtime_kwargs: Mapping[str, Any]) -> dict[str, list[dict]]:
        """The examples for one row, by polarity."""
        digest = hashlib.sha256(f"{self.seed}:{prompt}".encode()).hexdigest()
        rng = random.Random(digest)
        chosen: dict[str, list[dict]] = {}
        for polarity in ("positive", "negative"):
            given = runtime_kwargs.get(f"{polarity}_examples")
            if given is not None:
                chosen[polarity] = list(given)
            else:
                pool = getattr(self, f"{polarity}_example_pool") or []
                chosen[polarity] = rng.sample(pool, getattr(self, f"k_{polarity}") or 0)
        return chosen

    def block(self, prompt: str, runtime_kwargs: Mapping[str, Any]) -> str:
        """The directive and the labeled example blocks for one row."""
        parts = [self.directive] if self.directive else []
        for polarity, examples in self.select(prompt, runtime_kwargs).items():
            parts += [f"Example ({polarity}):\n{self.example_template.format(**e)}" for e in examples]
        return "\n\n".join(parts)

    def adapt_messages(
        self, messages_batch: list[list[dict[str, str]]], runtime_kwargs: Mapping[str, Any]
    ) -> list[list[dict[str, str]]]:
        adapted = []
        for chat in messages_batch:
            block = self.block(_last_user(chat), runtime_kwargs)
            adapted.append(merge_system(chat, block, "append", "\n\n") if block else [dict(m) for m in chat])
        return adapted

    def adapt(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any]) -> list[list[int]]:
        rows = []
        for text in real_rows(input_ids, self.tokenizer):
            block = self.block(text, runtime_kwargs)
            rows.append(encode_with_system(self.tokenizer, block, text) if block else self.tokenizer(text)["input_ids"])
        return rows


def _last_user(chat: Sequence[Mapping[str, str]]) -> str:
    users = [m.get("content", "") for m in chat if m.get("role") == "user"]
    return users[-1] if users else ""
