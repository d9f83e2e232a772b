"""Splitting a reasoning ("thinking") channel from the answer, on decoded text or on token ids.

Two modes:

- `text`: the decoded continuation (special tokens skipped) is cut at the earliest stop string, then split at
  the *last* close tag; one leading open tag is dropped from the thinking and the answer is left-stripped.
- `tokens`: for tags that do not survive a decode with `skip_special_tokens=True` (special-token tags), the ids
  are split by first-occurrence subsequence search and each segment is decoded on its own. Ids before the open
  tag join the answer; only the answer is cut at stop strings (the reasoning is kept verbatim).

`resolve_split_mode` picks the mode for a tokenizer and a tag pair ("auto": text when both tags round-trip
through encode/decode, tokens otherwise). A split reports whether the channel was closed, so the caller can
warn about rows that opened a thinking channel and never closed it (usually a too-small `max_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from steer_hydra.core.output import truncate_at_stop_strings
from steer_hydra.core.tensors import strip_trailing

DEFAULT_THINK_TAGS: tuple[str, str] = ("<think>", "</think>")
SPLIT_MODES: tuple[str, ...] = ("auto", "text", "tokens")
SplitMode = Literal["text", "tokens"]


@dataclass(frozen=True, slots=True)
class ThinkingSplit:
    """One row split into its reasoning and its answer.

    Attributes:
        reasoning: The thinking text (whitespace-stripped).
        answer: The answer text (left-stripped; "" when the channel never closed).
        closed: False when a thinking channel opened (or was open from the start) and never closed.
    """

    reasoning: str
    answer: str
    closed: bool = True


def find_subsequence(sequence: Sequence[int], pattern: Sequence[int], start: int = 0) -> int:
    """Index of the first occurrence of `pattern` in `sequence` at or after `start`, or -1.

    Raises:
        ValueError: If `pattern` is empty (an empty tag matches everywhere and splits nothing).
    """
    pattern = list(pattern)
    if not pattern:
        raise ValueError("Cannot search for an empty id sequence; a reasoning tag must encode to at least one id.")
    sequence = list(sequence)
    width = len(pattern)
    first = pattern[0]
    for index in range(max(0, start), len(sequence) - width + 1):
        if sequence[index] == first and sequence[index : index + width] == pattern:
            return index
    return -1


def split_thinking(
    text: str,
    tags: tuple[str, str] = DEFAULT_THINK_TAGS,
    *,
    opened_at_start: bool = False,
    stop_strings: Sequence[str] = (),
) -> ThinkingSplit | None:
    """Split decoded `text` into reasoning and answer (text mode); None when there is nothing to split.

    The text is cut at the earliest stop string first. With a close tag, the split is at the last one. With
    only an open tag, everything after it is (unclosed) reasoning and the answer is what came before it
    (usually ""). With neither tag, all text is (unclosed) reasoning when `opened_at_start` is set (a template
    that opens the channel in the prompt), else None.
    """
    open_tag, close_tag = tags
    text = truncate_at_stop_strings(text, stop_strings)
    close_at = text.rfind(close_tag)
    if close_at != -1:
        thinking = text[:close_at]
        stripped = thinking.lstrip()
        if stripped.startswith(open_tag):
            thinking = stripped[len(open_tag) :]
        return ThinkingSplit(thinking.strip(), text[close_at + len(close_tag) :].lstrip(), closed=True)
    open_at = text.find(open_tag)
    if open_at != -1:
        return ThinkingSplit(text[open_at + len(open_tag) :].strip(), text[:open_at].strip(), closed=False)
    if opened_at_start:
        return ThinkingSplit(text.strip(), "", closed=False)
    return None


def split_thinking_ids(
    ids: Sequence[int],
    tokenizer: Any,
    tag_ids: tuple[Sequence[int], Sequence[int]],
    *,
    opened_at_start: bool = False,
    stop_strings: Sequence[str] = (),
) -> ThinkingSplit | None:
    """Split one row of continuation ids (tokens mode); None when neither tag occurs and nothing opened.

    Trailing pad ids are ignored. Each segment is decoded with `skip_special_tokens=True` and whitespace-stripped;
    the ids before the open tag join the answer, and only the answer is cut at stop strings.
    """
    open_ids, close_ids = list(tag_ids[0]), list(tag_ids[1])
    row, _ = strip_trailing(ids, getattr(tokenizer, "pad_token_id", None))
    open_at = find_subsequence(row, open_ids)
    if open_at != -1:
        before, reasoning_start = row[:open_at], open_at + len(open_ids)
    elif opened_at_start or find_subsequence(row, close_ids) != -1:
        before, reasoning_start = [], 0
    else:
        return None
    close_at = find_subsequence(row, close_ids, reasoning_start)
    if close_at == -1:
        reasoning = _decode(tokenizer, row[reasoning_start:])
        answer = truncate_at_stop_strings(_decode(tokenizer, before), stop_strings)
        return ThinkingSplit(reasoning.strip(), answer.strip(), closed=False)
    reasoning = _decode(tokenizer, row[reasoning_start:close_at])
    answer = truncate_at_stop_strings(_decode(tokenizer, before + row[close_at + len(close_ids) :]), stop_strings)
    return ThinkingSplit(reasoning.strip(), answer.strip(), closed=True)


def tag_token_ids(tokenizer: Any, tags: tuple[str, str]) -> tuple[list[int], list[int]]:
    """Encode both tags without special tokens.

    Raises:
        ValueError: If a tag encodes to an empty id sequence.
    """
    encoded = []
    for tag in tags:
        ids = list(tokenizer.encode(tag, add_special_tokens=False))
        if not ids:
            raise ValueError(
                f"Reasoning tag {tag!r} encodes to an empty id sequence with this tokenizer, so it cannot be "
                "found in generated ids. Fix: set ProviderOptions.reasoning_tags to tags the tokenizer encodes, "
                "or reasoning_tags=None to disable the split."
            )
        encoded.append(ids)
    return encoded[0], encoded[1]


def tags_round_trip(tokenizer: Any, tags: tuple[str, str]) -> bool:
    """Whether both tags survive encode(add_special_tokens=False) then decode(skip_special_tokens=True)."""
    return all(
        tokenizer.decode(tokenizer.encode(tag, add_special_tokens=False), skip_special_tokens=True) == tag
        for tag in tags
    )


def resolve_split_mode(
    tokenizer: Any, tags: tuple[str, str] | None, mode: str = "auto"
) -> tuple[SplitMode | None, tuple[list[int], list[int]] | None]:
    """Pick the split mode and, for tokens mode, the tag ids.

    Returns `(None, None)` when `tags` is None (no split). An explicit "text" or "tokens" wins; "auto" picks
    "text" when both tags round-trip through the tokenizer and "tokens" otherwise (special-token tags).

    Raises:
        ValueError: If `mode` is unknown, or (auto and tokens modes) a tag encodes to no ids.
    """
    if mode not in SPLIT_MODES:
        raise ValueError(f"reasoning_split must be one of {SPLIT_MODES}; got {mode!r}.")
    if tags is None:
        return None, None
    if mode == "text":
        return "text", None
    tag_ids = tag_token_ids(tokenizer, tags)
    if mode == "auto" and tags_round_trip(tokenizer, tags):
        return "text", None
    return "tokens", tag_ids


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True) if ids else ""
