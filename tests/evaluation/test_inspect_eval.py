"""Real `inspect_ai.eval` runs on the tiny model through the steer_hydra provider (offline, CPU)."""

from __future__ import annotations

import pytest
import torch
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool

from steer_hydra.core.controls import InputControl
from steer_hydra.evaluation import ProviderOptions, as_inspect_model, runtime_kwargs_solver
from steer_hydra.testing.evals import eval_one

# Inspect's retry helper still passes a deprecated tenacity argument.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

WORDS = ["paris", "london", "rome", "berlin", "madrid", "tokyo", "france", "spain"]


class RowTagRecorder(InputControl):
    """A batch-safe input control declaring a row-scoped `tag`; records what each dispatch hands it."""

    supports_batching = True
    RUNTIME_KWARGS_SCHEMA = [
        {"name": "tag", "type": "list[str]", "required": False, "scope": "row", "help": "one word per row"}
    ]

    def _configure(self) -> None:
        self.message_batches: list[tuple[list[str], list | None]] = []
        self.token_batches: list[tuple[list[str], list | None]] = []

    def adapt_messages(self, messages_batch, runtime_kwargs):
        self.message_batches.append(([chat[-1]["content"] for chat in messages_batch], runtime_kwargs.get("tag")))
        return messages_batch

    def adapt(self, input_ids: torch.Tensor, runtime_kwargs):
        texts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        self.token_batches.append((texts, runtime_kwargs.get("tag")))
        return input_ids


def tagged_task(words, solver=None) -> Task:
    samples = [
        Sample(input=f"tell me about {word}", target=word, metadata={"runtime_kwargs": {"tag": [word]}})
        for word in words
    ]
    return Task(dataset=MemoryDataset(samples), solver=solver or [runtime_kwargs_solver()], scorer=includes())


def run(task, model, tmp_path):
    return eval_one(task, model, log_dir=tmp_path, temperature=0, max_tokens=8)


def test_eval_batches_adapts_each_prompt_once_and_aligns_row_kwargs(make_pipeline, tmp_path):
    recorder = RowTagRecorder()
    model = as_inspect_model(make_pipeline([recorder]), options=ProviderOptions(max_batch_size=4))
    log = run(tagged_task(WORDS), model, tmp_path)
    assert log.status == "success" and len(log.samples) == 8
    assert log.eval.model == "steer_hydra/steering-pipeline"
    sizes = [len(prompts) for prompts, _ in recorder.message_batches]
    assert sum(sizes) == 8 and 1 < max(sizes) <= 4
    adapted = sorted(content for prompts, _ in recorder.message_batches for content in prompts)
    assert adapted == sorted(f"tell me about {word}" for word in WORDS)  # every prompt adapted exactly once
    for prompts, tags in recorder.message_batches:
        assert tags == [[content.rsplit(" ", 1)[1]] for content in prompts]
    assert recorder.token_batches == []  # handled in the message phase
    assert all(sample.output.completion is not None for sample in log.samples)
    assert model.api.inert_runtime_kwargs == frozenset()


def test_eval_pasta_receives_row_aligned_substrings(make_pipeline, tmp_path):
    from steer_hydra.controls.state.pasta import PASTA

    class RecordingPasta(PASTA):
        def _configure(self) -> None:
            super()._configure()
            self.seen: list[tuple[list[str], list]] = []

        def get_hooks(self, input_ids, runtime_kwargs, **kwargs):
            prompts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
            self.seen.append((prompts, runtime_kwargs.get("substrings")))
            return super().get_hooks(input_ids, runtime_kwargs, **kwargs)

    pasta = RecordingPasta(head_config=[0, 1], alpha=2.0, scale_position="include")
    # static batching: one get_hooks call per dispatch (refill rebuilds hooks per batch composition)
    options = ProviderOptions(max_batch_size=4, batching="static")
    model = as_inspect_model(make_pipeline([pasta]), options=options)
    words = WORDS[:6]
    samples = [
        Sample(input=f"tell me about {word}", target=word, metadata={"runtime_kwargs": {"substrings": [word]}})
        for word in words
    ]
    task = Task(dataset=MemoryDataset(samples), solver=[runtime_kwargs_solver()], scorer=includes())
    log = run(task, model, tmp_path)
    assert log.status == "success" and len(log.samples) == 6
    collected = []
    for prompts, substrings in pasta.seen:
        assert isinstance(substrings, list) and len(substrings) == len(prompts)
        for prompt, row in zip(prompts, substrings, strict=True):
            assert isinstance(row, list) and len(row) == 1 and f"about {row[0]}" in prompt
            collected.append(row[0])
    assert sorted(collected) == sorted(words)
    assert max(len(prompts) for prompts, _ in pasta.seen) > 1


def test_eval_template_less_tokenizer_takes_the_text_path(make_pipeline, tmp_path):
    recorder = RowTagRecorder()
    pipeline = make_pipeline([recorder], chat=False)
    with pytest.warns(UserWarning, match="adapt_messages"):
        model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=2))
    assert model.api.prompt_path == "text"
    log = run(tagged_task(WORDS[:4]), model, tmp_path)
    assert log.status == "success" and len(log.samples) == 4
    assert recorder.message_batches == []  # no message phase on the text path
    rows = [(text, tag) for texts, tags in recorder.token_batches for text, tag in zip(texts, tags, strict=True)]
    assert sorted(tag[0] for _, tag in rows) == sorted(WORDS[:4])
    assert all(text.endswith(f"tell me about {tag[0]}") for text, tag in rows)


def test_eval_with_tools_fails_with_the_generation_only_error(make_pipeline, tmp_path):
    @tool
    def add():
        async def execute(x: int, y: int) -> int:
            """Add two integers.

            Args:
                x: The first integer.
                y: The second integer.
            """
            return x + y

        return execute

    model = as_inspect_model(make_pipeline(), options=ProviderOptions(max_batch_size=2))
    task = Task(
        dataset=MemoryDataset([Sample(input="What is 1 + 1?", target="2")]),
        solver=[use_tools(add()), generate()],
        scorer=includes(),
    )
    log = run(task, model, tmp_path)
    assert log.status == "error"
    assert "NotImplementedError" in log.error.message or "NotImplementedError" in log.error.traceback
    assert "generation-only" in log.error.message
