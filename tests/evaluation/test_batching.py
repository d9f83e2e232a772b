"""LockLeaderCollator: admission, batch keys, runtime-kwarg tiers, the leader protocol and failure isolation."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from importlib.util import find_spec

import anyio
import anyio.lowlevel
import pytest
import torch

from steer_hydra.core.identity import canonical_value
from steer_hydra.core.output import Output
from steer_hydra.evaluation.batching import BatchRequest, LockLeaderCollator

BACKENDS = [
    "asyncio",
    pytest.param("trio", marks=pytest.mark.skipif(find_spec("trio") is None, reason="trio is not installed")),
]


class StubPipeline:
    """Records every generate call; prompt "pN" yields output id N; "poison" prompts raise ValueError.

    `gate` (a threading.Event) blocks the first call until set; `fail_batches` fails every multi-row call.
    """

    def __init__(self, *, gate=None, fail_batches=False, wrong_count=False):
        self.calls: list[dict] = []
        self.gate = gate
        self.started = threading.Event()
        self.fail_batches = fail_batches
        self.wrong_count = wrong_count
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def generate(self, *, runtime_kwargs, return_output, messages=None, text=None, **gen_kwargs):
        assert return_output is True
        prompts = messages if messages is not None else text
        source = "messages" if messages is not None else "text"
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.calls.append({"source": source, "prompts": prompts, "runtime_kwargs": runtime_kwargs, **gen_kwargs})
        try:
            self.started.set()
            if self.gate is not None and len(self.calls) == 1:
                assert self.gate.wait(10), "test gate never opened"
            n = gen_kwargs.get("n", 1)
            if n > 1:  # one bare prompt, n candidates
                return Output(torch.full((n, 1), _ident(prompts)), torch.ones(1, 2, dtype=torch.long), ["stop"] * n)
            if self.fail_batches and len(prompts) > 1:
                raise RuntimeError("rows disagree on shape")
            if any(_text(p) == "poison" for p in prompts):
                raise ValueError("poison sample")
            prompt_ids = torch.ones(1, 2, dtype=torch.long)
            outputs = [Output(torch.tensor([[_ident(p)]]), prompt_ids, ["stop"]) for p in prompts]
            return outputs[:-1] if self.wrong_count else outputs
        finally:
            with self._lock:
                self.in_flight -= 1

    def sizes(self):
        return [len(c["prompts"]) if c.get("n", 1) == 1 else 1 for c in self.calls]


def _text(prompt):
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def _ident(prompt):
    text = _text(prompt)
    return int(text[1:]) if text.startswith("p") and text[1:].isdigit() else -1


def _chat(text):
    return [{"role": "user", "content": text}]


def make(pipeline=None, *, ceiling=4, path="messages", scopes=None, static=None, template=None):
    return LockLeaderCollator(
        pipeline if pipeline is not None else StubPipeline(),
        batch_ceiling=ceiling,
        prompt_path=path,
        declared_scopes=scopes or {},
        static_runtime_kwargs=static or {},
        chat_template_kwargs=template,
    )


def admit(collator, text, gen=None, per_sample=None, n=1):
    prompt = _chat(text) if collator._prompt_path == "messages" else text
    return collator.admit(prompt, gen or {}, per_sample or {}, n)


async def serve_all(collator, records):
    results: dict[int, object] = {}

    async def one(i, record):
        try:
            results[i] = await collator.serve(record)
        except Exception as error:
            results[i] = error

    async with anyio.create_task_group() as tg:
        for i, record in enumerate(records):
            tg.start_soon(one, i, record)
    return [results[i] for i in range(len(records))]


async def serve_gated(collator, pipeline, gate, records, *, early=None):
    """Serve `records`: the first `early` (all by default) at once, the rest once the pipeline's first call is in
    flight (held at `gate`); open the gate when every task is blocked. The outputs, in record order."""
    early = len(records) if early is None else early
    results = {}

    async def one(i):
        results[i] = await collator.serve(records[i])

    async with anyio.create_task_group() as tg:
        for i in range(early):
            tg.start_soon(one, i)
        await anyio.to_thread.run_sync(pipeline.started.wait)
        for i in range(early, len(records)):
            tg.start_soon(one, i)
        await anyio.wait_all_tasks_blocked()
        gate.set()
    return [results[i] for i in range(len(records))]


# ---------------------------------------------------------------------- admission (items 58-66)
def test_admit_after_close_raises():
    collator = make()
    collator.close()
    assert collator.closed is True
    with pytest.raises(RuntimeError, match="closed"):
        admit(collator, "p1")


def test_per_sample_key_also_static_raises_before_scope_lookup():
    collator = make(scopes={"substrings": "row"}, static={"substrings": ["x"], "undeclared": 1})
    with pytest.raises(ValueError, match=r"both per sample .* and statically"):
        admit(collator, "p1", per_sample={"substrings": ["y"]})
    with pytest.raises(ValueError, match=r"both per sample .* and statically"):
        admit(collator, "p1", per_sample={"undeclared": 2})


def test_per_sample_call_scoped_key_raises():
    collator = make(scopes={"alpha": "call"})
    with pytest.raises(ValueError, match=r"declared 'call'-scoped.*ProviderOptions\.runtime_kwargs"):
        admit(collator, "p1", per_sample={"alpha": 1.0})


def test_undeclared_per_sample_key_is_inert_and_logged_once_below_the_console(caplog):
    collator = make(scopes={"substrings": "row"})
    with caplog.at_level(logging.DEBUG, logger="steer_hydra.evaluation.batching"):
        first = admit(collator, "p1", per_sample={"ghost": 1, "substrings": ["a"]})
        second = admit(collator, "p2", per_sample={"ghost": 2, "substrings": ["b"]})
    assert first.per_sample_runtime_kwargs == {"substrings": ["a"]}
    assert first.batch_key == second.batch_key == admit(collator, "p3", per_sample={"substrings": ["c"]}).batch_key
    assert collator.inert_runtime_kwargs == frozenset({"ghost"})
    inert_logs = [r for r in caplog.records if "is inert on this arm." in r.getMessage()]
    assert len(inert_logs) == 1 and "'ghost'" in inert_logs[0].getMessage()
    assert inert_logs[0].levelno == logging.DEBUG  # a task's metadata other arms read: not a console line per job


def test_undeclared_static_key_is_inert_at_construction(caplog):
    pipeline = StubPipeline()
    with caplog.at_level(logging.INFO, logger="steer_hydra.evaluation.batching"):
        collator = make(pipeline, static={"ghost": 3, "alpha": 0.5}, scopes={"alpha": "call"})
    assert collator.inert_runtime_kwargs == frozenset({"ghost"})
    assert sum("is inert on this arm." in r.getMessage() for r in caplog.records) == 1
    anyio.run(serve_all, collator, [admit(collator, "p1")])
    assert pipeline.calls[0]["runtime_kwargs"] == {"alpha": 0.5}


def test_static_call_value_passes_through_and_row_value_is_broadcast():
    pipeline = StubPipeline()
    scale = object()
    collator = make(pipeline, ceiling=3, scopes={"scale": "call", "substrings": "row"},
                    static={"scale": scale, "substrings": ["x"]})  # fmt: skip
    anyio.run(serve_all, collator, [admit(collator, f"p{i}") for i in range(3)])
    anyio.run(serve_all, collator, [admit(collator, "p9", n=2)])
    batch, single = pipeline.calls
    assert batch["runtime_kwargs"]["scale"] is scale
    assert batch["runtime_kwargs"]["substrings"] == [["x"], ["x"], ["x"]]
    assert single["runtime_kwargs"]["substrings"] == [["x"]]
    assert single["n"] == 2


def test_num_choices_is_clamped_to_one():
    assert admit(make(), "p1", n=0).num_choices == 1


def test_batch_key_is_sha256_of_sorted_json():
    collator = make(scopes={"b": "row", "a": "row"})
    gen = {"max_new_tokens": 8, "stop_strings": ("END",)}
    record = admit(collator, "p1", gen=gen, per_sample={"b": 1, "a": 2})
    payload = {"gen_kwargs": canonical_value(gen), "per_sample_keys": ["a", "b"], "single_candidate": True}
    assert record.batch_key == hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def test_batch_key_equality():
    collator = make(scopes={"a": "row", "b": "row"})
    base = admit(collator, "p1", gen={"max_new_tokens": 8}, per_sample={"a": 1})
    assert admit(collator, "p2", gen={"max_new_tokens": 8}, per_sample={"a": 99}).batch_key == base.batch_key
    assert admit(collator, "p1", gen={"max_new_tokens": 9}, per_sample={"a": 1}).batch_key != base.batch_key
    assert admit(collator, "p1", gen={"max_new_tokens": 8}, per_sample={"b": 1}).batch_key != base.batch_key
    assert admit(collator, "p1", gen={"max_new_tokens": 8}, per_sample={"a": 1}, n=3).batch_key != base.batch_key


def test_batch_request_is_slotted_identity_compared():
    a = admit(make(), "p1")
    b = admit(make(), "p1")
    assert a != b and not hasattr(a, "__dict__")
    assert isinstance(a, BatchRequest) and a.output is None and a.error is None and not a.done.is_set()


# ---------------------------------------------------------------------- the leader protocol (items 67-75, 80)
@pytest.mark.parametrize("backend", BACKENDS)
def test_leader_takes_same_key_records_in_queue_order(backend):
    gate = threading.Event()
    pipeline = StubPipeline(gate=gate)
    collator = make(pipeline, ceiling=3)
    fast, slow = {"max_new_tokens": 4}, {"max_new_tokens": 8}
    blocker = admit(collator, "p0")
    records = [
        admit(collator, "p1", gen=fast),
        admit(collator, "p2", gen=slow),
        admit(collator, "p3", gen=fast),
        admit(collator, "p4", gen=fast),
        admit(collator, "p5", gen=fast),
        admit(collator, "p6", n=2),
    ]
    outputs = {}

    async def one(record, *, task_status=anyio.TASK_STATUS_IGNORED):
        task_status.started()  # serve() enqueues before its first yield, so queue order is start order
        outputs[_ident(record.prompt)] = await collator.serve(record)

    async def main():
        async with anyio.create_task_group() as tg:
            await tg.start(one, blocker)
            await anyio.to_thread.run_sync(pipeline.started.wait)  # p0 is in flight alone
            for record in records:
                await tg.start(one, record)
            gate.set()

    anyio.run(main, backend=backend)
    dispatched = [
        [_ident(p) for p in c["prompts"]] if c.get("n", 1) == 1 else [_ident(c["prompts"])] for c in pipeline.calls
    ]
    assert dispatched[0] == [0]
    assert dispatched[1] == [1, 3, 4]  # the next leader plus two same-key records, in queue order (ceiling 3)
    assert sorted(map(tuple, dispatched[2:])) == [(2,), (5,), (6,)]
    assert [int(outputs[i].output_ids[0, 0]) for i in range(7)] == list(range(7))
    assert outputs[6].output_ids.shape == (2, 1)  # the multi-candidate request dispatched alone with n=2
    assert len(pipeline.calls) == 5
    assert collator.queued == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_five_requests_ceiling_three(backend):
    gate = threading.Event()
    pipeline = StubPipeline(gate=gate)
    collator = make(pipeline, ceiling=3)
    records = [admit(collator, f"p{i}") for i in range(5)]
    outputs = anyio.run(serve_gated, collator, pipeline, gate, records, backend=backend)
    assert [int(o.output_ids[0, 0]) for o in outputs] == [0, 1, 2, 3, 4]
    assert sum(pipeline.sizes()) == 5 and max(pipeline.sizes()) == 3
    assert pipeline.max_in_flight == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_four_seeded_requests_share_one_dispatch(backend):
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=8)
    gen = {"do_sample": True, "temperature": 0.7, "seed": 5, "seed_scope": "dispatch"}
    anyio.run(serve_all, collator, [admit(collator, f"p{i}", gen=gen) for i in range(4)], backend=backend)
    assert pipeline.sizes() == [4]
    assert pipeline.calls[0]["seed_scope"] == "dispatch" and pipeline.calls[0]["seed"] == 5


def test_ceiling_one_serializes():
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=1)
    anyio.run(serve_all, collator, [admit(collator, f"p{i}") for i in range(4)])
    assert pipeline.sizes() == [1, 1, 1, 1]
    assert pipeline.max_in_flight == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_leader_cancelled_mid_flight_still_completes_the_batch(backend):
    gate = threading.Event()
    pipeline = StubPipeline(gate=gate)
    collator = make(pipeline, ceiling=3)
    records = [admit(collator, f"p{i}") for i in range(3)]
    outputs = {}

    async def one(i, scope):
        with scope:
            outputs[i] = await collator.serve(records[i])

    async def main():
        scopes = [anyio.CancelScope() for _ in records]
        async with anyio.create_task_group() as tg:
            for i, scope in enumerate(scopes):
                tg.start_soon(one, i, scope)
            await anyio.to_thread.run_sync(pipeline.started.wait)
            scopes[0].cancel()  # the leader, blocked in the worker thread
            gate.set()

    anyio.run(main, backend=backend)
    assert len(pipeline.calls) == 1 and pipeline.sizes() == [3]
    # the dispatch sets every member's output before it wakes any: the cancelled leader's is there once the others
    # returned (its wake-up may land after the loop ended, when nobody awaits it, so `done` is not checked)
    assert records[0].output is not None
    assert int(outputs[1].output_ids[0, 0]) == 1 and int(outputs[2].output_ids[0, 0]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_waiter_cancelled_while_queued_is_never_dispatched(backend):
    gate = threading.Event()
    pipeline = StubPipeline(gate=gate)
    collator = make(pipeline, ceiling=1)
    first, second, third = (admit(collator, f"p{i}") for i in (1, 2, 3))
    done = {}

    async def run(record, scope=None):
        with scope or anyio.CancelScope():
            done[_ident(record.prompt)] = await collator.serve(record)

    async def main():
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, first)
            await anyio.to_thread.run_sync(pipeline.started.wait)
            tg.start_soon(run, second, scope)
            tg.start_soon(run, third)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            gate.set()

    anyio.run(main, backend=backend)
    dispatched = [_ident(p) for c in pipeline.calls for p in c["prompts"]]
    assert dispatched == [1, 3]
    assert set(done) == {1, 3} and second.output is None
    assert collator.queued == 0


def test_collator_reused_across_two_event_loops():
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=4)
    first = anyio.run(serve_all, collator, [admit(collator, f"p{i}") for i in range(4)])
    second = anyio.run(serve_all, collator, [admit(collator, f"p{i}") for i in range(4, 8)])
    assert [int(o.output_ids[0, 0]) for o in first + second] == list(range(8))
    assert pipeline.sizes() == [4, 4]


def test_per_sample_values_are_collated_in_row_order():
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=4, scopes={"substrings": "row"})
    records = [admit(collator, f"p{i}", per_sample={"substrings": [f"w{i}"]}) for i in range(4)]
    anyio.run(serve_all, collator, records)
    (call,) = pipeline.calls
    rows = call["runtime_kwargs"]["substrings"]
    assert [(_ident(p), value) for p, value in zip(call["prompts"], rows, strict=True)] == [
        (i, [f"w{i}"]) for i in range(4)
    ]


def test_text_path_dispatches_text_and_template_kwargs_are_added():
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=2, path="text")
    anyio.run(serve_all, collator, [admit(collator, "p1"), admit(collator, "p2")])
    assert pipeline.calls[0]["source"] == "text" and pipeline.calls[0]["prompts"] == ["p1", "p2"]
    templated = StubPipeline()
    collator = make(templated, template={"enable_thinking": False})
    anyio.run(serve_all, collator, [admit(collator, "p1")])
    assert templated.calls[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert templated.calls[0]["prompts"] == [_chat("p1")]


# ---------------------------------------------------------------------- failures (items 76-79)
def test_singleton_failure_reraises_the_original_exception():
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=1)
    record = admit(collator, "poison")
    (result,) = anyio.run(serve_all, collator, [record])
    assert isinstance(result, ValueError) and result is record.error
    assert len(pipeline.calls) == 1


def test_poison_sample_fails_alone(caplog):
    pipeline = StubPipeline()
    collator = make(pipeline, ceiling=3)
    records = [admit(collator, "p1"), admit(collator, "poison"), admit(collator, "p3")]
    with caplog.at_level(logging.WARNING, logger="steer_hydra.evaluation.batching"):
        results = anyio.run(serve_all, collator, records)
    assert pipeline.sizes() == [3, 1, 1, 1]  # the batch, then one serial pass
    assert int(results[0].output_ids[0, 0]) == 1 and int(results[2].output_ids[0, 0]) == 3
    assert isinstance(results[1], ValueError) and "poison" in str(results[1])
    assert not any("succeeded serially" in r.getMessage() for r in caplog.records)


def test_batch_failure_with_serial_success_warns_once_per_message(caplog):
    pipeline = StubPipeline(fail_batches=True)
    collator = make(pipeline, ceiling=3)
    with caplog.at_level(logging.WARNING, logger="steer_hydra.evaluation.batching"):
        for _ in range(2):
            results = anyio.run(serve_all, collator, [admit(collator, f"p{i}") for i in range(3)])
            assert [int(r.output_ids[0, 0]) for r in results] == [0, 1, 2]
    warnings = [r.getMessage() for r in caplog.records if "succeeded serially" in r.getMessage()]
    assert len(warnings) == 1 and "dispatch of 3 requests" in warnings[0]
    assert pipeline.sizes() == [3, 1, 1, 1, 3, 1, 1, 1]


def test_output_count_mismatch_raises_and_leaves_no_empty_record():
    pipeline = StubPipeline(wrong_count=True)
    collator = make(pipeline, ceiling=2)
    records = [admit(collator, "p1"), admit(collator, "p2")]
    results = anyio.run(serve_all, collator, records)
    for record, result in zip(records, results, strict=True):
        assert isinstance(result, RuntimeError) and "output(s)" in str(result)
        assert record.output is not None or record.error is not None


def test_invalid_construction():
    with pytest.raises(ValueError, match="prompt_path"):
        make(path="tokens")


def test_leader_waits_for_staggered_arrivals_only_while_requesters_are_awaited():
    """Yield counts, not time: replacements of served requests join one dispatch; a cold start does not wait."""
    from steer_hydra.evaluation.batching import AWAITED_FILL_PATIENCE, FILL_PATIENCE

    stagger = 3 * FILL_PATIENCE  # loop turns between arrivals: beyond the short patience, within the long one
    assert 4 * stagger < AWAITED_FILL_PATIENCE

    async def staggered(collator, start):
        async def one(i):
            for _ in range(i * stagger):
                await anyio.lowlevel.checkpoint()
            await collator.serve(admit(collator, f"p{start + i}"))

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)

    cold = StubPipeline()
    collator = make(cold, ceiling=4)
    anyio.run(staggered, collator, 0)
    assert cold.sizes()[0] == 1 and len(cold.sizes()) > 1  # nobody was awaited: the first leader left alone

    warm = StubPipeline()
    collator = make(warm, ceiling=4)

    async def main():
        await serve_all(collator, [admit(collator, f"p{i}") for i in range(4)])  # four requesters served
        await staggered(collator, 4)  # their successors trickle in

    anyio.run(main)
    assert warm.sizes() == [4, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_batch_waiting_starts_while_the_event_loop_is_busy(backend):
    """The worker starts the next full batch itself: Inspect's work on finished samples overlaps generation."""
    gate, second_started = threading.Event(), threading.Event()

    class Pipeline(StubPipeline):
        def generate(self, **kwargs):
            if len(self.calls) == 1:  # the second dispatch begins
                second_started.set()
            return super().generate(**kwargs)

    pipeline = Pipeline(gate=gate)
    collator = make(pipeline, ceiling=2)
    records = [admit(collator, f"p{i}") for i in range(4)]
    results = {}

    async def one(i):
        results[i] = await collator.serve(records[i])

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)
            await anyio.to_thread.run_sync(pipeline.started.wait)
            await anyio.wait_all_tasks_blocked()  # p2, p3 queued behind the in-flight p0, p1
            gate.set()
            # block the event loop: a next dispatch that needed the loop (a leader coroutine) could not start
            results["overlapped"] = second_started.wait(5)

    anyio.run(main, backend=backend)
    assert results["overlapped"]
    assert pipeline.sizes() == [2, 2] and pipeline.max_in_flight == 1
    assert [int(results[i].output_ids[0, 0]) for i in range(4)] == [0, 1, 2, 3]
    worker = collator._worker  # it wakes the last requesters, then clears itself: let it finish
    if worker is not None:
        worker.join(5)
    assert collator.queued == 0 and not collator._worker


def test_the_worker_hands_a_partial_batch_back_to_a_leader():
    """Below the ceiling the worker ends and the head record's requester gathers and leads (nothing strands)."""
    gate = threading.Event()
    pipeline = StubPipeline(gate=gate)
    collator = make(pipeline, ceiling=4)
    records = [admit(collator, f"p{i}") for i in range(6)]
    outputs = anyio.run(lambda: serve_gated(collator, pipeline, gate, records, early=4))
    assert [int(o.output_ids[0, 0]) for o in outputs] == list(range(6))
    assert pipeline.sizes() == [4, 2]
