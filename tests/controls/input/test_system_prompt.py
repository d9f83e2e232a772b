"""SystemPrompt changes the prompt exactly as specified, on the messages and text paths, batched and single."""

from __future__ import annotations

import pytest

from steer_hydra.controls.input import SystemPrompt

USER = {"role": "user", "content": "what is the capital of france"}
SYSTEM = {"role": "system", "content": "be brief"}


def _rendered(tok, chat) -> str:
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def _prompt_text(tok, output) -> str:
    return tok.decode(output.adapted_input_ids[0], skip_special_tokens=False).replace(tok.pad_token, "")


@pytest.mark.parametrize(
    ("mode", "expected_system"),
    [("prepend", "ANSWER\n\nbe brief"), ("append", "be brief\n\nANSWER"), ("replace", "ANSWER")],
)
def test_messages_path_modes_with_existing_system(make_pipeline, mode, expected_system):
    pipeline = make_pipeline([SystemPrompt(text="ANSWER", mode=mode)])
    out = pipeline.generate(messages=[SYSTEM, USER], max_new_tokens=1, return_output=True)
    expected = _rendered(pipeline.tokenizer, [{"role": "system", "content": expected_system}, USER])
    assert _prompt_text(pipeline.tokenizer, out) == expected


@pytest.mark.parametrize("mode", ["prepend", "append", "replace"])
def test_messages_path_inserts_one_system_message_in_a_batch(make_pipeline, mode):
    pipeline = make_pipeline([SystemPrompt(text="ANSWER", mode=mode)])
    chats = [[USER], [SYSTEM, USER]]
    outs = pipeline.generate(messages=chats, max_new_tokens=1, return_output=True)
    tok = pipeline.tokenizer
    assert _prompt_text(tok, outs[0]) == _rendered(tok, [{"role": "system", "content": "ANSWER"}, USER])
    assert _prompt_text(tok, outs[1]).count("<|system|>") == 1


@pytest.mark.parametrize("batched", [False, True])
def test_text_path_retemplates_with_the_system_message(make_pipeline, batched):
    pipeline = make_pipeline([SystemPrompt(text="ANSWER", mode="append")])
    tok = pipeline.tokenizer
    texts = [USER["content"], "hi"] if batched else USER["content"]
    outs = pipeline.generate(text=texts, max_new_tokens=1, return_output=True)
    outs = outs if batched else [outs]
    for text, out in zip([texts] if not batched else texts, outs, strict=True):
        expected = _rendered(tok, [{"role": "system", "content": "ANSWER"}, {"role": "user", "content": text}])
        assert _prompt_text(tok, out) == expected


def test_text_path_without_template_prepends_the_text(make_pipeline):
    pipeline = make_pipeline([SystemPrompt(text="ANSWER")], chat=False)
    out = pipeline.generate(text="hi", max_new_tokens=1, return_output=True)
    assert pipeline.tokenizer.decode(out.adapted_input_ids[0], skip_special_tokens=True) == "ANSWER\n\nhi"


def test_args_errors_name_the_field():
    with pytest.raises(ValueError, match="SystemPrompt.text"):
        SystemPrompt(text="  ")
    with pytest.raises(TypeError, match=r"SystemPrompt.mode must be one of \('prepend', 'append', 'replace'\)"):
        SystemPrompt(text="x", mode="before")
    with pytest.raises(TypeError, match="unknown argument"):
        SystemPrompt(txt="x")
    with pytest.raises(TypeError, match="text"):
        SystemPrompt()
