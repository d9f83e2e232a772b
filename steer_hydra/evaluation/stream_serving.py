"""`StreamCollator`: hands each Inspect request to the pipeline on its own, as it arrives, for engines that batch.

How it runs: `serve()` runs one `pipeline.generate` call for its record in a worker thread (at most `concurrency`
at once) and returns its result. On a backend that declares `streams` (the vLLM backends) that call sends the
request straight to the engine: `backend=vllm` submits it to the engine loop (`backends.vllm.loop`), whose
scheduler admits it at the next step beside whatever else is decoding, and `backend=vllm_serve` posts it to the
server. A finished request's slot takes the next request at once, with no batch to wait for. Everything a request
carries applies to it alone, exactly as on the static path at batch size one: its sampling fields, stop strings
and finish reasons, `n` candidates, steering additions and the reasoning split.

Seeds: each seeded request gets its own (`seeds_per_request`, see `steer_hydra.evaluation.batching`), so its
draws depend only on itself, not on arrival timing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from steer_hydra.evaluation.batching import BatchRequest, LockLeaderCollator

if TYPE_CHECKING:
    from steer_hydra.core.output import Output


class StreamCollator(LockLeaderCollator):
    """A collator whose every request is its own `pipeline.generate` call, run concurrently (see the module
    docstring). Takes `LockLeaderCollator`'s arguments plus `concurrency`, the calls in flight at most; the
    pipeline must have an empty `stream_blockers()`."""

    seeds_per_request = True

    def __init__(self, pipeline: Any, *, concurrency: int, **kwargs: Any) -> None:
        super().__init__(pipeline, **kwargs)
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._running = 0

    @property
    def queued(self) -> int:
        """Requests admitted and not yet finished (running or waiting for a slot)."""
        return self._running

    async def serve(self, record: BatchRequest) -> Output:
        self._running += 1
        try:
            await anyio.to_thread.run_sync(self._dispatch, [record], limiter=self._limiter)
        finally:
            self._running -= 1
        if record.error is not None:
            raise record.error
        if record.output is None:
            raise RuntimeError("The streamed generation of this request ended without a result.")
        return record.output
