"""Token-id helpers shared by the pipeline, backends and controls: left/right padding, trailing pads, eos ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def left_pack(ids: torch.Tensor, mask: torch.Tensor, pad_token_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to the right end (pads first), keeping their order; drop all-pad columns."""
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)
    ids, mask = ids.gather(1, order), mask.gather(1, order)
    if pad_token_id is not None:
        ids = ids.masked_fill(mask == 0, pad_token_id)
    return trim_left(ids, mask)


def trim_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop leading columns that are padding in every row."""
    real = mask.any(dim=0).nonzero()
    start = int(real[0]) if real.numel() else ids.shape[1]
    return ids[:, start:], mask[:, start:]


def pad_left(rows: Sequence[Sequence[int]], pad_token_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ragged rows, left-padded with the pad id."""
    width = max(len(r) for r in rows)
    pad = 0 if pad_token_id is None else pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def pad_right(pieces: Sequence[torch.Tensor], pad_token_id: int | None) -> torch.Tensor:
    """Concatenate row blocks of different widths, right-padded with the pad id."""
    width = max(p.shape[1] for p in pieces)
    pad = 0 if pad_token_id is None else pad_token_id
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad) for p in pieces], dim=0)


def strip_trailing(row: Sequence[int], pad_token_id: int | None) -> tuple[list[int], bool]:
    """Drop trailing pad ids from `row`; return the row and whether anything was dropped."""
    ids = list(row)
    if pad_token_id is None:
        return ids, False
    end = len(ids)
    while end and ids[end - 1] == pad_token_id:
        end -= 1
    return ids[:end], end != len(ids)


def eos_ids(*values: Any) -> list[int]:
    """The distinct eos ids, in order, of `values`: ids, lists of ids (a generation config's) or None."""
    ids: list[int] = []
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and int(item) not in ids:
                ids.append(int(item))
    return ids
