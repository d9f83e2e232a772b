"""StreamCollator and batching="stream" on backend=vllm_serve against the loopback server (the tiny model through
Hugging Face): what auto picks, slots kept busy (no waves), identity with the static path, per-request seeds."""

from __future__ import annotations

import pytest
import torch
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import DecodingDriver, DriverResult
from steer_hydra.evaluation import ProviderOptions, as_inspect_model
from steer_hydra.evaluation.batching import BatchRequest, request_digest, request_seed
from steer_hydra.evaluation.stream_serving import StreamCollator
from steer_hydra.testing.evals import eval_one

WORDS = ["paris", "london", "rome", "berlin", "madrid", "tokyo", "oslo", "lima"]


class _First(DecodingDriver):
    """A decoding driver that keeps the first of two sampled proposals."""

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.SAMPLED_ROLLOUTS})

    def decode(self, input_ids, attention_mask, *, rollout, runtime_kwargs, tokenizer, max_new_tokens, **gen):
        rows = rollout(input_ids, attention_mask, max_new_tokens=max_new_tokens, num_return_sequences=2, do_sample=True)
        return DriverResult(rows[:1])


def run(pipeline, *, batching, samples=None, epochs=1, **generate):
    samples = samples or [Sample(input=f"tell me about {w}", target=w, id=w) for w in WORDS]
    options = ProviderOptions(max_batch_size=2, batching=batching)
    model = as_inspect_model(pipeline, options=options)
    assert model.api.batching == batching
    log = eval_one(
        Task(dataset=MemoryDataset(samples), scorer=includes(), epochs=epochs), model, log_samples=True, **generate
    )
    model.api.close()
    assert log.status == "success", log.error
    return log.samples


def test_auto_streams_where_the_backend_batches_concurrent_calls_and_no_driver_runs(serve_client, make_pipeline):
    auto = ProviderOptions()
    assert auto.batching_in_force(serve_client()) == "stream"
    assert auto.batching_in_force(make_pipeline()) == "refill"  # Hugging Face: no stream
    driven = serve_client([_First()])
    assert driven.stream_blockers() == ["a decoding driver owns the decode loop"]
    assert auto.batching_in_force(driven) == "static"
    with pytest.raises(ValueError, match=r"batching='stream' but this pipeline cannot stream: backend 'huggingface'"):
        ProviderOptions(batching="stream").batching_in_force(make_pipeline())


def test_a_slow_request_does_not_hold_the_other_slots_when_streaming(serve_client, loopback):
    spans = {}
    for batching in ("static", "stream"):
        loopback.reset()  # this round's spans only
        pipeline = serve_client(max_concurrency=2)
        loopback.stall_next(1.5)  # the first request served waits 1.5 s
        run(pipeline, batching=batching, temperature=0, max_tokens=4)
        slow = max(loopback.spans, key=lambda span: span[1] - span[0])
        spans[batching] = [s for s in loopback.spans if slow[0] < s[0] < slow[1]]  # started while the slow one ran
    # static batches of two: the slow request's batch-mate runs, the next batch waits for the slow one
    assert len(spans["static"]) <= 1
    # streaming: the other slot serves the other seven requests while the slow one runs
    assert len(spans["stream"]) == len(WORDS) - 1


def test_streamed_greedy_completions_n_and_stop_strings_equal_the_static_paths(serve_client):
    pipeline = serve_client()
    static = {s.id: s for s in run(pipeline, batching="static", temperature=0, max_tokens=12, num_choices=2)}
    streamed = {s.id: s for s in run(pipeline, batching="stream", temperature=0, max_tokens=12, num_choices=2)}
    assert {k: [c.message.text for c in s.output.choices] for k, s in streamed.items()} == {
        k: [c.message.text for c in s.output.choices] for k, s in static.items()
    }
    assert all(len(s.output.choices) == 2 for s in streamed.values())
    stop = static["paris"].output.completion[2:5]
    assert stop
    static = {s.id: s for s in run(pipeline, batching="static", temperature=0, max_tokens=12, stop_seqs=[stop])}
    streamed = {s.id: s for s in run(pipeline, batching="stream", temperature=0, max_tokens=12, stop_seqs=[stop])}
    assert {k: s.output.completion for k, s in streamed.items()} == {k: s.output.completion for k, s in static.items()}
    assert streamed["paris"].output.stop_reason == static["paris"].output.stop_reason == "stop"


def test_a_streamed_requests_seed_depends_on_its_content_and_occurrence_only(serve_client):
    def record(word, **gen):
        return BatchRequest([{"role": "user", "content": word}], {"seed": 7, **gen}, {}, 1, "key")

    def seed(seed, rec, occurrence):
        return request_seed(seed, request_digest(rec), occurrence)

    assert seed(7, record("a"), 0) == seed(7, record("a"), 0)
    seeds = {seed(7, record("a"), 0), seed(7, record("a"), 1), seed(7, record("b"), 0)}
    seeds |= {seed(8, record("a"), 0), seed(7, record("a", temperature=0.5), 0)}
    assert len(seeds) == 5

    pipeline = serve_client()
    samples = [Sample(input=f"tell me about {w}", target=w, id=w) for w in WORDS[:4]]

    def drawn():
        log = run(pipeline, batching="stream", samples=samples, epochs=2, temperature=1.0, seed=5, max_tokens=10)
        by_sample: dict[str, list[str]] = {}
        for sample in log:
            by_sample.setdefault(sample.id, []).append(sample.output.completion)
        return {k: sorted(v) for k, v in by_sample.items()}

    first, second = drawn(), drawn()
    assert first == second  # a rerun draws the same completions for each sample
    assert sum(a != b for a, b in first.values()) >= 3  # the epochs of one sample draw differently


def test_the_collator_runs_each_request_alone_and_fails_only_its_own(serve_client):
    pipeline = serve_client()
    collator = StreamCollator(
        pipeline, concurrency=4, batch_ceiling=2, prompt_path="messages", declared_scopes={}, static_runtime_kwargs={}
    )
    good = collator.admit([{"role": "user", "content": "hi"}], {"max_new_tokens": 3, "do_sample": False}, {}, 1)
    bad = collator.admit([{"role": "user", "content": "hi"}], {"max_new_tokens": 3, "bogus_kwarg": 1}, {}, 1)

    import anyio

    async def main():
        results = {}

        async def serve(name, record):
            try:
                results[name] = await collator.serve(record)
            except Exception as error:  # noqa: BLE001 - the failure is what is checked
                results[name] = error

        async with anyio.create_task_group() as group:
            group.start_soon(serve, "good", good)
            group.start_soon(serve, "bad", bad)
        return results

    results = anyio.run(main)
    assert isinstance(results["bad"], (TypeError, ValueError)) and "bogus_kwarg" in str(results["bad"])
    assert torch.is_tensor(results["good"].output_ids) and results["good"].output_ids.shape[0] == 1
    assert collator.queued == 0
