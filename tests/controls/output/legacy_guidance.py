"""The logits processors of ContrastiveDecoding and RewardGuidedDecoding as they were at commit 861f3f9, before both
became configurations of ContrastiveGuidance and ValueGuidance: kept verbatim (their step arithmetic and caching) so
`test_guidance_refactor.py` can compare the old and the new code paths side by side, step by step.

Test-only; nothing in the package imports it.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Iterator
from typing import Any

import torch

from steer_hydra.controls.output.auxiliary import PrefixCache, prompt_mask_for


def contrastive_scores(
    expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float, amateur_temperature: float = 1.0
) -> torch.Tensor:
    """`log p_exp - log p_ama` on tokens with `p_exp >= alpha * max p_exp`, `-inf` elsewhere (the CD objective)."""
    expert = torch.log_softmax(expert_logits.float(), dim=-1)
    amateur = torch.log_softmax(amateur_logits.float() / amateur_temperature, dim=-1)
    cutoff = expert.max(dim=-1, keepdim=True).values + math.log(alpha)
    scores = expert - amateur
    return scores.masked_fill(expert < cutoff, -float("inf")).to(expert_logits.dtype)


class ContrastiveLogitsProcessor:
    """One call's contrastive step: the amateur runs incrementally beside the expert with its own KV cache (a
    `PrefixCache` over the call's rows: prefilled again when the sequences do not extend the ones it holds)."""

    def __init__(
        self,
        amateur: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        alpha: float,
        amateur_temperature: float = 1.0,
        pad_token_id: int | None = None,
    ) -> None:
        self.amateur = PrefixCache(amateur, prompt_ids, prompt_mask, pad_token_id)
        self.alpha, self.amateur_temperature = alpha, amateur_temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        amateur_logits = self.amateur.advance(input_ids).logits[:, -1, :]
        if amateur_logits.shape[-1] != scores.shape[-1]:
            raise RuntimeError(
                f"ContrastiveDecoding: the amateur scores {amateur_logits.shape[-1]} tokens, the model "
                f"{scores.shape[-1]}. Fix: pick an amateur that shares the model's tokenizer (amateur=...)."
            )
        return contrastive_scores(scores, amateur_logits.to(scores.device), self.alpha, self.amateur_temperature)


HEAD_NAME = "score"  # the head of transformers' decoder *ForSequenceClassification models (Llama, GPT-2, Qwen...)


def reward_from_logits(logits: torch.Tensor, label: int | None) -> torch.Tensor:
    """`[N, C]` head logits -> `[N]` rewards in [0, 1]: the probability of class `label` (default: the last class),
    or the sigmoid of the single logit of a one-output head."""
    logits = logits.float()
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[:, 0])
    return torch.softmax(logits, dim=-1)[:, -1 if label is None else label]


def decoder_parts(reward: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """`(trunk, head)` of a decoder sequence classifier (its base model, which takes a KV cache, and its `score`
    head applied per position), or None for other classifiers (encoders pool their own way)."""
    trunk, head = getattr(reward, "base_model", None), getattr(reward, HEAD_NAME, None)
    if trunk is None or trunk is reward or not isinstance(head, torch.nn.Linear):
        return None
    if "use_cache" not in inspect.signature(type(trunk).forward).parameters:
        return None
    return trunk, head


def _expanded(cache: Any, rows: torch.Tensor | None, repeats: int) -> Any:
    """A copy of `cache` holding `rows` (all when None), each repeated `repeats` times; `cache` is left as it is."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    if rows is not None:
        out.batch_select_indices(rows)
    out.batch_repeat_interleave(repeats)
    return out


class RewardLogitsProcessor:
    """One call's RAD step: top-k candidates of every row scored by the reward model, then `score + beta * reward`.

    Built on the call's prompt ids and mask (left-padded rows). With `tokenizers=None` the reward model reads the
    model's token ids and keeps a KV cache over the prefixes (a decoder classifier); with `(model_tokenizer,
    reward_tokenizer)` each candidate sequence is decoded (special tokens skipped), re-tokenized and scored by the
    reward model's own forward, without a cache.
    `reward_batch_size` caps the candidate rows of one reward-model forward (None: all at once).
    """

    def __init__(
        self,
        reward: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        *,
        beta: float,
        top_k: int,
        label: int | None = None,
        reward_batch_size: int | None = None,
        tokenizers: tuple[Any, Any] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.reward = reward
        parts = decoder_parts(reward) if tokenizers is None else None
        if tokenizers is None and parts is None:
            raise ValueError(
                f"RewardLogitsProcessor: a {type(reward).__name__} has no cacheable trunk and `{HEAD_NAME}` head. "
                "Fix: pass tokenizers=(model_tokenizer, reward_tokenizer) to score re-tokenized text."
            )
        self.trunk, self.head = parts if parts is not None else (None, None)
        self.device = next(reward.parameters()).device
        self.prompt_ids = prompt_ids
        self.prompt_mask = torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask.to(prompt_ids.device)
        self.beta, self.top_k, self.label = beta, top_k, label
        self.reward_batch_size = reward_batch_size
        self.tokenizers = tokenizers
        self.pad_token_id = pad_token_id  # leading pads of a driver's re-packed rollout are masked
        self.prefix = PrefixCache(self.trunk, prompt_ids, prompt_mask, pad_token_id) if self.trunk is not None else None

    def _row_chunks(self, rows: int, k: int) -> Iterator[slice]:
        step = rows if self.reward_batch_size is None else max(1, self.reward_batch_size // k)
        for start in range(0, rows, step):
            yield slice(start, min(rows, start + step))

    def _cached_rewards(self, ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        prefix = self.prefix
        prefix.advance(ids)
        batch, k = candidates.shape
        rewards = []
        for rows in self._row_chunks(batch, k):
            n = rows.stop - rows.start
            index = None if n == batch else torch.arange(rows.start, rows.stop, device=self.device)
            mask = prefix.mask[rows]
            out = self.trunk(
                input_ids=candidates[rows].reshape(n * k, 1),
                attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1).repeat_interleave(k, 0),
                position_ids=mask.sum(-1, keepdim=True).repeat_interleave(k, 0),
                use_cache=True,
                **{prefix.key: _expanded(prefix.cache, index, k)},
            )
            rewards.append(reward_from_logits(self.head(out.last_hidden_state[:, -1]), self.label))
        return torch.cat(rewards).view(batch, k)

    def _text_rewards(self, ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        model_tokenizer, reward_tokenizer = self.tokenizers
        mask = prompt_mask_for(ids, self.prompt_ids, self.prompt_mask, self.pad_token_id).bool()
        batch, k = candidates.shape
        texts = [
            model_tokenizer.decode(torch.cat([row[keep], candidate.view(1)]).tolist(), skip_special_tokens=True)
            for row, keep, options in zip(ids.cpu(), mask.cpu(), candidates.cpu(), strict=True)
            for candidate in options
        ]
        rewards = []
        step = len(texts) if self.reward_batch_size is None else self.reward_batch_size
        for start in range(0, len(texts), step):
            encoded = reward_tokenizer(texts[start : start + step], padding=True, truncation=True, return_tensors="pt")
            out = self.reward(
                input_ids=encoded["input_ids"].to(self.device), attention_mask=encoded["attention_mask"].to(self.device)
            )
            rewards.append(reward_from_logits(out.logits, self.label))
        return torch.cat(rewards).view(batch, k)

    @torch.no_grad()
    def rewards(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """`[B, k]` rewards of each row's sequence followed by each of its `[B, k]` candidate tokens."""
        ids, candidates = input_ids.to(self.device), candidates.to(self.device)
        if self.tokenizers is None:
            return self._cached_rewards(ids, candidates)
        return self._text_rewards(ids, candidates)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = scores.topk(min(self.top_k, scores.shape[-1]), dim=-1)
        rewards = self.rewards(input_ids, top.indices).to(scores.device)
        shifted = (top.values.float() + self.beta * rewards).to(scores.dtype)
        return torch.full_like(scores, -math.inf).scatter(-1, top.indices, shifted)
