"""Prompt highlighting for PASTA: the accepted forms of `substrings` and their token spans in a prompt row.

A span is found by decoding the row's real tokens (special tokens kept), locating the substring's first
occurrence in that text, and mapping its characters to tokens through the fast tokenizer's offset mapping
(re-encoding the decoded text). When re-encoding does not give back the same ids, the substring's own ids
(with and without a leading space) are searched in the row instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ACCEPTED_FORMS = (
    "a str (highlighted in every row), a list[list[str]] with one list per prompt row (its length is the batch "
    "size), or a flat list[str] at batch size 1"
)


def substrings_per_row(value: Any, batch_size: int) -> list[list[str]]:
    """Normalize the `substrings` runtime kwarg to one list of substrings per row, or raise naming the forms."""
    if isinstance(value, str):
        return [[value] for _ in range(batch_size)]
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value) and batch_size == 1:
            return [list(value)]
        if (
            len(value) == batch_size
            and value
            and all(isinstance(row, (list, tuple)) and all(isinstance(s, str) for s in row) for row in value)
        ):
            return [list(row) for row in value]
    hint = ""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        hint = (
            f" A flat list[str] is ambiguous at batch size {batch_size}: wrap it as [[...]] per row "
            "(also when n > 1 repeats a single prompt)."
        )
    elif isinstance(value, (list, tuple)):
        hint = f" Got a list of length {len(value)} for batch size {batch_size}."
    raise ValueError(f"PASTA runtime kwarg 'substrings' must be {ACCEPTED_FORMS}; got {_preview(value)}.{hint}")


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def token_spans(tokenizer: Any, row_ids: Sequence[int], substrings: Sequence[str]) -> tuple[list[range], list[str]]:
    """Token ranges (indices into `row_ids`) of each substring's first occurrence, and the substrings not found."""
    text = tokenizer.decode(list(row_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    faithful = list(encoded["input_ids"]) == list(row_ids)
    offsets = encoded["offset_mapping"] if faithful else None
    spans: list[range] = []
    missing: list[str] = []
    for substring in substrings:
        if not substring:
            continue
        span = _by_offsets(text, offsets, substring) if faithful else _by_ids(tokenizer, row_ids, substring)
        if span is None:
            missing.append(substring)
        else:
            spans.append(span)
    return spans, missing


def _by_offsets(text: str, offsets: Sequence[tuple[int, int]], substring: str) -> range | None:
    start = text.find(substring)
    if start < 0:
        return None
    end = start + len(substring)
    hit = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    return range(hit[0], hit[-1] + 1) if hit else None


def _by_ids(tokenizer: Any, row_ids: Sequence[int], substring: str) -> range | None:
    row = list(row_ids)
    for variant in (substring, " " + substring):
        ids = tokenizer(variant, add_special_tokens=False)["input_ids"]
        n = len(ids)
        if not n:
            continue
        for i in range(len(row) - n + 1):
            if row[i : i + n] == ids:
                return range(i, i + n)
    return None
