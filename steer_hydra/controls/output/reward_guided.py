"""RewardGuidedDecoding (RAD): the model's top-k next tokens re-weighted by a reward model, as a logits processor.

How it runs: `steer()` loads the reward model (a sequence classifier) and its tokenizer beside the pipeline's model
(the backend's `load_model`: same device and dtype) and decides how to score. When the reward model is a decoder
classifier (a trunk with a KV cache and a `score` head) whose tokenizer has the model's vocabulary (the same
token-to-id map and an embedding row for every id the model scores), each call's `RewardLogitsProcessor` keeps the
reward model's KV cache over each row's prefix: it advances it by the tokens added since the last step (positions
and attention mask from the prompt mask, every generated token counting; prefilled again when the sequences do not
extend the ones it holds) and scores the k candidates of a row as one more position each on that cache, repeated
k times, all rows in as few forwards as `reward_batch_size` allows. There the reward of a sequence is the head at
its last token, so a row scores the same alone or in a padded batch. Otherwise (another tokenizer, or an encoder
classifier) each candidate sequence is decoded to text, re-tokenized with the reward model's tokenizer (padded on
the right, where a plain forward needs no position ids; truncated from the left) and scored by the classifier's own
forward and pooling, without a cache.
`cleanup()` drops the reward model.

Invariants: tokens outside the top-k get -inf; a top-k token's score is its incoming score plus beta * reward.
"""

from __future__ import annotations

import copy
import gc
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.output.auxiliary import PrefixCache, call_rows, positions, prompt_mask_for, release
from steer_hydra.controls.output.contrastive import output_vocab_size
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, OutputControl

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


@torch.no_grad()
def sequence_rewards(
    reward: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, label: int | None = None
) -> torch.Tensor:
    """Reward of each left-padded row (`[N, T]` ids and mask) of a decoder classifier, read at its last position,
    without a cache."""
    parts = decoder_parts(reward)
    if parts is None:
        raise ValueError(f"sequence_rewards needs a decoder classifier with a `{HEAD_NAME}` head; got {type(reward)}.")
    trunk, head = parts
    device = next(reward.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    hidden = trunk(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    return reward_from_logits(head(hidden.last_hidden_state[:, -1]), label)


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


def _prepare_text_tokenizer(reward: torch.nn.Module, reward_tokenizer: Any, reference: str) -> None:
    """Let the reward tokenizer batch: a pad token (its EOS when it has none, as GPT-2 classifiers need, also set in
    the model's config for its pooling), right padding (a plain forward then needs no position ids, and the
    classifier's pooling finds the last real token) and truncation from the left, which keeps the candidate."""
    if reward_tokenizer.pad_token is None:
        if reward_tokenizer.eos_token is None:
            raise ValueError(
                f"RewardGuidedDecoding.reward_model={reference!r}: its tokenizer has neither a pad nor an EOS token "
                "to pad a batch with. Fix: use a reward model whose tokenizer defines a pad token."
            )
        reward_tokenizer.pad_token = reward_tokenizer.eos_token
    if getattr(reward.config, "pad_token_id", None) is None:
        reward.config.pad_token_id = reward_tokenizer.pad_token_id
    reward_tokenizer.padding_side = "right"
    reward_tokenizer.truncation_side = "left"


def same_vocabulary(model_tokenizer: Any, reward_tokenizer: Any) -> bool:
    """Whether both tokenizers map every token to the same id (so the reward model can read the model's ids)."""
    if model_tokenizer is None or reward_tokenizer is None:
        return False
    return model_tokenizer.get_vocab() == reward_tokenizer.get_vocab()


class RewardGuidedDecoding(OutputControl):
    """Reward-augmented decoding: each step re-weights the model's top-k next tokens by a reward model's score.

    Paper: Deng and Raffel, "Reward-Augmented Decoding: Efficient Controlled Text Generation With a Unidirectional
    Reward Model" (EMNLP 2023, arXiv 2310.09520). At each step the k most likely tokens x_1..x_k are scored by a
    unidirectional reward model on `prefix + x_i`; token x_i gets `z_i + beta * r_i` (z_i its incoming score, r_i
    in [0, 1]) and every other token -inf. Greedy decoding picks the best of these, sampling samples from their
    softmax (the paper's setting). The reward model's KV cache over the prefix is reused across steps when it
    shares the model's vocabulary (the paper's efficiency argument); otherwise the text is re-tokenized each step.

    Args:
        reward_model: reference of a sequence classifier (Hub id, path, or `steer_hydra:tiny-reward` for tests),
            ideally a decoder sharing the model's tokenizer (the cached path); any classifier works through
            re-tokenized text. Loaded at `steer()` on the model's device and dtype.
        beta: reward weight (>= 0); the paper's reference code defaults to 30 and its experiments sweep 10 to 50.
            0 leaves plain top-k decoding.
        top_k: candidates scored per step (the paper's k = 20).
        label: which class's probability is the reward (default: the last class, e.g. "positive" of a binary
            classifier); a one-output head's reward is the sigmoid of its logit (label must then be None or 0).
        reward_batch_size: most candidate rows (prefix x candidate) in one reward-model forward; None scores all
            rows x top_k candidates of a step at once.

    Hugging Face backend only (live logits processor, a second model in process). Batches (the reward cache follows
    the batch's left padding); no slot refill (rows admitted mid-decode would need the reward cache to admit them).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        reward_model: str
        beta: float = 30.0
        top_k: int = 20
        label: int | None = None
        reward_batch_size: int | None = None

        def validate(self) -> None:
            if not self.reward_model.strip():
                raise ValueError(
                    "RewardGuidedDecoding.reward_model must name a sequence classifier; got ''. "
                    "Fix: reward_model=<Hub id, path or steer_hydra:tiny-reward>."
                )
            if not (math.isfinite(self.beta) and self.beta >= 0):
                raise ValueError(
                    f"RewardGuidedDecoding.beta must be a finite number >= 0; got {self.beta}. "
                    "Fix: use the paper's range (10 to 50); to steer away from a class, set label to the other class."
                )
            if self.top_k < 1:
                raise ValueError(
                    f"RewardGuidedDecoding.top_k must be >= 1; got {self.top_k}. Fix: use the paper's top_k=20."
                )
            if self.label is not None and self.label < 0:
                raise ValueError(
                    f"RewardGuidedDecoding.label must be a class index >= 0 or None; got {self.label}. "
                    "Fix: label=None (the last class) or the index of the class to favour."
                )
            if self.reward_batch_size is not None and self.reward_batch_size < 1:
                raise ValueError(
                    f"RewardGuidedDecoding.reward_batch_size must be >= 1 or None; got {self.reward_batch_size}. "
                    "Fix: reward_batch_size=None (all candidates of a step at once) or a positive row count."
                )

    supports_batching = True
    supports_refill = False

    def _configure(self) -> None:
        self._reward: torch.nn.Module | None = None
        self._tokenizers: tuple[Any, Any] | None = None

    @property
    def reward(self) -> torch.nn.Module | None:
        """The loaded reward model (None before `steer()` and after `cleanup()`)."""
        return self._reward

    @property
    def uses_prefix_cache(self) -> bool:
        """Whether the reward model reads the model's token ids with a prefix KV cache (set at `steer()`)."""
        return self._reward is not None and self._tokenizers is None

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH})

    def steer(
        self,
        model: torch.nn.Module | None,
        tokenizer: Any = None,
        load_model: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if model is None or load_model is None:
            raise RuntimeError(
                "RewardGuidedDecoding needs the live model and a reward model in this process. "
                "Fix: use backend=huggingface."
            )
        reward, reward_tokenizer = load_model(self.reward_model, head="sequence_classification", with_tokenizer=True)
        classes = int(getattr(reward.config, "num_labels", 1))
        if self.label is not None and self.label >= max(classes, 1):
            del reward
            gc.collect()
            raise ValueError(
                f"RewardGuidedDecoding.label={self.label} but reward_model={self.reward_model!r} has {classes} "
                f"class(es). Fix: label in 0..{max(classes, 1) - 1}, or None for the last class."
            )
        shared = (
            decoder_parts(reward) is not None
            and same_vocabulary(tokenizer, reward_tokenizer)
            and reward.get_input_embeddings().num_embeddings >= output_vocab_size(model)
        )
        if not shared:
            if tokenizer is None:
                raise RuntimeError(
                    "RewardGuidedDecoding needs the model's tokenizer to re-tokenize text for this reward model. "
                    "Fix: build the pipeline with its tokenizer."
                )
            _prepare_text_tokenizer(reward, reward_tokenizer, self.reward_model)
        self._reward = reward
        self._tokenizers = None if shared else (tokenizer, reward_tokenizer)
        return None

    def cleanup(self) -> None:
        if self._reward is not None:
            device, self._reward, self._tokenizers = next(self._reward.parameters()).device, None, None
            release(device)

    def get_logits_processors(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        if self._reward is None:
            raise RuntimeError("RewardGuidedDecoding has no reward model loaded. Fix: call pipeline.steer() first.")
        ids, mask = call_rows(input_ids, kwargs)
        return [
            RewardLogitsProcessor(
                self._reward,
                ids,
                mask,
                beta=self.beta,
                top_k=self.top_k,
                label=self.label,
                reward_batch_size=self.reward_batch_size,
                tokenizers=self._tokenizers,
                pad_token_id=getattr(self.tokenizer, "pad_token_id", None),
            )
        ]
