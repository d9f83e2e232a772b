"""EngineLoop on a stand-in engine: requests from many threads join one stepping engine, each caller gets its own
outputs, a refused request fails alone, a broken engine fails what it holds and refuses what comes after."""

from __future__ import annotations

import threading
import types

import pytest

from steer_hydra.backends.vllm.loop import EngineLoop


class _Engine:
    """Each request needs `params.steps` engine steps; a step advances every request added so far by one."""

    def __init__(self, fail_step: int | None = None) -> None:
        self.left: dict[str, int] = {}
        self.prompts: dict[str, str] = {}
        self.step_sizes: list[int] = []
        self.aborted: list[str] = []
        self.fail_step = fail_step
        self.in_engine = threading.Event()
        self.gate = threading.Event()  # the first step waits for it (set by default: no wait)
        self.gate.set()

    def add_request(self, request_id, prompt, params):
        if prompt == "refuse":
            raise ValueError("prompt too long")
        self.left[request_id], self.prompts[request_id] = params.steps, prompt

    def has_unfinished_requests(self):
        return bool(self.left)

    def step(self):
        self.in_engine.set()
        self.gate.wait(timeout=30)
        if self.fail_step is not None and len(self.step_sizes) == self.fail_step:
            raise RuntimeError("engine core died")
        self.step_sizes.append(len(self.left))
        done = []
        for request_id in list(self.left):
            self.left[request_id] -= 1
            if self.left[request_id] == 0:
                del self.left[request_id]
                done.append(types.SimpleNamespace(request_id=request_id, finished=True, text=self.prompts[request_id]))
        return done

    def abort_request(self, request_ids):
        self.aborted += request_ids


def params(steps):
    return types.SimpleNamespace(steps=steps, output_kind=None)


def test_callers_on_many_threads_share_the_engines_steps_and_each_gets_its_own_outputs():
    engine = _Engine()
    engine.gate.clear()  # the first step holds until every caller has submitted: the others join the next step
    loop = EngineLoop(engine, final_only="final")
    results: dict[int, list[str]] = {}
    submitted = threading.Semaphore(0)
    submit = loop.submit

    def counted_submit(prompts, sampling):
        futures = submit(prompts, sampling)
        submitted.release()
        return futures

    loop.submit = counted_submit

    def call(index):
        prompts = [f"{index}-{k}" for k in range(2)]
        results[index] = [o.text for o in loop.run(prompts, [params(3 + index), params(1)])]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert submitted.acquire(timeout=30)
    engine.gate.set()
    for thread in threads:
        thread.join(timeout=30)
    assert results == {i: [f"{i}-0", f"{i}-1"] for i in range(6)}
    assert max(engine.step_sizes) > 2  # requests of several callers decoded in the same step
    assert len(engine.step_sizes) < sum(3 + i + 1 for i in range(6))  # fewer steps than running calls one by one
    loop.close()


def test_a_refused_request_fails_alone_and_final_only_output_is_asked_for():
    engine = _Engine()
    loop = EngineLoop(engine, final_only="final")
    sent = [params(2), params(2)]
    good, refused = loop.submit(["ok", "refuse"], sent)
    with pytest.raises(ValueError, match="prompt too long"):
        refused.result(timeout=10)
    assert good.result(timeout=10).text == "ok"
    assert [p.output_kind for p in sent] == ["final", "final"]
    loop.close()


def test_a_broken_engine_fails_every_request_it_holds_and_refuses_later_ones():
    engine = _Engine(fail_step=1)
    loop = EngineLoop(engine)
    futures = loop.submit(["a", "b"], [params(5), params(5)])
    for future in futures:
        with pytest.raises(RuntimeError, match="engine core died"):
            future.result(timeout=10)
    assert sorted(engine.aborted) == sorted(engine.left)  # what the engine still held was aborted
    with pytest.raises(RuntimeError, match="engine loop has stopped.*engine core died.*rebuild the pipeline"):
        loop.submit(["c"], [params(1)])


def test_close_fails_requests_in_flight_and_stops_the_thread():
    engine = _Engine()
    loop = EngineLoop(engine)
    (future,) = loop.submit(["long"], [params(10**9)])
    assert engine.in_engine.wait(10)
    loop.close()
    with pytest.raises(RuntimeError, match="stopped before this request ended.*closed"):
        future.result(timeout=10)
    assert loop._thread is not None and not loop._thread.is_alive()
