"""StoppingRules lowers stops and budgets into the call: stop reasons, truncation, budget as length."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.output import StoppingRules

CHAT = [{"role": "user", "content": "what is the capital of france"}]


def test_stop_text_halts_and_truncates_batched_and_single(make_pipeline):
    free = make_pipeline()
    tok = free.tokenizer
    chats = [CHAT, [{"role": "user", "content": "hi"}]]
    texts = [o.decode(tok)[0] for o in free.generate(messages=chats, max_new_tokens=24, return_output=True)]
    stop = texts[0][5:8]
    pipeline = make_pipeline([StoppingRules(stop_texts=[stop])])
    outs = pipeline.generate(messages=chats, max_new_tokens=24, return_output=True)
    assert outs[0].finish_reasons == ["stop"]
    assert pipeline.generate(messages=chats, max_new_tokens=24)[0] == texts[0][: texts[0].index(stop)]
    assert pipeline.generate(messages=CHAT, max_new_tokens=24) == texts[0][: texts[0].index(stop)]
    assert stop in outs[0].decode(tok)[0]  # ids keep the stop text


def test_budget_reports_length_and_only_tightens(make_pipeline):
    pipeline = make_pipeline([StoppingRules(budget=5)])
    out = pipeline.generate(messages=CHAT, max_new_tokens=20, return_output=True)
    assert out.output_ids.shape[1] == 5 and out.finish_reasons == ["length"]
    short = pipeline.generate(messages=CHAT, max_new_tokens=3, return_output=True)
    assert short.output_ids.shape[1] == 3


def test_stop_token_ids(make_pipeline):
    free = make_pipeline().generate(messages=CHAT, max_new_tokens=12, return_output=True)
    token = int(free.output_ids[0, 4])
    out = make_pipeline([StoppingRules(stop_token_ids=[token])]).generate(
        messages=CHAT, max_new_tokens=12, return_output=True
    )
    assert out.finish_reasons == ["stop"] and int(out.output_ids[0, -1]) == token


def test_lowered_params_and_direct_criteria(tiny):
    _, tok = tiny
    rules = StoppingRules(stop_texts=["END"], stop_token_ids=[7], budget=4)
    assert rules.export_generation_params({}) == {"stop_strings": ["END"], "stop_token_ids": [7], "max_new_tokens": 4}
    assert rules.requirements() == frozenset() and rules.supports_batching
    rules.tokenizer = tok
    prompt = torch.tensor([[1, 2, 3]])
    criteria = rules.get_stopping_criteria(prompt, {})
    assert len(criteria) == 3
    end_ids = tok("END", add_special_tokens=False)["input_ids"]
    seq = torch.tensor([[1, 2, 3, *end_ids]])
    assert bool(criteria[0](seq, None)[0]) and not bool(criteria[0](prompt, None)[0])
    assert bool(criteria[1](torch.tensor([[1, 2, 3, 7]]), None)[0])
    assert bool(criteria[2](torch.tensor([[1, 2, 3, 9, 9, 9, 9]]), None)[0])


def test_args_errors():
    with pytest.raises(ValueError, match="at least one of stop_texts"):
        StoppingRules()
    with pytest.raises(ValueError, match="budget must be a positive"):
        StoppingRules(budget=0)
    with pytest.raises(TypeError, match="StoppingRules.stop_texts must be"):
        StoppingRules(stop_texts="END")
