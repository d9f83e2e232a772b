"""BestOfN: sample n full continuations under the composed controls and return the one the scorer ranks highest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steer_hydra.controls.output.search import SearchDriver, require_scorer
from steer_hydra.core.controls import BaseArgs


class BestOfN(SearchDriver):
    """Best-of-n rejection sampling (Nakano et al., 2021, "WebGPT", arXiv 2112.09332).

    Samples `n` continuations of the whole budget (`max_new_tokens`, default 256) in one rollout, scores them
    with `scorer(prompt, continuations, params) -> list[float]` (higher is better; `params` holds the row's
    `reward_params`), and returns the argmax (the first on ties). A `SearchDriver` with `num_candidates=n`,
    `keep_k=1`, `max_iterations=1`, `propose_mode="sample"` and one segment spanning the budget. Sampling
    settings of the call (temperature, top_p, top_k, seed) apply to the rollout; a greedy call still samples.

    Args:
        n: candidates per prompt (a positive int).
        scorer: required sequence scorer; wrap a per-row `(response, row) -> float` in `SampleSequenceScorer`.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        n: int = 8
        scorer: Callable[..., Any] | None = None

        def validate(self) -> None:
            if self.n < 1:
                raise ValueError(f"BestOfN.n must be a positive integer (candidates per prompt); got {self.n}.")
            require_scorer("BestOfN", "scorer", self.scorer)

    supports_batching = False

    def _configure(self) -> None:
        self.num_candidates = self.n
        self.keep_k = 1
        self.max_iterations = 1
        self.propose_mode = "sample"
        self.segment_len = None
