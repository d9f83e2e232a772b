"""Chat-template detection, plain rendering of conversations for tokenizers without a template, and the lock that
serialises encoding with one tokenizer across threads."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

_ENCODE_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_ENCODE_LOCKS_GUARD = threading.Lock()


def encode_lock(tokenizer: Any) -> threading.Lock:
    """The lock every encode with `tokenizer` holds when threads share it: a fast tokenizer keeps its padding and
    truncation settings as shared state that each call may reset, and two threads doing so at once fail with
    "Already borrowed". Decoding needs no lock."""
    with _ENCODE_LOCKS_GUARD:
        lock = _ENCODE_LOCKS.get(tokenizer)
        if lock is None:
            lock = _ENCODE_LOCKS[tokenizer] = threading.Lock()
        return lock


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` carries a chat template (decides the messages path vs the text path)."""
    return getattr(tokenizer, "chat_template", None) is not None


def render_messages(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """One conversation as text: through the chat template if there is one, else contents joined by blank lines."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n\n".join(str(m["content"]) for m in messages)
