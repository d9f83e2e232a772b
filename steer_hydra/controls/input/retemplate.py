"""The token-level fallback shared by input controls: decode a row, rebuild the prompt, re-encode it."""

from __future__ import annotations

from typing import Any

import torch

from steer_hydra.core.rendering import has_chat_template


def real_rows(input_ids: torch.Tensor, tokenizer: Any) -> list[str]:
    """Decode each left-padded row to text without special tokens (template whitespace stripped)."""
    return [text.strip() for text in tokenizer.batch_decode(input_ids, skip_special_tokens=True)]


def encode_with_system(tokenizer: Any, system: str, user: str, separator: str = "\n\n") -> list[int]:
    """Ids of `user` under `system`: a templated [system, user] chat, or `system + separator + user` without one."""
    if has_chat_template(tokenizer):
        chat = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        encoded = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    return list(tokenizer(system + separator + user)["input_ids"])


def merge_system(chat: list[dict[str, str]], text: str, mode: str, separator: str) -> list[dict[str, str]]:
    """A copy of `chat` with exactly one leading system message carrying `text` (prepend/append/replace)."""
    chat = [dict(m) for m in chat]
    if chat and chat[0].get("role") == "system":
        existing = chat[0].get("content", "")
        if mode == "prepend":
            content = text + separator + existing
        elif mode == "append":
            content = existing + separator + text
        else:
            content = text
        chat[0]["content"] = content
    else:
        chat.insert(0, {"role": "system", "content": text})
    return chat
