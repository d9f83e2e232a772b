"""FewShot builds the directive and labeled examples per row, reproducibly, on both input paths."""

from __future__ import annotations

import pytest

from steer_hydra.controls.input import FewShot, SystemPrompt
from steer_hydra.core import SteeringPipeline

POS = [{"prompt": f"p{i}", "response": f"good{i}"} for i in range(6)]
NEG = [{"prompt": f"n{i}", "response": f"bad{i}"} for i in range(6)]


def _system(tok, output) -> str:
    text = tok.decode(output.adapted_input_ids[0], skip_special_tokens=False)
    return text.split("<|system|>\n", 1)[1].split("</s>", 1)[0]


def test_block_has_directive_and_k_labeled_examples_per_pool():
    control = FewShot(
        directive="Be kind.", positive_example_pool=POS, negative_example_pool=NEG, k_positive=2, k_negative=1
    )
    block = control.block("hello", {})
    assert block.startswith("Be kind.\n\n")
    assert block.count("Example (positive):") == 2 and block.count("Example (negative):") == 1
    assert block == control.block("hello", {})  # reproducible for the same prompt
    other_seed = FewShot(positive_example_pool=POS, k_positive=3, seed=1)
    draws = {other_seed.block(f"prompt {i}", {}) for i in range(8)}
    assert len(draws) > 1  # selection varies per row


def test_runtime_kwargs_replace_pool_draws():
    control = FewShot(positive_example_pool=POS, k_positive=2, negative_example_pool=NEG, k_negative=2)
    given = [{"prompt": "X", "response": "Y"}]
    block = control.block("hello", {"positive_examples": given, "negative_examples": []})
    assert block == "Example (positive):\nPrompt: X\nResponse: Y"


def test_messages_path_batched_matches_single_and_merges_system(make_pipeline):
    control = FewShot(directive="Do it.", positive_example_pool=POS, k_positive=1)
    pipeline = make_pipeline([control])
    tok = pipeline.tokenizer
    chats = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "yo"}],
    ]
    batched = pipeline.generate(messages=chats, max_new_tokens=1, return_output=True)
    for chat, out in zip(chats, batched, strict=True):
        single = pipeline.generate(messages=chat, max_new_tokens=1, return_output=True)
        assert _system(tok, out) == _system(tok, single)
    assert _system(tok, batched[0]) == control.block("hi", {})
    assert _system(tok, batched[1]) == "S\n\n" + control.block("yo", {})


def test_text_path_retemplates(make_pipeline):
    control = FewShot(directive="Do it.", positive_example_pool=POS, k_positive=1)
    pipeline = make_pipeline([control])
    out = pipeline.generate(text=["hi", "yo"], max_new_tokens=1, return_output=True)
    assert _system(pipeline.tokenizer, out[1]) == control.block("yo", {})


def test_composes_after_system_prompt_on_messages(make_pipeline):
    few = FewShot(directive="Do it.")
    pipeline = make_pipeline([SystemPrompt(text="Be brief."), few])
    out = pipeline.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=1, return_output=True)
    assert _system(pipeline.tokenizer, out) == "Be brief.\n\nDo it."


def test_args_errors_name_the_field():
    with pytest.raises(ValueError, match="k_positive is required"):
        FewShot(positive_example_pool=POS)
    with pytest.raises(ValueError, match=r"k_negative=9 must be in \[0, 6\]"):
        FewShot(negative_example_pool=NEG, k_negative=9)
    with pytest.raises(ValueError, match="lacks field 'response'"):
        FewShot(positive_example_pool=[{"prompt": "x"}], k_positive=1)
    with pytest.raises(TypeError, match="FewShot.k_positive must be"):
        FewShot(positive_example_pool=POS, k_positive="two")


def test_declares_call_scoped_examples(tiny):
    model, tok = tiny
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[FewShot()])
    from steer_hydra.core import declared_scopes

    assert declared_scopes(pipeline.controls) == {"positive_examples": "call", "negative_examples": "call"}
