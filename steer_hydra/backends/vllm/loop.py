"""`EngineLoop`: one thread drives an offline vLLM engine; any thread submits requests and waits for its own.

vLLM's `LLMEngine` is not safe to call from several threads, and `LLM.generate` steps the engine until *every*
unfinished request ends (it would collect other callers' outputs). The loop owns the engine instead: `submit()`
queues a request from any thread and returns a `Future`; the loop thread adds queued requests between engine
steps and resolves each future when its request finishes. vLLM's scheduler sees every request as soon as it is
submitted, so callers that submit one request each (the provider's streaming path) share its continuous batching,
and a batch submitted at once (the static path) runs exactly as `LLM.generate` would run it.

Failure: a request the engine refuses fails its own future; an engine step that raises fails every request in
flight and stops the loop (later submissions fail at once with that error).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)


class EngineLoop:
    """Drives `engine` (a vLLM `LLMEngine`: `add_request`, `step`, `has_unfinished_requests`, `abort_request`)
    from one daemon thread, started on the first submission."""

    def __init__(self, engine: Any, *, final_only: Any = None) -> None:
        self._engine = engine
        self._final_only = final_only  # vLLM's RequestOutputKind.FINAL_ONLY (None in tests with a fake engine)
        self._inbox: deque[tuple[str, Any, Any, Any, Future]] = deque()
        self._pending: dict[str, Future] = {}
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped: BaseException | None = None
        self.steps = 0

    def submit(
        self, prompts: Sequence[Any], params: Sequence[Any], lora_requests: Sequence[Any] | None = None
    ) -> list[Future]:
        """Queue requests (vLLM prompts, their `SamplingParams` and, when given, each one's `LoRARequest` or None)
        together: the engine admits them at the same step boundary. Each future resolves to its request's finished
        `RequestOutput`."""
        futures: list[Future] = []
        loras = list(lora_requests) if lora_requests is not None else [None] * len(prompts)
        with self._wake:
            if self._stopped is not None:
                raise RuntimeError(f"The vLLM engine loop has stopped ({self._stopped!r}); rebuild the pipeline.")
            for prompt, sampling, lora in zip(prompts, params, loras, strict=True):
                futures.append(Future())
                self._inbox.append((f"sh-{next(self._ids)}", prompt, sampling, lora, futures[-1]))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="steer-hydra-vllm-loop", daemon=True)
                self._thread.start()
            self._wake.notify()
        return futures

    def run(
        self, prompts: Sequence[Any], params: Sequence[Any], lora_requests: Sequence[Any] | None = None
    ) -> list[Any]:
        """Submit the requests, then wait for all of them (outputs in submission order)."""
        futures = self.submit(prompts, params) if lora_requests is None else self.submit(prompts, params, lora_requests)
        return [future.result() for future in futures]

    def close(self) -> None:
        """Stop the loop thread (requests still in flight fail) and wait for it."""
        with self._wake:
            self._stopped = self._stopped or RuntimeError("the engine was closed")
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)

    # ------------------------------------------------------------------ loop thread
    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._inbox and not self._pending and self._stopped is None:
                        self._wake.wait()
                    if self._stopped is not None:
                        break
                    queued = list(self._inbox)
                    self._inbox.clear()
                for request_id, prompt, params, lora, future in queued:
                    self._add(request_id, prompt, params, lora, future)
                if not self._pending:
                    continue
                if not self._engine.has_unfinished_requests():
                    raise RuntimeError(f"the engine holds none of the {len(self._pending)} request(s) in flight")
                self._deliver(self._engine.step())
                self.steps += 1
        except BaseException as error:  # the engine itself broke: every request in flight fails with it
            logger.exception("The vLLM engine loop stopped.")
            with self._wake:
                self._stopped = error
        self._fail_all()

    def _add(self, request_id: str, prompt: Any, params: Any, lora: Any, future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        if self._final_only is not None:
            params.output_kind = self._final_only  # one output per request, when it finishes
        try:
            # a LoRA adapter, when the request has one (vLLM serves it per request)
            self._engine.add_request(request_id, prompt, params, **({"lora_request": lora} if lora is not None else {}))
        except Exception as error:  # this request is refused (e.g. too long); the others run on
            future.set_exception(error)
            return
        self._pending[request_id] = future

    def _deliver(self, outputs: Sequence[Any]) -> None:
        for output in outputs:
            if getattr(output, "finished", False):
                future = self._pending.pop(str(output.request_id), None)
                if future is not None:
                    future.set_result(output)

    def _fail_all(self) -> None:
        with self._wake:
            error = self._stopped
            stranded = [f for *_, f in self._inbox] + list(self._pending.values())
            ids = list(self._pending)
            self._inbox.clear()
            self._pending.clear()
        if ids:
            try:
                self._engine.abort_request(ids)
            except Exception as abort_error:  # best effort: the engine is going away
                logger.debug("Aborting %d request(s) raised %r.", len(ids), abort_error)
        for future in stranded:
            if not future.done():
                future.set_exception(RuntimeError(f"The vLLM engine loop stopped before this request ended: {error!r}"))
