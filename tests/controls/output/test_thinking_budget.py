"""ThinkingBudget: the max cap appends the close tag at exactly N tokens, the min floor replaces early closes by the
wait string, the answer phase, batching, the budget bound, the reasoning split of the result, validation."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor

from steer_hydra.controls.output import ThinkingBudget
from steer_hydra.controls.output.thinking_budget import DEFAULT_THINK_TAGS
from steer_hydra.core import OutputControl
from steer_hydra.core.tensors import strip_trailing
from steer_hydra.evaluation.thinking import DEFAULT_THINK_TAGS as PROVIDER_TAGS
from steer_hydra.evaluation.thinking import split_thinking

PROMPTS = ["hello there cat and dog", "a", "what is the capital of france"]
OPEN, CLOSE = DEFAULT_THINK_TAGS


class _CloseAfter(LogitsProcessor):
    """Never emit the pad id; force the close tag's ids once `k` tokens follow the last open tag or wait string.

    `k = base + (first token after that marker) % spread`: a pure function of the prefix, so it acts alike in every
    rollout, alone or in a batch, and rows may get different `k`.
    """

    def __init__(self, markers: list[list[int]], close: list[int], base: int, spread: int, pad: int) -> None:
        self.markers, self.close, self.base, self.spread, self.pad = markers, close, base, spread, pad

    def _forced(self, row: list[int]) -> int | None:
        end = -1
        for marker in self.markers:
            for i in range(len(row) - len(marker), -1, -1):
                if row[i : i + len(marker)] == marker:
                    end = max(end, i + len(marker))
                    break
        if end == -1 or end >= len(row):
            return None
        step = len(row) - end - (self.base + row[end] % self.spread)
        return self.close[step] if 0 <= step < len(self.close) else None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, self.pad] = -float("inf")
        for r, row in enumerate(input_ids.tolist()):
            token = self._forced(row)
            if token is not None:
                scores[r] = -float("inf")
                scores[r, token] = 0.0
        return scores


class CloseAfter(OutputControl):
    """Test output control: the model closes its thinking `k` tokens after opening it or after each wait string."""

    supports_batching = True

    def __init__(self, base: int = 2, spread: int = 1, wait: str = "Wait") -> None:
        super().__init__()
        self.base, self.spread, self.wait = base, spread, wait

    def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs) -> list:
        encode = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        markers = [encode(OPEN), encode(self.wait)]
        return [_CloseAfter(markers, encode(CLOSE), self.base, self.spread, self.tokenizer.pad_token_id)]


class NoPad(OutputControl):
    """Test output control: never emit the pad id (so trailing pads are padding)."""

    supports_batching = True

    def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs) -> list:
        return [_CloseAfter([], [], 0, 1, self.tokenizer.pad_token_id)]


def _rows(outputs, pad: int) -> list[list[int]]:
    return [strip_trailing(o.output_ids[0].tolist(), pad)[0] for o in outputs]


def _continue(pipeline, ids: list[int], n: int) -> list[int]:
    """The plain pipeline's greedy continuation of `ids` (n tokens at most)."""
    out = pipeline.generate(input_ids=ids, max_new_tokens=n, do_sample=False)
    return strip_trailing(out[0].tolist() if out.dim() == 2 else out.tolist(), pipeline.tokenizer.pad_token_id)[0]


def test_max_budget_cuts_thinking_at_exactly_n_tokens_then_the_close_tag_and_the_answer_follow(make_pipeline):
    n, budget = 5, 18
    driver = ThinkingBudget(max_thinking_tokens=n)
    steered, plain = make_pipeline([NoPad(), driver]), make_pipeline([NoPad()])
    tok = steered.tokenizer
    open_ids, close_ids = tok.encode(OPEN, add_special_tokens=False), tok.encode(CLOSE, add_special_tokens=False)
    outputs = steered.generate(text=PROMPTS, max_new_tokens=budget, do_sample=False, return_output=True)
    for prompt, row, budgeted in zip(PROMPTS, _rows(outputs, tok.pad_token_id), driver.last_budgets, strict=True):
        head = tok(prompt)["input_ids"] + open_ids
        thinking = row[len(open_ids) : len(open_ids) + n]
        assert row[: len(open_ids)] == open_ids
        assert thinking == _continue(plain, head, n)  # the model's own first n thinking tokens
        assert row[len(open_ids) + n : len(open_ids) + n + len(close_ids)] == close_ids
        answer = row[len(open_ids) + n + len(close_ids) :]
        assert answer and answer == _continue(plain, head + thinking + close_ids, budget - len(row) + len(answer))
        assert len(row) == budget
        assert (budgeted.thinking_tokens, budgeted.forced_close, budgeted.closed) == (n, True, True)
    assert [o.finish_reasons for o in outputs] == [["length"]] * len(PROMPTS)


def test_min_budget_replaces_early_closes_by_the_wait_string_until_the_minimum(make_pipeline, record_generate):
    # the model closes 2 tokens after opening and after each "Wait" (3 tokens): 2 < 10, 2+3+2 = 7 < 10, 12 >= 10
    driver = ThinkingBudget(min_thinking_tokens=10, max_waits=4)
    pipeline = make_pipeline([CloseAfter(base=2), driver])
    tok = pipeline.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    calls = record_generate(pipeline.model)
    (row,) = _rows([pipeline.generate(text=PROMPTS[0], max_new_tokens=30, return_output=True)], tok.pad_token_id)
    o, w, c = len(enc(OPEN)), enc("Wait"), enc(CLOSE)
    assert row[:o] == enc(OPEN)
    assert row[o + 2 : o + 5] == w and row[o + 7 : o + 10] == w  # the dropped tags' places hold "Wait"
    assert row[o + 12 : o + 12 + len(c)] == c  # the third close stands
    assert len(row) == 30 and len(row) > o + 12 + len(c)  # the answer phase ran to the budget
    text = tok.decode(row, skip_special_tokens=True)
    assert text.count(CLOSE) == 1 and text.count("Wait") == 2
    (budgeted,) = driver.last_budgets
    assert (budgeted.thinking_tokens, budgeted.waits, budgeted.forced_close) == (12, 2, False)
    assert len(calls) == 4 <= driver.max_rollouts_per_query()  # three thinking rollouts and one answer rollout
    assert [call["kwargs"]["max_new_tokens"] for call in calls] == [30 - o, 30 - o - 5, 30 - o - 10, 30 - o - 12 - 5]


def test_max_waits_bounds_the_replacements_and_the_cap_wins_over_the_floor(make_pipeline):
    bounded = ThinkingBudget(min_thinking_tokens=20, max_waits=1)
    capped = ThinkingBudget(min_thinking_tokens=5, max_thinking_tokens=6)
    first = make_pipeline([CloseAfter(base=2), bounded])
    second = make_pipeline([CloseAfter(base=2), capped])
    tok = first.tokenizer
    close = tok.encode(CLOSE, add_special_tokens=False)
    (row,) = _rows([first.generate(text=PROMPTS[1], max_new_tokens=24, return_output=True)], tok.pad_token_id)
    assert (bounded.last_budgets[0].thinking_tokens, bounded.last_budgets[0].waits) == (7, 1)
    assert row[4 + 7 : 4 + 7 + len(close)] == close  # after one wait, the model's own close stands
    # 2 tokens, "Wait" (5 < 6 thinking tokens), then one token reaches the cap: the close tag is forced
    (row,) = _rows([second.generate(text=PROMPTS[1], max_new_tokens=24, return_output=True)], tok.pad_token_id)
    budgeted = capped.last_budgets[0]
    assert (budgeted.thinking_tokens, budgeted.waits, budgeted.forced_close) == (6, 1, True)
    assert row[4 + 6 : 4 + 6 + len(close)] == close


def test_a_row_alone_equals_the_same_row_in_a_batch_and_phases_are_batched(make_pipeline, record_generate):
    driver = ThinkingBudget(min_thinking_tokens=8, max_thinking_tokens=14, max_waits=2)
    pipeline = make_pipeline([CloseAfter(base=1, spread=4), driver])
    pad = pipeline.tokenizer.pad_token_id
    calls = record_generate(pipeline.model)
    batched = _rows(pipeline.generate(text=PROMPTS, max_new_tokens=24, return_output=True), pad)
    in_batch = driver.last_budgets
    assert len({(b.thinking_tokens, b.waits) for b in in_batch}) > 1  # rows with different remaining budgets
    assert len(calls) == 1 + max(b.waits for b in in_batch) + 1  # one rollout per phase for the whole batch
    for prompt, row, budgeted in zip(PROMPTS, batched, in_batch, strict=True):
        alone = _rows([pipeline.generate(text=prompt, max_new_tokens=24, return_output=True)], pad)
        assert alone == [row]
        assert driver.last_budgets == (budgeted,)
    assert pipeline.supports_batching is True


def test_the_reasoning_split_of_the_result_gives_the_thinking_and_the_answer(make_pipeline):
    driver = ThinkingBudget(max_thinking_tokens=4, answer_prefix=" answer:")
    prompted = ThinkingBudget(max_thinking_tokens=4, opened_at_start=True)
    pipeline, opened = make_pipeline([NoPad(), driver]), make_pipeline([NoPad(), prompted])
    tok = pipeline.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    (row,) = _rows([pipeline.generate(text=PROMPTS[2], max_new_tokens=16, return_output=True)], tok.pad_token_id)
    tail = enc(CLOSE + " answer:")
    thinking, answer = row[4:8], row[8 + len(tail) :]
    assert row[8 : 8 + len(tail)] == tail and answer
    split = split_thinking(tok.decode(row, skip_special_tokens=True))
    assert split.closed
    assert split.reasoning == tok.decode(thinking, skip_special_tokens=True).strip()
    assert split.answer == ("answer:" + tok.decode(answer, skip_special_tokens=True)).lstrip()
    # a template that opens the channel: the continuation starts inside it, as ProviderOptions.reasoning_opened_at_start
    prompt = tok(PROMPTS[2])["input_ids"] + enc(OPEN)
    out = opened.generate(input_ids=prompt, max_new_tokens=16, return_output=True)
    (row,) = _rows([out], tok.pad_token_id)
    assert row[4 : 4 + len(enc(CLOSE))] == enc(CLOSE)
    split = split_thinking(tok.decode(row, skip_special_tokens=True), opened_at_start=True)
    assert split.closed and split.reasoning == tok.decode(row[:4], skip_special_tokens=True).strip()
    assert split.answer == tok.decode(row[4 + len(enc(CLOSE)) :], skip_special_tokens=True).lstrip()


@pytest.mark.parametrize("budget", [3, 7, 11])
def test_new_tokens_never_exceed_max_new_tokens(make_pipeline, budget):
    driver = ThinkingBudget(max_thinking_tokens=5, answer_prefix=" answer:")
    pipeline = make_pipeline([NoPad(), driver])
    outputs = pipeline.generate(text=PROMPTS, max_new_tokens=budget, return_output=True)
    rows = _rows(outputs, pipeline.tokenizer.pad_token_id)
    assert [len(r) for r in rows] == [budget] * len(PROMPTS)
    assert [o.finish_reasons for o in outputs] == [["length"]] * len(PROMPTS)
    # 4 open-tag tokens: budget 3 cuts the tag, 7 leaves 3 thinking tokens (unclosed), 11 cuts the forced close
    assert {b.closed for b in driver.last_budgets} == {budget == 11}
    assert {b.thinking_tokens for b in driver.last_budgets} == {max(0, min(budget - 4, 5))}


def test_a_zero_cap_closes_the_channel_at_once_and_declarations():
    assert ThinkingBudget(max_thinking_tokens=0).max_rollouts_per_query() == 2  # no thinking rollout happens at 0
    assert ThinkingBudget(min_thinking_tokens=3, max_waits=2).max_rollouts_per_query() == 4
    assert ThinkingBudget.supports_batching is True and ThinkingBudget.supports_refill is False
    assert DEFAULT_THINK_TAGS == PROVIDER_TAGS


def test_zero_cap_rolls_out_only_the_answer(make_pipeline, record_generate):
    driver = ThinkingBudget(max_thinking_tokens=0)
    pipeline = make_pipeline([NoPad(), driver])
    tok = pipeline.tokenizer
    calls = record_generate(pipeline.model)
    (row,) = _rows([pipeline.generate(text=PROMPTS[0], max_new_tokens=12, return_output=True)], tok.pad_token_id)
    assert tok.decode(row[:9]) == OPEN + CLOSE and len(row) == 12 and len(calls) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "needs a budget"),
        ({"max_thinking_tokens": 4, "min_thinking_tokens": 5}, ValueError, "must be <= max_thinking_tokens=4"),
        ({"min_thinking_tokens": 0}, ValueError, "min_thinking_tokens must be >= 1"),
        ({"max_thinking_tokens": -1}, ValueError, "max_thinking_tokens must be >= 0"),
        ({"max_thinking_tokens": 4, "max_waits": -1}, ValueError, "max_waits must be >= 0"),
        ({"max_thinking_tokens": 4, "tags": ["<think>", ""]}, ValueError, "two different non-empty strings"),
        ({"max_thinking_tokens": 4, "tags": ["<t>", "<t>"]}, ValueError, "two different non-empty strings"),
        ({"min_thinking_tokens": 4, "wait": "ok </think>"}, ValueError, "wait=.* contains the close tag"),
        ({"max_thinking_tokens": 4, "answer_prefix": "</think>"}, ValueError, "answer_prefix=.* contains the close"),
        ({"max_thinking_tokens": "4"}, TypeError, "max_thinking_tokens must be"),
        ({"max_thinking_tokens": 4, "budget": 3}, TypeError, "unknown argument"),
    ],
)
def test_validation_names_the_field_and_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        ThinkingBudget(**kwargs)


def test_call_kwargs_the_driver_owns_and_untokenizable_tags_are_refused(make_pipeline):
    pipeline = make_pipeline([ThinkingBudget(max_thinking_tokens=3)])
    with pytest.raises(ValueError, match=r"sets \['min_new_tokens'\] itself"):
        pipeline.generate(text=PROMPTS[0], max_new_tokens=8, min_new_tokens=4)
    special = make_pipeline([ThinkingBudget(max_thinking_tokens=3, tags=["<|user|>", "<|assistant|>"])])
    with pytest.raises(ValueError, match="does not survive encode then decode"):
        special.generate(text=PROMPTS[0], max_new_tokens=8)


@pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")
def test_the_provider_splits_the_driven_continuation_into_reasoning_and_answer(make_pipeline):
    import anyio
    from inspect_ai.model import ChatMessageUser, ContentReasoning, GenerateConfig

    from steer_hydra.evaluation import ProviderOptions
    from steer_hydra.evaluation.provider import SteeringPipelineModelAPI

    pipeline = make_pipeline([NoPad(), ThinkingBudget(max_thinking_tokens=4)])
    tok = pipeline.tokenizer
    api = SteeringPipelineModelAPI("tiny", pipeline=pipeline, options=ProviderOptions())
    config = GenerateConfig(max_tokens=14, temperature=0)
    result = anyio.run(api.generate, [ChatMessageUser(content="hello there")], [], "auto", config)
    chat = [{"role": "user", "content": "hello there"}]
    (row,) = _rows([pipeline.generate(messages=chat, max_new_tokens=14, return_output=True)], tok.pad_token_id)
    reasoning, text = result.choices[0].message.content
    assert isinstance(reasoning, ContentReasoning)
    assert reasoning.reasoning == tok.decode(row[4:8], skip_special_tokens=True).strip()
    assert result.completion == tok.decode(row[13:], skip_special_tokens=True).lstrip() != ""
    assert tok.decode(row[8:13]) == CLOSE
