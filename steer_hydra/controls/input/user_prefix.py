"""UserPrefix: text placed before the user's message, inside the user turn; re-templated on text and token input.

How it runs: on chat input (`adapt_messages`, before the chat template) the text is joined in front of the user
message's content (the last user message, the first, or every one) with `separator`; other messages are left as
they are. On text or token input (`adapt`) each row is decoded without special tokens and encoded again as one user
turn holding the prefixed text, through the chat template when the tokenizer has one, else as plain text. A row's
prefix is `text`, or its own through the row-scoped `user_prefix` runtime kwarg. The tokenizer runs client-side, so
it runs on every backend; rows batch and refill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.input.retemplate import real_rows
from steer_hydra.core.controls import BaseArgs, InputControl, row_values
from steer_hydra.core.rendering import has_chat_template

USER_PREFIX = "user_prefix"


class UserPrefix(InputControl):
    """Put `text` before the user's message (an instruction, a persona line, a format request) in the user turn.

    Prompting is the baseline steering is measured against (AxBench, Wu et al., 2025, arXiv 2501.17148, found a
    prompt stating the concept stronger than representation steering), and a prompt's wording and format alone move
    results (Sclar et al., ICLR 2024, arXiv 2310.11324). Unlike `SystemPrompt`, the text lands in the user's own
    turn, which templates without a system role (and models that weigh the system turn little) still read.

    Args:
        text: the prefix (non-empty); a row's `user_prefix` runtime kwarg replaces it.
        separator: what joins the prefix and the message.
        turns: which user messages get it: `last` (the current question), `first` or `all`.

    Runtime kwarg `user_prefix` (row scope): one row's prefix (a string for every row, or one per row; None keeps
    `text`). On text or token input the prompt is re-templated as one user turn (see the module docstring).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        text: str
        separator: str = "\n\n"
        turns: Literal["last", "first", "all"] = "last"

        def validate(self) -> None:
            if not self.text.strip():
                raise ValueError(
                    "UserPrefix.text must be a non-empty string (the text to put before the user's message). "
                    "Fix: e.g. text='Answer in one sentence.'"
                )

    RUNTIME_KWARGS_SCHEMA = [
        {
            "name": USER_PREFIX,
            "type": "str",
            "required": False,
            "scope": "row",
            "help": "The prefix of this row's user message (replaces UserPrefix.text).",
        }
    ]
    supports_batching = True
    supports_refill = True

    text: str
    separator: str
    turns: str

    def prefixes(self, runtime_kwargs: Mapping[str, Any], batch: int) -> list[str]:
        """Each row's prefix: its `user_prefix` runtime kwarg, else `text`."""
        value = runtime_kwargs.get(USER_PREFIX)
        if value is None:
            return [self.text] * batch
        if isinstance(value, str):
            values: list[Any] = [value] * batch
        else:
            values = row_values(value, batch)
            if values is None and isinstance(value, (list, tuple)) and len(value) == 1:
                values = list(value) * batch
            if values is None or not all(v is None or isinstance(v, str) for v in values):
                raise TypeError(
                    f"UserPrefix: runtime kwarg {USER_PREFIX!r} must be a string, or one string (or None) per row "
                    f"({batch} rows); got {value!r}. Fix: pass the prefix text."
                )
        return [self.text if v is None else v for v in values]

    def adapt_messages(
        self, messages_batch: list[list[dict[str, str]]], runtime_kwargs: Mapping[str, Any]
    ) -> list[list[dict[str, str]]]:
        prefixes = self.prefixes(runtime_kwargs, len(messages_batch))
        return [self._prefixed(chat, prefix) for chat, prefix in zip(messages_batch, prefixes, strict=True)]

    def _prefixed(self, chat: list[dict[str, str]], prefix: str) -> list[dict[str, str]]:
        chat = [dict(m) for m in chat]
        users = [i for i, m in enumerate(chat) if m.get("role") == "user"]
        chosen = users if self.turns == "all" else users[-1:] if self.turns == "last" else users[:1]
        for i in chosen:
            chat[i]["content"] = prefix + self.separator + chat[i].get("content", "")
        return chat

    def adapt(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any]) -> list[list[int]]:
        rows = real_rows(input_ids, self.tokenizer)
        prefixes = self.prefixes(runtime_kwargs, len(rows))
        return [self._encode(prefix + self.separator + row) for row, prefix in zip(rows, prefixes, strict=True)]

    def _encode(self, user: str) -> list[int]:
        if has_chat_template(self.tokenizer):
            chat = [{"role": "user", "content": user}]
            encoded = self.tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=True
            )
            return list(encoded["input_ids"])
        return list(self.tokenizer(user)["input_ids"])
