"""StoppingRules: stop texts, stop token ids and a token budget, lowered into the call for every backend."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, OutputControl
from steer_hydra.core.stopping import BudgetTokens, StopOnStrings, StopOnTokens


class StoppingRules(OutputControl):
    """Stop generation at any of `stop_texts` or `stop_token_ids`, or after `budget` new tokens.

    The rules are lowered into the call's parameters (stops are unioned, the budget only tightens
    `max_new_tokens`), so rows they halt report `stop` (the budget reports `length`), decoded text is cut at the
    stop string, and token ids keep it.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        stop_texts: list[str] = field(default_factory=list)
        stop_token_ids: list[int] = field(default_factory=list)
        budget: int | None = None

        def validate(self) -> None:
            if not (self.stop_texts or self.stop_token_ids or self.budget is not None):
                raise ValueError("StoppingRules needs at least one of stop_texts, stop_token_ids or budget.")
            if self.budget is not None and self.budget < 1:
                raise ValueError(f"StoppingRules.budget must be a positive number of tokens; got {self.budget}.")
            if any(not s for s in self.stop_texts):
                raise ValueError("StoppingRules.stop_texts may not contain an empty string.")

    supports_batching = True

    def requirements(self) -> frozenset[Capability]:
        return frozenset()

    def export_generation_params(self, runtime_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.stop_texts:
            params["stop_strings"] = list(self.stop_texts)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.budget is not None:
            params["max_new_tokens"] = self.budget
        return params

    def get_stopping_criteria(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        """Fresh criteria for direct use with `model.generate` (the pipeline uses the lowered params instead)."""
        prompt_len = input_ids.shape[1]
        criteria: list = []
        if self.stop_texts:
            criteria.append(StopOnStrings(self.tokenizer, self.stop_texts, prompt_len))
        if self.stop_token_ids:
            criteria.append(StopOnTokens(self.stop_token_ids, prompt_len))
        if self.budget is not None:
            criteria.append(BudgetTokens(self.budget, prompt_len))
        return criteria
