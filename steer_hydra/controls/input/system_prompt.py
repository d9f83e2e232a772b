"""SystemPrompt: one leading system message (prepend, append or replace); re-templated on text/token input."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.input.retemplate import encode_with_system, merge_system, real_rows
from steer_hydra.core.controls import BaseArgs, InputControl


class SystemPrompt(InputControl):
    """Guarantee one leading system message holding `text`.

    On chat input, `prepend` puts `text` before an existing system message, `append` after it (joined by
    `separator`), `replace` substitutes it; with no system message every mode inserts one. On text or token
    input the row is decoded and re-templated with `text` as the system message, so every mode acts as replace.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        text: str
        mode: Literal["prepend", "append", "replace"] = "prepend"
        separator: str = "\n\n"

        def validate(self) -> None:
            if not self.text.strip():
                raise ValueError("SystemPrompt.text must be a non-empty string (the system message to insert).")

    supports_batching = True

    def adapt_messages(
        self, messages_batch: list[list[dict[str, str]]], runtime_kwargs: Mapping[str, Any]
    ) -> list[list[dict[str, str]]]:
        return [merge_system(chat, self.text, self.mode, self.separator) for chat in messages_batch]

    def adapt(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any]) -> list[list[int]]:
        return [
            encode_with_system(self.tokenizer, self.text, row, self.separator)
            for row in real_rows(input_ids, self.tokenizer)
        ]
