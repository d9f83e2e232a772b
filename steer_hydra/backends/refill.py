"""`RefillEngine`: a decode loop that evicts finished rows and admits waiting ones between steps (Hugging Face).

How it runs: rows arrive in groups (`RefillGroup`, a left-packed prompt block built by the pipeline). A group is
prefilled on its own, under hooks built for that block exactly as a static call would build them, and its KV
cache is merged into the running batch: both caches are left-padded with masked zero columns until their next
columns agree (`T`), then concatenated along the batch. Each decode step feeds every active row its last token
at column `T` with its own position id, picks the next token per row (greedy, or sampled from the row's own
generator), and evicts the rows that finished; columns that are padding in every remaining row are trimmed.

Steering during decode: state-control hooks are built for the current batch composition (rebuilt after every
admission or eviction) on a *layout prompt*: `[rows, W]` ids holding each row's prompt tokens at the cache
columns where they sit (mask 1), every other column masked, `W` the largest prompt end. A control that reads
prompt columns from the mask (PASTA's spans) and anchors "after the prompt" at `W` (CAA) therefore steers each
row exactly as in its static call: decode positions are all at or past `W`. Controls opt in by declaring
`supports_refill = True`, as does the backend (`HFBackend.supports_refill`); the pipeline refuses refill otherwise.

Invariants:
- one thread drives the engine (`admit`, `step`); `RefillGroup` callbacks run on that thread;
- a row's tokens depend only on its own prompt, parameters, runtime kwargs and seed (greedy outputs equal the
  static batch's, up to floating-point reduction order in padded attention);
- hooks are registered only for the duration of one prefill or decode step.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.cache_utils import DynamicCache, DynamicLayer

from steer_hydra.core.params import GenerationParams

logger = logging.getLogger(__name__)

HookBuilder = Callable[[torch.Tensor, torch.Tensor, Sequence[dict[str, Any]]], list]
"""`(ids [rows, W], mask [rows, W], per-row runtime kwargs) -> HookSets` for one batch composition."""


@dataclass(slots=True)
class RefillRow:
    """One request row: its real prompt tokens, parameters, seed, runtime kwargs and completion callback.

    `on_done(continuation_ids, error)` is called once, on the engine thread, with the generated ids (EOS or stop
    token included, no padding) or with the exception that ended the row.
    """

    prompt_ids: list[int]
    params: GenerationParams
    seed: int | None
    runtime_kwargs: dict[str, Any]
    on_done: Callable[[list[int] | None, BaseException | None], None]


@dataclass(slots=True)
class _Active:
    row: RefillRow
    prompt_end: int  # cache column just after the row's last prompt token
    position: int  # position id of the next token fed
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


@dataclass(slots=True)
class RefillStats:
    """Counters since the engine was built: decode steps, row-steps computed, prefills, admitted rows."""

    steps: int = 0
    row_steps: int = 0
    slot_steps: int = 0
    prefills: int = 0
    admitted: int = 0


class RefillEngine:
    """Continuous batching on a live Hugging Face model with per-row steering (see the module docstring).

    Args:
        model: the causal LM (full-attention KV cache; sliding-window layers are refused).
        tokenizer: for stop strings and the pad id.
        max_rows: the batch ceiling (active rows at most).
        build_hooks: hook sets for one batch composition (see `HookBuilder`).
        applied: the backend's `applied(hooks)` context manager.
        eos_token_ids: ids that end a row (what `model.generate` stops on).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_rows: int,
        build_hooks: HookBuilder,
        applied: Callable[[Sequence[Any]], contextlib.AbstractContextManager],
        eos_token_ids: Sequence[int],
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"RefillEngine.max_rows must be >= 1; got {max_rows}.")
        self.model = model
        self.tokenizer = tokenizer
        self.max_rows = int(max_rows)
        self._build_hooks = build_hooks
        self._applied = applied
        self._eos = set(int(i) for i in eos_token_ids)
        self._device = model.get_input_embeddings().weight.device
        self._rows: list[_Active] = []
        self._cache: DynamicCache | None = None
        # transformers 5.24 names the KV cache `cache` (argument and output field); 5.19 `past_key_values`
        self._cache_key = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
        self._mask: torch.Tensor | None = None  # [rows, T]
        self._hooks: list | None = None
        self.stats = RefillStats()

    # ------------------------------------------------------------------ state
    @property
    def active(self) -> int:
        """Rows being decoded."""
        return len(self._rows)

    @property
    def room(self) -> int:
        """Rows that can be admitted now."""
        return self.max_rows - len(self._rows)

    @property
    def idle(self) -> bool:
        return not self._rows

    # ------------------------------------------------------------------ admission
    def admit(self, rows: Sequence[RefillRow], input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Prefill a left-packed group (`[n, P]`, one row per `RefillRow`) and add its unfinished rows.

        Raises when the group exceeds `room` or the prefill itself fails (no row of the group is then active;
        callbacks are not called).
        """
        if len(rows) > self.room:
            raise ValueError(f"RefillEngine.admit got {len(rows)} rows with room for {self.room}.")
        if not rows:
            return
        ids = input_ids.to(self._device)
        mask = attention_mask.to(self._device)
        hooks = self._build_hooks(ids, mask, [r.runtime_kwargs for r in rows])
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = DynamicCache(config=self.model.config)
        with self._applied(hooks), torch.no_grad():
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                **{self._cache_key: cache},
                use_cache=True,
                logits_to_keep=1,
            )
        logits = out.logits[:, -1].to(dtype=torch.float32)
        cache = out[self._cache_key]
        if not all(type(layer) is DynamicLayer for layer in cache.layers):
            raise NotImplementedError(
                "refill needs a full-attention KV cache; this model has sliding-window layers. "
                "Fix: use static batching (backend option refill=False)."
            )
        self.stats.prefills += 1
        width = ids.shape[1]
        fresh = []
        for i, row in enumerate(rows):
            length = int(mask[i].sum())
            generator = None
            if not row.params.greedy and row.seed is not None:
                generator = torch.Generator(device=self._device)
                generator.manual_seed(int(row.seed))
            fresh.append(_Active(row, prompt_end=width, position=length, generator=generator))
        tokens = self._select(fresh, logits, [row.prompt_ids for row in rows])
        keep = []
        for i, (active, token) in enumerate(zip(fresh, tokens, strict=True)):
            active.generated.append(token)
            if self._finished(active):
                self._deliver(active)
            else:
                keep.append(i)
        self.stats.admitted += len(rows)
        if keep:
            self._merge(fresh, keep, cache, mask)

    def _merge(self, fresh: list[_Active], keep: list[int], cache: DynamicCache, mask: torch.Tensor) -> None:
        rows = [fresh[i] for i in keep]
        if len(keep) != len(fresh):
            index = torch.tensor(keep, device=self._device)
            cache.batch_select_indices(index)
            mask = mask.index_select(0, index)
        if self._cache is None:
            self._cache, self._mask, self._rows = cache, mask, rows
        else:
            width, running = mask.shape[1], self._mask.shape[1]
            target = max(width, running)
            for layer, new in zip(self._cache.layers, cache.layers, strict=True):
                layer.keys = torch.cat([_left_pad(layer.keys, target), _left_pad(new.keys, target)], dim=0)
                layer.values = torch.cat([_left_pad(layer.values, target), _left_pad(new.values, target)], dim=0)
            self._mask = torch.cat([_left_pad(self._mask, target, dim=1), _left_pad(mask, target, dim=1)])
            for active in self._rows:
                active.prompt_end += target - running
            for active in rows:
                active.prompt_end += target - width
            self._rows = self._rows + rows
        self._hooks = None

    # ------------------------------------------------------------------ decoding
    def step(self) -> None:
        """One decode step for every active row; finished rows are delivered and evicted."""
        if not self._rows:
            return
        rows = self._rows
        tokens = torch.tensor([[a.generated[-1]] for a in rows], device=self._device)
        positions = torch.tensor([[a.position] for a in rows], device=self._device)
        mask = torch.cat([self._mask, self._mask.new_ones((len(rows), 1))], dim=1)
        try:
            if self._hooks is None:
                self._hooks = self._build_hooks(*self._layout_prompt(), [a.row.runtime_kwargs for a in rows])
            with self._applied(self._hooks), torch.no_grad():
                out = self.model(
                    input_ids=tokens,
                    attention_mask=mask,
                    position_ids=positions,
                    **{self._cache_key: self._cache},
                    use_cache=True,
                    logits_to_keep=1,
                )
        except Exception as error:
            self._fail_all(error)
            return
        self._mask = mask
        self.stats.steps += 1
        self.stats.row_steps += len(rows)
        self.stats.slot_steps += self.max_rows
        logits = out.logits[:, -1].to(dtype=torch.float32)
        histories = [a.row.prompt_ids + a.generated for a in rows]
        chosen = self._select(rows, logits, histories)
        keep = []
        for i, (active, token) in enumerate(zip(rows, chosen, strict=True)):
            active.generated.append(token)
            active.position += 1
            if self._finished(active):
                self._deliver(active)
            else:
                keep.append(i)
        if len(keep) != len(rows):
            self._evict(keep)

    def drain(self) -> None:
        """Step until no row is active."""
        while self._rows:
            self.step()

    def _layout_prompt(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's prompt at its cache columns (mask 1), everything else masked; width = largest prompt end."""
        width = max(a.prompt_end for a in self._rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(self._rows), width), pad, dtype=torch.long, device=self._device)
        mask = torch.zeros((len(self._rows), width), dtype=torch.long, device=self._device)
        for i, active in enumerate(self._rows):
            prompt = active.row.prompt_ids
            start = active.prompt_end - len(prompt)
            ids[i, start : active.prompt_end] = torch.tensor(prompt, device=self._device)
            mask[i, start : active.prompt_end] = 1
        return ids, mask

    def _select(self, rows: Sequence[_Active], logits: torch.Tensor, histories: Sequence[list[int]]) -> list[int]:
        """Next token per row: processors as `model.generate` applies them, then argmax or the row's own draw."""
        plain = all(
            a.row.params.greedy and a.row.params.repetition_penalty is None and not a.row.params.min_new_tokens
            for a in rows
        )
        if plain:
            return logits.argmax(dim=-1).tolist()
        chosen = []
        for i, active in enumerate(rows):
            params = active.row.params
            scores = logits[i : i + 1]
            history = torch.tensor([histories[i]], device=logits.device)
            if params.repetition_penalty is not None:
                scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(history, scores)
            if params.min_new_tokens and len(active.generated) < params.min_new_tokens and self._eos:
                scores = scores.clone()
                scores[:, sorted(self._eos)] = -float("inf")
            if params.greedy:
                chosen.append(int(scores.argmax(dim=-1)))
                continue
            scores = TemperatureLogitsWarper(params.temperature or 1.0)(history, scores)
            if params.top_k:
                scores = TopKLogitsWarper(params.top_k)(history, scores)
            if params.top_p is not None and params.top_p < 1.0:
                scores = TopPLogitsWarper(params.top_p)(history, scores)
            probs = torch.softmax(scores, dim=-1)
            chosen.append(int(torch.multinomial(probs, 1, generator=active.generator)))
        return chosen

    def _finished(self, active: _Active) -> bool:
        params, generated = active.row.params, active.generated
        last = generated[-1]
        if last in self._eos or last in params.stop_token_ids:
            return True
        if len(generated) >= params.max_new_tokens:
            return True
        if params.stop_strings:
            window = max(len(s) for s in params.stop_strings) + 4
            text = self.tokenizer.decode(generated[-window:], skip_special_tokens=True)
            return any(s and s in text for s in params.stop_strings)
        return False

    def _deliver(self, active: _Active) -> None:
        try:
            active.row.on_done(list(active.generated), None)
        except Exception:  # a callback failure must not stop the other rows
            logger.exception("A refill row's completion callback raised.")

    def _evict(self, keep: list[int]) -> None:
        if not keep:
            self._reset()
            return
        index = torch.tensor(keep, device=self._device)
        self._cache.batch_select_indices(index)
        self._mask = self._mask.index_select(0, index)
        self._rows = [self._rows[i] for i in keep]
        real = self._mask.any(dim=0).nonzero()
        first = int(real[0]) if real.numel() else 0
        if first:
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self._mask = self._mask[:, first:]
            for active in self._rows:
                active.prompt_end -= first
        self._hooks = None

    def abort(self, error: BaseException) -> None:
        """End every active row with `error` (their callbacks run) and empty the engine."""
        self._fail_all(error)

    def _fail_all(self, error: BaseException) -> None:
        rows = self._rows
        self._reset()
        for active in rows:
            try:
                active.row.on_done(None, error)
            except Exception:
                logger.exception("A refill row's completion callback raised.")

    def _reset(self) -> None:
        self._rows, self._cache, self._mask, self._hooks = [], None, None, None


def _left_pad(tensor: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """Left-pad `tensor` with zeros along `dim` up to `width`."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
