"""Stopping criteria anchored at the prompt length: stop strings in the continuation, stop token ids, budgets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import StoppingCriteria


class StopOnStrings(StoppingCriteria):
    """Stops a row when its continuation (tokens after `prompt_len`) contains a stop string."""

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str], prompt_len: int) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.prompt_len = prompt_len
        # A stop string of m characters spans at most m tokens; a few more cover special tokens in the window.
        self.window = max((len(s) for s in self.stop_strings), default=0) + 4

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        tails = input_ids[:, self.prompt_len :][:, -self.window :]
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        done = [any(s in text for s in self.stop_strings) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class StopOnTokens(StoppingCriteria):
    """Stops a row whose last generated token is one of `stop_token_ids`."""

    def __init__(self, stop_token_ids: Sequence[int], prompt_len: int) -> None:
        self.stop_ids = torch.tensor(sorted(set(int(t) for t in stop_token_ids)), dtype=torch.long)
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        if input_ids.shape[1] <= self.prompt_len:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return torch.isin(input_ids[:, -1], self.stop_ids.to(input_ids.device))


class BudgetTokens(StoppingCriteria):
    """Stops every row once `budget` tokens follow the prompt."""

    def __init__(self, budget: int, prompt_len: int) -> None:
        self.budget = budget
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = input_ids.shape[1] - self.prompt_len >= self.budget
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)
