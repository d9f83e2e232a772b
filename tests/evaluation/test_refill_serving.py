"""RefillCollator and ProviderOptions.batching on the tiny model: identity with static calls, early delivery,
per-request kwargs, static fallbacks, cancellation, and a real Inspect eval."""

from __future__ import annotations

import time
from importlib.util import find_spec

import anyio
import pytest
import torch
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes

from steer_hydra.controls.state import PASTA, ActAdd
from steer_hydra.evaluation import ProviderOptions, as_inspect_model, runtime_kwargs_solver
from steer_hydra.evaluation.refill_serving import RefillCollator
from steer_hydra.testing.evals import eval_one

pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

BACKENDS = [
    "asyncio",
    pytest.param("trio", marks=pytest.mark.skipif(find_spec("trio") is None, reason="trio is not installed")),
]
WORDS = ["paris", "london", "rome", "berlin", "madrid", "tokyo"]


def chat(word):
    return [{"role": "user", "content": f"tell me about the city of {word} please"}]


def collator_for(pipeline, ceiling=2, scopes=None):
    return RefillCollator(
        pipeline,
        batch_ceiling=ceiling,
        prompt_path="messages",
        declared_scopes=scopes or {},
        static_runtime_kwargs={},
    )


def static_ids(pipeline, word, max_new_tokens, runtime_kwargs=None):
    output = pipeline.generate(
        messages=chat(word),
        return_output=True,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        runtime_kwargs=runtime_kwargs,
    )
    return output.output_ids[0].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_requests_match_static_calls_and_short_ones_return_first(make_pipeline, backend):
    pipeline = make_pipeline()
    collator = collator_for(pipeline, ceiling=2)
    limits = [24, 3, 10, 2, 16, 5]
    finished: list[int] = []
    outputs = {}

    async def one(i):
        record = collator.admit(chat(WORDS[i]), {"max_new_tokens": limits[i], "do_sample": False}, {}, 1)
        outputs[i] = await collator.serve(record)
        finished.append(i)

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(len(WORDS)):
                tg.start_soon(one, i)

    anyio.run(main, backend=backend)
    for i, word in enumerate(WORDS):
        assert outputs[i].output_ids[0].tolist() == static_ids(pipeline, word, limits[i])
        assert outputs[i].finish_reasons == ["length"]
    assert finished.index(1) < finished.index(0)  # a 3-token row is delivered while the 24-token row decodes
    assert collator.engine.stats.admitted == 6 and collator.static_dispatches == 0
    assert collator.engine.idle and collator.queued == 0


def test_a_sampled_requests_draws_do_not_depend_on_what_it_was_admitted_with(make_pipeline):
    pipeline = make_pipeline()
    sampling = {"max_new_tokens": 8, "do_sample": True, "temperature": 1.0, "seed": 3}

    def drawn(ceiling, order):
        collator = collator_for(pipeline, ceiling=ceiling)
        outputs = {}

        async def one(i):
            record = collator.admit(chat(WORDS[i % 3]), sampling, {}, 1)  # each prompt twice: two occurrences
            outputs[i] = await collator.serve(record)

        async def main():
            async with anyio.create_task_group() as tg:
                for i in order:
                    tg.start_soon(one, i)

        anyio.run(main)
        by_prompt: dict[int, list] = {}
        for i, output in outputs.items():
            by_prompt.setdefault(i % 3, []).append(output.output_ids[0].tolist())
        return {k: sorted(v) for k, v in by_prompt.items()}

    together = drawn(ceiling=6, order=range(6))
    apart = drawn(ceiling=1, order=reversed(range(6)))
    assert together == apart  # admission groups of six or of one, in either order: the same draws per prompt
    assert all(a != b for a, b in together.values())  # the two occurrences of a prompt draw differently


def test_admitted_requests_keep_their_own_runtime_kwargs(make_pipeline):
    pasta = PASTA(head_config=[0, 1], alpha=0.01, scale_position="exclude")
    pipeline = make_pipeline([pasta])
    collator = collator_for(pipeline, ceiling=3, scopes={"substrings": "row"})
    outputs = {}

    async def one(i):
        record = collator.admit(
            chat(WORDS[i]), {"max_new_tokens": 6 + 3 * i, "do_sample": False}, {"substrings": [WORDS[i]]}, 1
        )
        outputs[i] = await collator.serve(record)

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(one, i)

    anyio.run(main)
    for i in range(5):
        expected = static_ids(pipeline, WORDS[i], 6 + 3 * i, {"substrings": [[WORDS[i]]]})
        assert outputs[i].output_ids[0].tolist() == expected
    other = static_ids(pipeline, WORDS[4], 18, {"substrings": [["tell"]]})
    assert other != outputs[4].output_ids[0].tolist()  # the row used its own spans, which matter


def test_multi_candidate_request_takes_the_static_path_beside_the_loop(make_pipeline):
    pipeline = make_pipeline()
    collator = collator_for(pipeline, ceiling=4)
    outputs = {}

    async def one(i, n):
        gen = {"max_new_tokens": 5, "do_sample": n > 1, "seed": 1} if n > 1 else {"max_new_tokens": 8}
        record = collator.admit(chat(WORDS[i]), gen, {}, n)
        outputs[i] = await collator.serve(record)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0, 1)
            tg.start_soon(one, 1, 3)
            tg.start_soon(one, 2, 1)

    anyio.run(main)
    assert outputs[1].output_ids.shape[0] == 3
    assert collator.static_dispatches == 1 and collator.engine.stats.admitted == 2
    assert outputs[2].output_ids[0].tolist() == static_ids(pipeline, WORDS[2], 8)


def test_a_waiter_cancelled_while_queued_is_never_admitted(make_pipeline):
    pipeline = make_pipeline()
    collator = collator_for(pipeline, ceiling=1)
    seen = []

    async def main():
        first = collator.admit(chat(WORDS[0]), {"max_new_tokens": 30}, {}, 1)
        second = collator.admit(chat(WORDS[1]), {"max_new_tokens": 30}, {}, 1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(collator.serve, first)
            while collator.engine is None or collator.engine.stats.admitted < 1:  # first holds the only slot
                await anyio.sleep(0.01)
            with anyio.CancelScope() as scope:
                scope.cancel()
                await collator.serve(second)
            seen.append(second.done.is_set())

    anyio.run(main)
    assert seen == [False] and collator.engine.stats.admitted == 1


def test_batching_option_resolves_and_refuses_what_cannot_refill(make_pipeline):
    refill = as_inspect_model(make_pipeline(), options=ProviderOptions(max_batch_size=3))  # the default: auto
    static = as_inspect_model(make_pipeline(), options=ProviderOptions(max_batch_size=3, batching="static"))
    assert (refill.api.batching, static.api.batching) == ("refill", "static")  # auto refills when it can
    assert refill.api.max_connections() == 6  # a request waits per slot
    assert static.api.max_connections() == 6  # the next batch waits
    actadd = make_pipeline([ActAdd(steering_vector=torch.ones(64), layer_id=0)])
    assert as_inspect_model(actadd, options=ProviderOptions(batching="auto")).api.batching == "static"
    with pytest.raises(ValueError, match=r"batching='refill'.*ActAdd.*Fix"):
        as_inspect_model(actadd, options=ProviderOptions(batching="refill"))
    with pytest.raises(ValueError, match="batching"):
        ProviderOptions(batching="continuous")


def test_inspect_eval_with_refill_matches_static_completions(make_pipeline, tmp_path):
    pasta = PASTA(head_config=[0, 1], alpha=0.01, scale_position="exclude")
    pipeline = make_pipeline([pasta])
    samples = [
        Sample(input=f"tell me about {w}", target=w, id=i, metadata={"runtime_kwargs": {"substrings": [w]}})
        for i, w in enumerate(WORDS)
    ]
    completions = {}
    for batching in ("static", "refill"):
        model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=3, batching=batching))
        task = Task(dataset=MemoryDataset(samples), solver=[runtime_kwargs_solver()], scorer=includes())
        log = eval_one(task, model, log_dir=tmp_path / batching, temperature=0, max_tokens=12)
        assert log.status == "success"
        completions[batching] = {s.id: s.output.completion for s in log.samples}
        model.api.close()
    assert completions["refill"] == completions["static"]


def test_close_drops_the_engine_so_release_can_free_the_model(make_pipeline):
    pipeline = make_pipeline()
    collator = collator_for(pipeline, ceiling=2)

    async def main():
        record = collator.admit(chat(WORDS[0]), {"max_new_tokens": 4}, {}, 1)
        await collator.serve(record)

    anyio.run(main)
    assert collator.engine is not None and collator.engine.model is pipeline.model
    collator.close()
    deadline = time.monotonic() + 10
    while collator.running and time.monotonic() < deadline:  # the worker ends right after the last row
        time.sleep(0.01)
    assert collator.engine is None and collator.closed and not collator.running
