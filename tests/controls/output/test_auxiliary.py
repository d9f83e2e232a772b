"""A second model's PrefixCache: rows re-packed with left padding the call's prompt mask does not describe (a driver's
rollout) read as each row alone; contrastive decoding composes with a decoding driver, a row alone as in a batch."""

from __future__ import annotations

import torch

from steer_hydra.controls.output import ContrastiveDecoding, ThinkingBudget
from steer_hydra.controls.output.auxiliary import PrefixCache
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.tensors import pad_left
from steer_hydra.models import TINY_REF, TinySpec, build_tiny_model

AMATEUR = "steer_hydra:tiny?seed=1&hidden_size=32"


def test_rows_repacked_with_new_left_padding_score_as_each_row_alone():
    model, tokenizer = build_tiny_model(TinySpec(seed=1, hidden_size=32))
    pad = tokenizer.pad_token_id
    rows = [tokenizer.encode("hello there cat"), tokenizer.encode("a"), tokenizer.encode("count one two three four")]
    prompt_ids, prompt_mask = pad_left([r[:1] for r in rows], pad)  # the call's prompts: not what is re-packed below
    ids, _ = pad_left(rows, pad)
    assert (ids == pad).any()  # left padding the call's prompt mask does not describe
    with torch.no_grad():
        alone = torch.stack([model(input_ids=torch.tensor([r])).logits[0, -1] for r in rows])
    cached = PrefixCache(model, prompt_ids, prompt_mask, pad_token_id=pad).advance(ids).logits[:, -1]
    torch.testing.assert_close(cached, alone, atol=1e-4, rtol=1e-4)
    unmasked = PrefixCache(model, prompt_ids, prompt_mask).advance(ids).logits[:, -1]
    assert not torch.allclose(unmasked, alone, atol=1e-3)  # the pads would otherwise count as tokens


def test_contrastive_decoding_under_a_thinking_budget_decodes_a_row_alone_as_in_a_batch():
    chats = [[{"role": "user", "content": text}] for text in ("hello there cat and dog", "a", "count to five")]
    with SteeringPipeline(
        TINY_REF, controls=[ContrastiveDecoding(amateur=AMATEUR, alpha=1e-4), ThinkingBudget(max_thinking_tokens=3)]
    ) as pipeline:
        pipeline.steer()
        batch = pipeline.generate(messages=chats, max_new_tokens=20, do_sample=False)
        alone = [pipeline.generate(messages=[chat], max_new_tokens=20, do_sample=False)[0] for chat in chats]
    assert batch == alone
    assert all(text.startswith("<think>") and "</think>" in text for text in batch)
