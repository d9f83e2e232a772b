"""UserPrefix puts its text before the user's message: on the messages path (last, first or every user turn), on the
text path (re-templated as one user turn, or plain text without a template), per row, batched as alone, refilled,
and on an engine backend (the served request holds the prefixed prompt)."""

from __future__ import annotations

import pytest

from steer_hydra.controls.input import SystemPrompt, UserPrefix
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.models import build_tiny_model
from steer_hydra.testing.loopback_server import LoopbackCompletionsServer

SYSTEM = {"role": "system", "content": "be brief"}
CHAT = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
CHAT += [{"role": "user", "content": "what is the capital of france"}]


def _rendered(tok, chat) -> str:
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def _prompt_text(tok, output) -> str:
    return tok.decode(output.adapted_input_ids[0], skip_special_tokens=False).replace(tok.pad_token, "")


def _with(chat, contents: dict[int, str]) -> list[dict[str, str]]:
    return [{**m, "content": contents.get(i, m["content"])} for i, m in enumerate(chat)]


@pytest.mark.parametrize(
    ("turns", "changed"),
    [("last", {3: "BE SHORT\n\nwhat is the capital of france"}), ("first", {1: "BE SHORT\n\nhi"})],
)
def test_messages_path_prefixes_the_chosen_user_turn_only(make_pipeline, turns, changed):
    pipeline = make_pipeline([UserPrefix(text="BE SHORT", turns=turns)])
    out = pipeline.generate(messages=CHAT, max_new_tokens=1, return_output=True)
    assert _prompt_text(pipeline.tokenizer, out) == _rendered(pipeline.tokenizer, _with(CHAT, changed))
    every = make_pipeline([UserPrefix(text="X", separator=" ", turns="all")])
    out = every.generate(messages=CHAT, max_new_tokens=1, return_output=True)
    expected = _with(CHAT, {1: "X hi", 3: "X what is the capital of france"})
    assert _prompt_text(every.tokenizer, out) == _rendered(every.tokenizer, expected)


def test_it_composes_with_a_system_prompt_and_per_row_prefixes(make_pipeline):
    pipeline = make_pipeline([SystemPrompt(text="SYS"), UserPrefix(text="DEFAULT")])
    tok = pipeline.tokenizer
    chats = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}], [{"role": "user", "content": "c"}]]
    outs = pipeline.generate(
        messages=chats, max_new_tokens=1, return_output=True, runtime_kwargs={"user_prefix": ["ONE", None, "THREE"]}
    )
    for out, prefix, user in zip(outs, ["ONE", "DEFAULT", "THREE"], "abc", strict=True):
        chat = [{"role": "system", "content": "SYS"}, {"role": "user", "content": f"{prefix}\n\n{user}"}]
        assert _prompt_text(tok, out) == _rendered(tok, chat)
    with pytest.raises(TypeError, match=r"runtime kwarg 'user_prefix' must be a string"):
        pipeline.generate(messages=chats, max_new_tokens=1, runtime_kwargs={"user_prefix": [1, 2, 3]})


def test_text_path_retemplates_as_one_user_turn_or_prepends_without_a_template(make_pipeline):
    pipeline = make_pipeline([UserPrefix(text="BE SHORT")])
    tok = pipeline.tokenizer
    outs = pipeline.generate(text=["what is the capital of france", "hi"], max_new_tokens=1, return_output=True)
    for text, out in zip(["what is the capital of france", "hi"], outs, strict=True):
        assert _prompt_text(tok, out) == _rendered(tok, [{"role": "user", "content": f"BE SHORT\n\n{text}"}])
    plain = make_pipeline([UserPrefix(text="BE SHORT")], chat=False)
    out = plain.generate(text="hi", max_new_tokens=1, return_output=True)
    assert plain.tokenizer.decode(out.adapted_input_ids[0], skip_special_tokens=True) == "BE SHORT\n\nhi"


def test_a_row_alone_equals_the_row_in_a_batch_and_refill_admits_it(make_pipeline):
    pipeline = make_pipeline([UserPrefix(text="Answer with one word.")])
    chats = [[{"role": "user", "content": t}] for t in ("hello there cat and dog", "a", "count one two three")]
    batch = pipeline.generate(messages=chats, max_new_tokens=8, do_sample=False)
    assert batch == [pipeline.generate(messages=chat, max_new_tokens=8, do_sample=False) for chat in chats]
    assert pipeline.supports_batching and pipeline.refill_blockers() == []


def test_it_runs_on_an_engine_backend_the_served_prompt_holds_the_prefix():
    model, tokenizer = build_tiny_model()
    reference = SteeringPipeline(model=model, tokenizer=tokenizer).steer()
    chat = [{"role": "user", "content": "hi"}]
    with LoopbackCompletionsServer(reference, model_name="tiny") as server:
        spec = BackendSpec("vllm_serve", {"base_url": server.base_url, "retry_backoff": 0.0})
        with SteeringPipeline(tokenizer=tokenizer, controls=[UserPrefix(text="BE SHORT")], backend=spec) as served:
            assert served.check().ok
            served.steer()
            text = served.generate(messages=chat, max_new_tokens=5, do_sample=False)
        (request,) = server.completion_requests()
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "BE SHORT\n\nhi"}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    assert request.body["prompt"] == list(expected)
    assert text == reference.generate(messages=[{"role": "user", "content": "BE SHORT\n\nhi"}], max_new_tokens=5)
    reference.release()
    for backend in ("vllm", "vllm_serve", "huggingface"):
        assert SteeringPipeline("steer_hydra:tiny", controls=[UserPrefix(text="x")], backend=backend).check().ok


def test_args_errors_name_the_field_and_the_fix():
    with pytest.raises(ValueError, match=r"UserPrefix.text must be a non-empty string.*Fix"):
        UserPrefix(text=" ")
    with pytest.raises(TypeError, match=r"UserPrefix.turns must be one of \('last', 'first', 'all'\)"):
        UserPrefix(text="x", turns="middle")
