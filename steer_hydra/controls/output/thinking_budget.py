"""ThinkingBudget: budget forcing of a reasoning ("thinking") channel, a minimum and/or maximum number of its tokens.

How it runs: every token comes from the pipeline's `rollout`, in phases; each phase rolls out every row still in
it in one call (rows re-packed with left padding, each row's prompt followed by its continuation so far), to the
largest remaining budget among them, and each row's rollout is cut at its own budget (greedy or sampled, the
first k tokens of a longer rollout are what a k-token rollout gives, so a row decodes the same alone or in a batch).

1. Open: with `opened_at_start=False` the open tag starts every continuation (the driver opens the channel);
   with True the prompt opened it (a chat template that ends its generation prompt with the open tag).
2. Think: rows roll out up to their remaining thinking budget, stopping at the close tag (a stop string of the
   rollout, on top of the call's own). A row that closes before `min_thinking_tokens` loses the tag and gets the
   `wait` string, and thinks on (at most `max_waits` times, and only while the wait string and one more token fit
   in both budgets; otherwise its own close stands). A row that reaches `max_thinking_tokens` unclosed gets the
   close tag and `answer_prefix` appended. A row ended by an eos id, a stop string of the call, another control's
   stopping criterion or `max_new_tokens` is finished.
3. Answer: rows whose thinking closed roll out the rest of `max_new_tokens` (no tag stop).

Counting, in tokens of the model's tokenizer: thinking tokens are the continuation's tokens inside the channel
(after a driver-opened tag, else from the first) before the close tag; wait strings count, tags do not. A thinking
rollout runs up to the close tag's length past the row's cap, so a close the model begins at the cap is seen; a
close that starts past the cap, and everything past it, is cut, and the close tag is appended at exactly
`max_thinking_tokens`. Every appended string is encoded without special
tokens, and the continuation never exceeds `max_new_tokens` (an appended string is cut to fit). The pipeline's
rolled-out total (`Output.generated_tokens`) includes the tokens cut off a shared rollout and dropped tags.

The continuation reads `[<think>]...</think>answer`, so the provider's reasoning split (`ProviderOptions`
`reasoning_tags`, `reasoning_opened_at_start` = this control's `opened_at_start`) separates reasoning from answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, DecodingDriver, DriverResult
from steer_hydra.core.params import DEFAULT_MAX_NEW_TOKENS
from steer_hydra.core.tensors import pad_left, pad_right, strip_trailing

logger = logging.getLogger(__name__)

# the provider's default reasoning tags (steer_hydra.evaluation.thinking.DEFAULT_THINK_TAGS)
DEFAULT_THINK_TAGS: tuple[str, str] = ("<think>", "</think>")
# generation kwargs the driver sets itself, or that would change what a phase means
_OWNED_KWARGS = ("max_new_tokens", "min_new_tokens", "num_return_sequences", "num_beams", "n")

_THINK, _ANSWER, _DONE = "think", "answer", "done"


@dataclass(frozen=True, slots=True)
class RowBudget:
    """What the last `decode` did to one row.

    Attributes:
        thinking_tokens: tokens inside the channel before its close tag (wait strings included).
        waits: how many times an early close was replaced by the wait string.
        forced_close: the close tag was appended at `max_thinking_tokens`.
        closed: the channel closed (by the model or forced), so the answer phase ran or was due.
        new_tokens: the continuation's length.
    """

    thinking_tokens: int
    waits: int
    forced_close: bool
    closed: bool
    new_tokens: int


@dataclass(slots=True)
class _Row:
    prompt: list[int]
    cont: list[int] = field(default_factory=list)
    think_start: int = 0
    phase: str = _THINK
    waits: int = 0
    forced: bool = False
    thinking_end: int | None = None  # len(cont) when the channel closed

    @property
    def thinking(self) -> int:
        end = len(self.cont) if self.thinking_end is None else self.thinking_end
        return end - self.think_start


class ThinkingBudget(DecodingDriver):
    """Budget forcing (Muennighoff et al., 2025, "s1: Simple test-time scaling", arXiv 2501.19393).

    Holds the thinking channel between `min_thinking_tokens` and `max_thinking_tokens` tokens: at the maximum
    the close tag (and `answer_prefix`) is appended and the model answers; a close before the minimum is dropped
    and `wait` appended so the model thinks on. Runs on every backend that offers rollouts (Hugging Face, vLLM);
    rows batch (see the module docstring for the phases and the counts).

    Args:
        tags: the `(open, close)` tags of the channel; both must survive a decode with special tokens skipped
            (stop strings see decoded text).
        opened_at_start: the prompt opens the channel (the template ends with the open tag); else the driver
            starts the continuation with the open tag.
        min_thinking_tokens: the floor (None: none); an earlier close is replaced by `wait`.
        max_thinking_tokens: the cap (None: none, only `max_new_tokens` bounds the thinking).
        wait: the string appended in place of an early close ("Wait" in the paper; "" only drops the tag).
        max_waits: how many early closes per row may be replaced.
        answer_prefix: appended after a forced close tag (the paper uses "Final Answer:"; "" appends the tag only).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        tags: tuple[str, str] = DEFAULT_THINK_TAGS
        opened_at_start: bool = False
        min_thinking_tokens: int | None = None
        max_thinking_tokens: int | None = None
        wait: str = "Wait"
        max_waits: int = 4
        answer_prefix: str = ""

        def validate(self) -> None:
            tags = tuple(self.tags)
            if len(tags) != 2 or not all(isinstance(t, str) and t for t in tags) or tags[0] == tags[1]:
                raise ValueError(
                    f"ThinkingBudget.tags must be two different non-empty strings (open, close); got {self.tags!r}. "
                    f"Fix: e.g. tags={list(DEFAULT_THINK_TAGS)}."
                )
            low, high = self.min_thinking_tokens, self.max_thinking_tokens
            if low is None and high is None:
                raise ValueError(
                    "ThinkingBudget needs a budget: min_thinking_tokens and max_thinking_tokens are both None. "
                    "Fix: set max_thinking_tokens (a cap) and/or min_thinking_tokens (a floor)."
                )
            if low is not None and low < 1:
                raise ValueError(
                    f"ThinkingBudget.min_thinking_tokens must be >= 1; got {low}. Fix: a positive floor, or None."
                )
            if high is not None and high < 0:
                raise ValueError(
                    f"ThinkingBudget.max_thinking_tokens must be >= 0; got {high}. Fix: a cap >= 0 (0 closes the "
                    "channel at once), or None."
                )
            if low is not None and high is not None and low > high:
                raise ValueError(
                    f"ThinkingBudget.min_thinking_tokens={low} must be <= max_thinking_tokens={high}. "
                    "Fix: lower the floor or raise the cap."
                )
            if self.max_waits < 0:
                raise ValueError(f"ThinkingBudget.max_waits must be >= 0; got {self.max_waits}.")
            close = tags[1]
            for name in ("wait", "answer_prefix"):
                if close in getattr(self, name):
                    raise ValueError(
                        f"ThinkingBudget.{name}={getattr(self, name)!r} contains the close tag {close!r}, so the "
                        "channel would close in the wrong place. Fix: remove the tag from it."
                    )

    supports_batching = True

    tags: tuple[str, str]
    opened_at_start: bool
    min_thinking_tokens: int | None
    max_thinking_tokens: int | None
    wait: str
    max_waits: int
    answer_prefix: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last_budgets: tuple[RowBudget, ...] = ()
        super().__init__(*args, **kwargs)

    def _configure(self) -> None:
        self.tags = (self.tags[0], self.tags[1])

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.SAMPLED_ROLLOUTS})

    def max_rollouts_per_query(self) -> int:
        """Thinking rollouts (one, plus one per allowed wait when a floor is set) and one answer rollout."""
        waits = self.max_waits if self.min_thinking_tokens is not None else 0
        return 1 + waits + 1

    # ------------------------------------------------------------------ decode
    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        rollout: Callable[..., torch.Tensor],
        runtime_kwargs: Mapping[str, Any],
        tokenizer: Any,
        max_new_tokens: int | None = None,
        **gen_kwargs: Any,
    ) -> DriverResult:
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None:
            raise ValueError("ThinkingBudget needs the model's tokenizer to count and find tags; pass tokenizer=.")
        self._check_tags(tokenizer)
        budget = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        if budget < 1:
            raise ValueError(f"ThinkingBudget: max_new_tokens must be >= 1; got {max_new_tokens}.")
        passthrough = _passthrough(gen_kwargs)
        pad = tokenizer.pad_token_id
        encode = _encoder(tokenizer)
        close_len = len(encode(self.tags[1]))
        opening = [] if self.opened_at_start else encode(self.tags[0])
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            row = _Row(prompt=[t for t, m in zip(ids, mask, strict=True) if m])
            row.cont = opening[:budget]
            row.think_start = len(row.cont)
            if len(row.cont) >= budget:
                row.phase = _DONE
            rows.append(row)

        def roll(active: list[_Row], caps: list[int], stops: tuple[str, ...]) -> list[list[int]]:
            ids, mask = pad_left([r.prompt + r.cont for r in active], pad)
            device = input_ids.device
            sequences = rollout(
                ids.to(device),
                mask.to(device=device, dtype=attention_mask.dtype),
                max_new_tokens=max(caps),
                stop_strings=stops,
                **passthrough,
            )
            if sequences.shape[0] != len(active):
                raise RuntimeError(f"The rollout returned {sequences.shape[0]} rows for {len(active)} prompts.")
            new = sequences[:, ids.shape[1] :].tolist()
            return [strip_trailing(row, pad)[0][:cap] for row, cap in zip(new, caps, strict=True)]

        phase = 0
        while True:
            active = [r for r in rows if r.phase == _THINK]
            if not active:
                break
            phase += 1
            caps = [self._thinking_cap(r, budget, close_len) for r in active]
            rolled = [r for r, cap in zip(active, caps, strict=True) if cap > 0]
            outs = iter(roll(rolled, [c for c in caps if c > 0], (self.tags[1],)) if rolled else ())
            for row, cap in zip(active, caps, strict=True):
                self._after_thinking(row, next(outs) if cap > 0 else [], budget, tokenizer, encode)
            logger.debug("ThinkingBudget thinking rollout %d: %d rows, caps %s", phase, len(rolled), caps)
        active = [r for r in rows if r.phase == _ANSWER]
        if active:
            caps = [budget - len(r.cont) for r in active]
            for row, out in zip(active, roll(active, caps, ()), strict=True):
                row.cont += out
                row.phase = _DONE
        self.last_budgets = tuple(
            RowBudget(r.thinking, r.waits, r.forced, r.thinking_end is not None, len(r.cont)) for r in rows
        )
        continuation = pad_right([torch.tensor([r.cont], dtype=torch.long) for r in rows], pad).to(input_ids)
        return DriverResult(torch.cat([input_ids, continuation], dim=1))

    # ------------------------------------------------------------------ phases
    def _room(self, row: _Row) -> int | None:
        """Thinking tokens this row may still add (None: no cap)."""
        return None if self.max_thinking_tokens is None else self.max_thinking_tokens - row.thinking

    def _thinking_cap(self, row: _Row, budget: int, close_len: int) -> int:
        """Tokens this row rolls out in the next thinking rollout: up to `close_len` past its thinking cap, so a
        close the model begins at the cap is seen (0: the cap is reached, nothing to roll out)."""
        room = self._room(row)
        if room is None:
            return budget - len(row.cont)
        return 0 if room <= 0 else min(budget - len(row.cont), room + close_len)

    def _after_thinking(
        self, row: _Row, tokens: list[int], budget: int, tokenizer: Any, encode: Callable[[str], list[int]]
    ) -> None:
        """Apply one thinking rollout's tokens to `row` and move it to its next phase."""
        close = self.tags[1]
        room = self._room(row)
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        at = text.find(close)
        if at != -1:
            kept, leftover = _before(tokenizer, tokens, text, at)
            head = kept + encode(leftover)
            if room is None or len(head) <= room:  # the model closed the channel within its cap
                self._closed_by_model(row, tokens, head, budget, encode)
                return
        if room is None or (room > 0 and len(tokens) <= room):
            row.cont += tokens  # eos, a stop string or criterion, or max_new_tokens: no answer phase
            row.phase = _DONE
            return
        row.cont += tokens[: max(room, 0)]  # the cap: cut what the rollout ran past it, then close
        row.thinking_end = len(row.cont)
        row.forced = True
        row.cont += encode(close + self.answer_prefix)[: budget - len(row.cont)]
        row.phase = _ANSWER if len(row.cont) < budget else _DONE

    def _closed_by_model(
        self, row: _Row, tokens: list[int], head: list[int], budget: int, encode: Callable[[str], list[int]]
    ) -> None:
        """A close the model wrote: replace it by the wait string below the floor (while allowed and it fits),
        else accept it."""
        wait = encode(self.wait)
        thought = row.thinking + len(head)
        if (
            self.min_thinking_tokens is not None
            and thought < self.min_thinking_tokens
            and row.waits < self.max_waits
            and len(row.cont) + len(head) + len(wait) < budget
            and (self.max_thinking_tokens is None or thought + len(wait) < self.max_thinking_tokens)
        ):
            row.cont += head + wait
            row.waits += 1
            return
        row.thinking_end = len(row.cont) + len(head)
        row.cont += tokens
        row.phase = _ANSWER if len(row.cont) < budget else _DONE

    def _check_tags(self, tokenizer: Any) -> None:
        for tag in self.tags:
            ids = tokenizer.encode(tag, add_special_tokens=False)
            if not ids or tokenizer.decode(ids, skip_special_tokens=True) != tag:
                raise ValueError(
                    f"ThinkingBudget: the tag {tag!r} does not survive encode then decode(skip_special_tokens=True) "
                    "with this tokenizer (a special token?), so a stop string cannot see it. Fix: set tags= to the "
                    "text tags the model writes."
                )


def _encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False)) if text else []

    return encode


def _before(tokenizer: Any, tokens: Sequence[int], text: str, at: int) -> tuple[list[int], str]:
    """The longest token prefix whose text ends at or before character `at` of `text`, and the text between them
    (the part of a token that straddles the tag, re-encoded by the caller)."""
    k = len(tokens)
    while k > 0:
        prefix = tokenizer.decode(list(tokens[:k]), skip_special_tokens=True)
        if len(prefix) <= at and text.startswith(prefix):
            return list(tokens[:k]), text[len(prefix) : at]
        k -= 1
    return [], text[:at]


def _passthrough(gen_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    owned = sorted(set(_OWNED_KWARGS) & set(gen_kwargs))
    if owned:
        raise ValueError(
            f"ThinkingBudget sets {owned} itself for each phase; remove them from the generate() call (the thinking "
            "floor is min_thinking_tokens, the total budget max_new_tokens)."
        )
    passthrough = dict(gen_kwargs)
    if "do_sample" not in passthrough:
        # the pipeline passes sampling settings only to a sampling call; decode greedily otherwise, on every backend
        passthrough["do_sample"] = passthrough.get("temperature") not in (None, 0, 0.0)
    return passthrough
