"""A second model beside the pipeline's during a call (an amateur, a reward model): its KV cache over the call's rows,
the call's rows as a batch, and its release."""

from __future__ import annotations

import gc
import inspect
from collections.abc import Mapping
from typing import Any

import torch


def cache_key(module: torch.nn.Module) -> str:
    """The name of `module`'s KV-cache argument and output field (transformers 5.24 renamed `past_key_values` to
    `cache`)."""
    return "cache" if "cache" in inspect.signature(type(module).forward).parameters else "past_key_values"


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: every real token counts from 0; pads sit at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def call_rows(input_ids: Any, kwargs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A call's prompt ids and `attention_mask` (from `get_logits_processors`' kwargs) as `[rows, seq]` tensors."""
    ids = torch.as_tensor(input_ids)
    mask = kwargs.get("attention_mask")
    mask = None if mask is None else torch.as_tensor(mask)
    ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
    return ids, (mask.unsqueeze(0) if mask is not None and mask.dim() == 1 else mask)


def release(device: torch.device) -> None:
    """Free the memory of an auxiliary model that was on `device` (the caller has dropped its last reference)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def prompt_mask_for(
    ids: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, pad_token_id: int | None = None
) -> torch.Tensor:
    """Attention mask of `ids` (rows of a call, possibly repeated per row): the call's prompt mask where a row starts
    with its prompt row; elsewhere (a driver's rollout re-packed with its own left padding) every leading
    `pad_token_id` masked, the rest ones."""
    mask = torch.ones_like(ids)
    same = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    batch, length = prompt_ids.shape
    if ids.shape[1] >= length and ids.shape[0] % batch == 0:
        repeat = ids.shape[0] // batch
        prompt = prompt_ids.to(ids.device).repeat_interleave(repeat, 0)
        same = (ids[:, :length] == prompt).all(dim=1)
        mask[same, :length] = prompt_mask.to(ids.device).repeat_interleave(repeat, 0)[same]
    if pad_token_id is not None:
        leading = (ids == pad_token_id).long().cumprod(dim=1).bool()
        mask[~same[:, None] & leading] = 0
    return mask


class PrefixCache:
    """A model's KV cache over the sequences of one call's rows, advanced as the decode adds tokens.

    Built on the call's prompt ids and mask (left-padded rows). `advance(ids)` brings the cache to `ids`: it runs
    the model on the tokens added since the last call (positions and attention mask from the prompt mask, every
    generated token counting), or prefills again when `ids` do not extend what it holds (a driver's new rollout,
    beams reordered), with the prompt mask where the rows start with the call's prompt rows and, elsewhere, leading
    `pad_token_id`s masked (a driver re-packs its rollouts with left padding of its own).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        pad_token_id: int | None = None,
    ) -> None:
        self.model = model
        self.prompt_ids = prompt_ids
        self.prompt_mask = torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask.to(prompt_ids.device)
        self.pad_token_id = pad_token_id
        self.key = cache_key(model)
        self.seen: torch.Tensor | None = None  # the ids the cache holds
        self.mask: torch.Tensor | None = None  # their attention mask
        self.cache: Any = None
        self.output: Any = None  # the model's output on the last tokens run

    @torch.no_grad()
    def advance(self, ids: torch.Tensor) -> Any:
        """Bring the cache to `ids`; returns the model's output on the tokens it ran (the last one's when `ids` are
        what it holds already)."""
        seen = self.seen
        if seen is not None and torch.equal(ids, seen):
            return self.output
        if seen is not None and ids.shape[0] == seen.shape[0] and ids.shape[1] > seen.shape[1]:
            extends = torch.equal(ids[:, : seen.shape[1]], seen)
        else:
            extends = False
        if extends:
            new = ids[:, seen.shape[1] :]
            mask = torch.cat([self.mask, torch.ones_like(new)], dim=1)
        else:
            self.cache = None
            new, mask = ids, prompt_mask_for(ids, self.prompt_ids, self.prompt_mask, self.pad_token_id)
        self.output = self.model(
            input_ids=new,
            attention_mask=mask,
            position_ids=positions(mask)[:, -new.shape[1] :],
            use_cache=True,
            **{self.key: self.cache},
        )
        self.cache, self.seen, self.mask = getattr(self.output, self.key), ids, mask
        return self.output
