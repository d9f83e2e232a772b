"""Chat-template detection and plain rendering of conversations for tokenizers without a template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` carries a chat template (decides the messages path vs the text path)."""
    return getattr(tokenizer, "chat_template", None) is not None


def render_messages(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """One conversation as text: through the chat template if there is one, else contents joined by blank lines."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n\n".join(str(m["content"]) for m in messages)
