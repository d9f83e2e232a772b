"""Substring to token spans for PASTA: offsets on the decoded prompt, id search when re-encoding differs."""

from __future__ import annotations

from steer_hydra.controls.state.spans import token_spans


def test_spans_map_characters_to_tokens(tiny):
    _, tokenizer = tiny
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "the capital of france is paris"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    spans, missing = token_spans(tokenizer, ids, ["capital of france", "paris", "london"])
    assert missing == ["london"]
    decoded = [tokenizer.decode(ids[span.start : span.stop]) for span in spans]
    assert decoded[0].strip() == "capital of france" and decoded[1].strip() == "paris"


def test_first_occurrence_is_used(tiny):
    _, tokenizer = tiny
    ids = tokenizer("paris is paris")["input_ids"]
    (span,), _ = token_spans(tokenizer, ids, ["paris"])
    assert span.start == 1  # after the BOS


def test_id_search_when_reencoding_is_not_faithful(tiny):
    _, tokenizer = tiny
    # "cat" spelled byte by byte is decoded to text that re-encodes differently, so offsets cannot be trusted
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in "cat"]
    paris = tokenizer(" paris", add_special_tokens=False)["input_ids"]
    ids = tokenizer("hello", add_special_tokens=False)["input_ids"] + spelled + paris
    spans, missing = token_spans(tokenizer, ids, ["paris"])
    assert missing == [] and list(spans[0]) == list(range(len(ids) - len(paris), len(ids)))
