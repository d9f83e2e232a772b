"""DeAL: decoding-time alignment as a lookahead search over beam-search proposals scored by a reward function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steer_hydra.controls.output.search import SearchDriver, require_scorer, validate_search
from steer_hydra.core.controls import BaseArgs


class DeAL(SearchDriver):
    """DeAL (Huang et al., 2024, "DeAL: Decoding-time Alignment for Large Language Models", arXiv 2402.06147).

    From the frontier (initially the prompt), beam search proposes `init_beams` lookahead continuations of
    `lookahead` tokens per beam; `reward_func(prompt, continuations, params) -> list[float]` scores each partial
    continuation (since the prompt end; `params` holds the row's `reward_params`), the top `topk` are kept, and
    the unfinished ones are extended again until none is left or `max_iterations` is spent. Returns the
    best-scoring continuation seen. Other controls' processors, criteria and hooks apply inside every rollout.
    At most `init_beams * (1 + (max_iterations - 1) * topk)` continuations are rolled out per prompt (140 with
    the defaults). The output is at most `min(max_new_tokens, lookahead * max_iterations)` tokens long.

    Needs beam proposals (`num_beams > 1` rollouts): Hugging Face backend only (`check()` says so elsewhere).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        lookahead: int = 10
        init_beams: int = 5
        topk: int = 3
        max_iterations: int = 10
        reward_func: Callable[..., Any] | None = None

        def validate(self) -> None:
            validate_search(
                "DeAL",
                segment_len=("lookahead", self.lookahead),
                num_candidates=("init_beams", self.init_beams),
                keep_k=("topk", self.topk),
                max_iterations=("max_iterations", self.max_iterations),
            )
            require_scorer("DeAL", "reward_func", self.reward_func)

    supports_batching = False

    def _configure(self) -> None:
        self.scorer = self.reward_func
        self.segment_len = self.lookahead
        self.num_candidates = self.init_beams
        self.keep_k = self.topk
        self.propose_mode = "beam"
