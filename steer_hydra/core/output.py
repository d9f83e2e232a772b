"""The pipeline's result object, finish-reason inference and the stop-string truncation rule."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from steer_hydra.core.tensors import strip_trailing

FinishReason = Literal["stop", "eos", "length"]
FINISH_REASONS: tuple[str, ...] = ("stop", "eos", "length")


@dataclass(slots=True)
class Output:
    """What one `generate(..., return_output=True)` call produced for one prompt (or one returned row).

    Attributes:
        output_ids: `[rows, seq]` continuation ids exactly as generated (stop text kept; trailing pads possible).
        adapted_input_ids: `[1, prompt_len]` the prompt after input controls, left-packed; None if unknown.
        finish_reasons: one of `FINISH_REASONS` (or None) per row.
        generated_tokens: every token a decoding driver rolled out for these rows (discarded candidates
            included); None on the driverless path.
    """

    output_ids: torch.Tensor
    adapted_input_ids: torch.Tensor | None
    finish_reasons: list[FinishReason | None]
    generated_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.output_ids.dim() != 2:
            raise ValueError(f"Output.output_ids must be 2-D [rows, seq]; got shape {tuple(self.output_ids.shape)}.")
        if len(self.finish_reasons) != self.output_ids.shape[0]:
            raise ValueError(
                f"Output.finish_reasons has {len(self.finish_reasons)} entries for {self.output_ids.shape[0]} rows."
            )

    @property
    def finish_reason(self) -> FinishReason | None:
        """The first row's finish reason (for single-row use)."""
        return self.finish_reasons[0] if self.finish_reasons else None

    def decode(self, tokenizer) -> list[str]:
        """Decode each row with `skip_special_tokens=True`; ids are not modified."""
        return [tokenizer.decode(row, skip_special_tokens=True) for row in self.output_ids.tolist()]


def truncate_at_stop_strings(text: str, stop_strings: Iterable[str] | None) -> str:
    """Cut `text` at the earliest occurrence of any stop string (the one client-side rule on every backend)."""
    cut = len(text)
    for stop in stop_strings or ():
        if stop:
            index = text.find(stop)
            if index != -1:
                cut = min(cut, index)
    return text[:cut]


def infer_finish_reasons(
    continuations: torch.Tensor,
    tokenizer,
    *,
    max_new_tokens: int | None,
    stop_strings: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    eos_token_ids: Sequence[int] = (),
) -> list[FinishReason | None]:
    """Classify each continuation row as `stop`, `eos`, `length` or None (see the spec's rule order)."""
    pad = tokenizer.pad_token_id
    stops, eos = set(stop_token_ids), set(eos_token_ids)
    reasons: list[FinishReason | None] = []
    for raw in continuations.tolist():
        ids, stripped = strip_trailing(raw, pad)
        last = ids[-1] if ids else None
        text = tokenizer.decode(ids, skip_special_tokens=True) if stop_strings else ""
        if last is not None and (last in stops or any(s and s in text for s in stop_strings)):
            reasons.append("stop")
        elif last is not None and last in eos:
            reasons.append("eos")
        elif max_new_tokens is not None and len(ids) >= max_new_tokens:
            reasons.append("length")
        elif stripped and pad in eos:
            reasons.append("eos")
        else:
            reasons.append(None)
    return reasons
