"""`StreamCollator`: hands each Inspect request to the pipeline on its own, as it arrives, for engines that batch.

How it runs: `serve()` runs one `pipeline.generate` call for its record in a worker thread (at most `concurrency`
at once) and returns its result. On a backend that declares `streams` (the vLLM backends) that call sends the
request straight to the engine: `backend=vllm` submits it to the engine loop (`backends.vllm_loop`), whose
scheduler admits it at the next step beside whatever else is decoding, and `backend=vllm_serve` posts it to the
server. A finished request's slot takes the next request at once, with no batch to wait for. Everything a request
carries applies to it alone, exactly as on the static path at batch size one: its sampling fields, stop strings
and finish reasons, `n` candidates, steering additions and the reasoning split.

Seeds: a sampling request that carries a seed gets its own, derived from that seed, the request's content (prompt,
generation kwargs, per-sample runtime kwargs, candidates) and how many identical requests came before it
(`request_digest`, `request_seed`). A request's draws therefore depend only on itself, not on arrival timing, so a
rerun repeats them; the epochs of one sample (identical requests) draw differently.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from steer_hydra.core.identity import canonical_value, derive_item_seed
from steer_hydra.evaluation.batching import BatchRequest, LockLeaderCollator

if TYPE_CHECKING:
    from steer_hydra.core.output import Output


def request_digest(record: BatchRequest) -> str:
    """The identity of a request's content (prompt, generation kwargs but the seed, per-sample runtime kwargs,
    candidates): identical requests, e.g. the epochs of one sample, share it."""
    content = {
        "prompt": canonical_value(record.prompt),
        "gen_kwargs": canonical_value({k: v for k, v in record.gen_kwargs.items() if k != "seed"}),
        "runtime_kwargs": canonical_value(record.per_sample_runtime_kwargs),
        "num_choices": record.num_choices,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def request_seed(seed: int, digest: str, occurrence: int) -> int:
    """The seed of one streamed request: `seed` with the request's content digest (`request_digest`) and its
    occurrence among identical requests (0 for the first)."""
    return derive_item_seed(seed, f"request-{digest}", occurrence)


class StreamCollator(LockLeaderCollator):
    """A collator whose every request is its own `pipeline.generate` call, run concurrently (see the module
    docstring). Takes `LockLeaderCollator`'s arguments plus `concurrency`, the calls in flight at most; the
    pipeline must have an empty `stream_blockers()`."""

    def __init__(self, pipeline: Any, *, concurrency: int, **kwargs: Any) -> None:
        super().__init__(pipeline, **kwargs)
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._seen: Counter[tuple[int, str]] = Counter()
        self._seen_lock = threading.Lock()
        self._running = 0

    @property
    def queued(self) -> int:
        """Requests admitted and not yet finished (running or waiting for a slot)."""
        return self._running

    def admit(self, prompt: Any, gen_kwargs: Any, per_sample_runtime_kwargs: Any, num_choices: int) -> BatchRequest:
        record = super().admit(prompt, gen_kwargs, per_sample_runtime_kwargs, num_choices)
        seed = record.gen_kwargs.get("seed")
        if seed is not None:
            digest = request_digest(record)
            with self._seen_lock:
                occurrence = self._seen[(int(seed), digest)]
                self._seen[(int(seed), digest)] += 1
            record.gen_kwargs["seed"] = request_seed(int(seed), digest, occurrence)
        return record

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
