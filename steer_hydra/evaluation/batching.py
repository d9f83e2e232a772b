"""Lock-leader collator: turns concurrent async generation requests into batched `pipeline.generate()` calls.

Inspect issues one async request per sample and keeps many outstanding; a `SteeringPipeline` is synchronous,
allows one generation in flight, and accepts batches. The collator bridges the two with one `anyio.Lock` and
no background task or timer:

1. `admit()` validates a request and builds its `BatchRequest` (no enqueue); `serve()` enqueues it.
2. When no worker thread is running, one requester becomes the *leader*: it takes its own record plus
   compatible queued records (same batch key), in queue order, up to the ceiling, and starts a worker thread
   that runs one `pipeline.generate` call for them, fills every member's result slot and wakes each member on
   its event-loop thread.
3. The worker does not stop there: while the queue holds a full batch (the head record's key at the ceiling,
   or a record that dispatches alone) it takes it and generates again at once, so Inspect's per-sample work on
   the finished rows (scoring, logging, starting the successors) runs on the event loop *while* the next batch
   decodes instead of between two batches. When no full batch waits it ends and wakes the head record, whose
   requester leads the next dispatch.
4. A requester whose record was served returns; one woken without a result leads (or waits again).

Invariants:
- The worker thread is the only caller of `pipeline.generate` and at most one runs: one generation in flight,
  by construction (the queue, the leader flag and the worker slot change under one thread lock).
- Records share a dispatch only when the batched call equals the per-request calls: the batch key digests the
  canonical call-scoped gen kwargs (seed and stop strings included), the sorted set of retained per-sample
  runtime-kwarg names (values may differ per row) and a single-candidate flag. Multi-candidate requests
  (`num_choices > 1`) always dispatch alone.
- While a batch is in flight new requests accumulate in the queue: the in-flight generation is the collation
  window. Before taking its batch, a leader below the ceiling also yields to the event loop until arrivals stop
  (a bounded number of yields, no clock), so a burst of requests that starts as a batch finishes dispatches
  together instead of as fragments. With a ceiling of 1 the same path is strict serialization. Give Inspect the
  provider's `max_connections()` (see `steer_hydra.evaluation.provider`) so a full next batch is queued when one
  ends.

Runtime kwargs arrive on two tiers and are read against the declared scopes of the enabled controls:
static (`ProviderOptions.runtime_kwargs`) "call" values pass through unchanged, static "row" values are one
row's value broadcast as `[value] * rows`; per-sample values (from `Sample.metadata` via
`runtime_kwargs_solver`) must be "row"-scoped and are collated row by row (`kwargs[k][i]` belongs to prompt
`i`). A name no enabled control declares is inert on either tier: dropped, kept out of the batch key,
reported in `inert_runtime_kwargs` and logged once per collator.

Failure is isolated: a failed multi-row dispatch re-runs its members serially once, so a poison sample fails
alone. When every member then succeeds, the batch failure was a shape problem (typically a row-scoped value
whose per-row form is wrong); that is logged as a WARNING once per distinct message. Under sampling the
serial pass regenerates the members, so their outputs differ from what the batch would have produced.

Reproducibility: which samples run is fixed by the suite, but a sample's dispatch-mates and row index depend
on arrival timing. Seeded sampling with `seed_scope="dispatch"` is reproducible per dispatch, not per sample;
a bitwise-reproducible stochastic run needs a ceiling of 1 and Inspect `max_connections=1`. Greedy decoding
avoids seed sensitivity (padded-batch numerics can still differ from single-row numerics on some kernels).
Collators whose rows sample independently (`seeds_per_request`: refill and streaming) instead give each seeded
request its own seed, derived from the call's seed, the request's content (prompt, generation kwargs, per-sample
runtime kwargs, candidates) and how many identical requests came before it (`request_digest`, `request_seed`):
a request's draws then depend only on itself, so a rerun repeats them, and the epochs of one sample (identical
requests) draw differently.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import sniffio

from steer_hydra.core.identity import canonical_value, derive_item_seed

if TYPE_CHECKING:
    from steer_hydra.core.output import Output
    from steer_hydra.core.pipeline import SteeringPipeline

logger = logging.getLogger(__name__)

PromptPath = Literal["messages", "text"]

# Consecutive event-loop yields without a new arrival after which a leader stops waiting for its batch to fill:
# when no request is expected, and while requesters served earlier have not come back yet (see `_gather`).
FILL_PATIENCE = 16
AWAITED_FILL_PATIENCE = 2048
CLOSE_WAIT = 60.0  # seconds `close()` waits for a dispatch in flight to end


@dataclass(eq=False, slots=True)
class BatchRequest:
    """One admitted generation request waiting for (or holding) its dispatch result.

    Attributes:
        prompt: One conversation (list of `{"role", "content"}` dicts) on the messages path, or one rendered
            string on the text path.
        gen_kwargs: Call-scoped generation kwargs mapped from the request's `GenerateConfig`.
        per_sample_runtime_kwargs: The retained per-sample runtime kwargs (every key declared "row"-scoped).
        num_choices: Candidates requested; above 1 the request dispatches alone.
        batch_key: Digest deciding which records may share a dispatch.
        done: Set (on the event-loop thread) once `output` or `error` holds the result; on the static path
            also when the requester is asked to lead the next dispatch (then replaced by a fresh event).
        output: The record's `Output` on success.
        error: The record's own exception on failure.
        notify: Sets `done` from the worker thread, on the requester's event-loop thread (set by `serve()`).
        abandoned: True when the dispatch holding the record was interrupted before producing a result.
    """

    prompt: Any
    gen_kwargs: dict[str, Any]
    per_sample_runtime_kwargs: dict[str, Any]
    num_choices: int
    batch_key: str
    done: anyio.Event = field(default_factory=anyio.Event)
    output: Output | None = None
    error: BaseException | None = None
    notify: Callable[[], None] | None = None
    abandoned: bool = False


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
    """The seed of one request: the call's `seed` with the request's content digest (`request_digest`) and its
    occurrence among identical requests (0 for the first)."""
    return derive_item_seed(seed, f"request-{digest}", occurrence)


def loop_caller() -> Callable[[Callable[[], None]], None]:
    """A function that runs a callback on the current event-loop thread from any thread (asyncio or trio).

    Call it on the loop thread; a callback scheduled after the loop has ended is dropped (nobody awaits it).
    """
    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def call_trio(callback: Callable[[], None]) -> None:
            try:
                token.run_sync_soon(callback)
            except RuntimeError:
                pass

        return call_trio
    loop = asyncio.get_running_loop()

    def call_asyncio(callback: Callable[[], None]) -> None:
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass

    return call_asyncio


def batch_key(gen_kwargs: Mapping[str, Any], per_sample_runtime_kwargs: Mapping[str, Any], num_choices: int) -> str:
    """sha256 of sorted JSON: canonical gen kwargs, the sorted per-sample key names, a single-candidate flag."""
    payload = {
        "gen_kwargs": canonical_value(dict(gen_kwargs)),
        "per_sample_keys": sorted(per_sample_runtime_kwargs),
        "single_candidate": num_choices <= 1,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class LockLeaderCollator:
    """Collate concurrent requests into batched `pipeline.generate()` calls (see the module docstring).

    Args:
        pipeline: The steered pipeline; the lock holder is its only caller.
        batch_ceiling: The most requests one dispatch may batch: the provider's `batch_ceiling`
            (`ProviderOptions.batch_ceiling(pipeline)`, validated there).
        prompt_path: "messages" dispatches conversations via `messages=`, "text" rendered strings via `text=`.
        declared_scopes: `{name: "row" | "call"}` for every runtime kwarg the enabled controls declare.
        static_runtime_kwargs: Applied to every dispatch (shallow-copied, never mutated).
        chat_template_kwargs: Added to every dispatch's gen kwargs on the messages path, or None.
    """

    # Subclasses whose rows sample independently set this: each seeded request then gets its own seed
    # (`request_seed`), after its batch key is taken, so requests still share dispatches by the call's seed.
    seeds_per_request = False

    def __init__(
        self,
        pipeline: SteeringPipeline,
        *,
        batch_ceiling: int,
        prompt_path: PromptPath,
        declared_scopes: Mapping[str, str],
        static_runtime_kwargs: Mapping[str, Any],
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if prompt_path not in ("messages", "text"):
            raise ValueError(f"prompt_path must be 'messages' or 'text'; got {prompt_path!r}.")
        self._pipeline = pipeline
        self._batch_ceiling = batch_ceiling
        self._prompt_path: PromptPath = prompt_path
        self._declared_scopes = dict(declared_scopes)
        self._static = dict(static_runtime_kwargs)
        self._chat_template_kwargs = dict(chat_template_kwargs) if chat_template_kwargs is not None else None
        self._queue_lock = threading.Lock()  # guards the queue, the leader flag and the worker slot
        self._leading = False
        self._worker: threading.Thread | None = None
        self._queue: dict[int, BatchRequest] = {}  # insertion-ordered, keyed by id(record)
        self._queued_keys: Counter[str] = Counter()
        self._closed = False
        self._awaited = 0
        self._inert: set[str] = set()
        self._seen: Counter[tuple[int, str]] = Counter()  # (call seed, request digest) -> requests admitted
        self._logged_batch_failures: set[str] = set()
        self._static_call: dict[str, Any] = {}
        self._static_row: dict[str, Any] = {}
        for key, value in self._static.items():
            scope = self._declared_scopes.get(key)
            if scope == "row":
                self._static_row[key] = value
            elif scope == "call":
                self._static_call[key] = value
            else:
                self._mark_inert(key, "static, ProviderOptions.runtime_kwargs")

    # ------------------------------------------------------------------ state
    @property
    def batch_ceiling(self) -> int:
        """The most requests one dispatch may batch."""
        return self._batch_ceiling

    @property
    def queued(self) -> int:
        """Records waiting for a dispatch."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def close(self) -> None:
        """Refuse new admissions; a batch already in flight completes and delivers its results, and `close` waits
        for it (at most `CLOSE_WAIT` seconds), so no thread is left generating when the program exits (after a
        Ctrl-C, a daemon thread inside torch at exit aborts the process)."""
        self._closed = True
        self._join_worker()

    def _join_worker(self) -> None:
        """Wait up to `CLOSE_WAIT` seconds for the worker thread to end (not from the worker itself)."""
        worker = self._worker
        if worker is None or worker is threading.current_thread() or not worker.is_alive():
            return
        worker.join(CLOSE_WAIT)
        if worker.is_alive():
            logger.warning(
                "A generation in flight did not end within %.0fs of closing its provider; it is left running.",
                CLOSE_WAIT,
            )

    @property
    def inert_runtime_kwargs(self) -> frozenset[str]:
        """Runtime-kwarg names seen on either tier that no enabled control declares."""
        return frozenset(self._inert)

    def _mark_inert(self, key: str, tier: str, level: int = logging.INFO) -> None:
        if key in self._inert:
            return
        self._inert.add(key)
        logger.log(
            level,
            "Runtime kwarg %r (%s) is declared by no enabled control of this pipeline and is inert on this arm.",
            key,
            tier,
        )

    # ------------------------------------------------------------------ admission
    def admit(
        self,
        prompt: Any,
        gen_kwargs: Mapping[str, Any],
        per_sample_runtime_kwargs: Mapping[str, Any],
        num_choices: int,
    ) -> BatchRequest:
        """Validate one request and build its record, without enqueueing it.

        Raises:
            RuntimeError: If the collator is closed.
            ValueError: If a per-sample key is also supplied statically, or is declared "call"-scoped.
        """
        if self._closed:
            raise RuntimeError("The steering-pipeline provider is closed; build a new one with as_inspect_model().")
        retained: dict[str, Any] = {}
        for key, value in per_sample_runtime_kwargs.items():
            if key in self._static:
                raise ValueError(
                    f"Runtime kwarg {key!r} is supplied both per sample (Sample.metadata, via runtime_kwargs_solver) "
                    "and statically (ProviderOptions.runtime_kwargs); a value for every row and a stream of per-row "
                    "values cannot both apply. Remove it from one tier."
                )
            scope = self._declared_scopes.get(key)
            if scope == "call":
                raise ValueError(
                    f"Per-sample runtime kwarg {key!r} is declared 'call'-scoped by an enabled control, so one value "
                    "per sample cannot reach it in a batched call. Pass it statically (ProviderOptions.runtime_kwargs) "
                    "or declare 'scope': 'row' in the consuming control's RUNTIME_KWARGS_SCHEMA."
                )
            if scope is None:
                # a task's metadata serves the arms that read it; on the others it is expected, so kept quiet
                self._mark_inert(key, "per sample, Sample.metadata", logging.DEBUG)
                continue
            retained[key] = value
        choices = max(1, int(num_choices))
        record = BatchRequest(
            prompt=prompt,
            gen_kwargs=dict(gen_kwargs),
            per_sample_runtime_kwargs=retained,
            num_choices=choices,
            batch_key=batch_key(gen_kwargs, retained, choices),
        )
        seed = record.gen_kwargs.get("seed")
        if self.seeds_per_request and seed is not None:
            digest = request_digest(record)
            with self._queue_lock:
                occurrence = self._seen[(int(seed), digest)]
                self._seen[(int(seed), digest)] += 1
            record.gen_kwargs["seed"] = request_seed(int(seed), digest, occurrence)
        return record

    # ------------------------------------------------------------------ the leader protocol
    async def serve(self, record: BatchRequest) -> Output:
        """Enqueue an admitted record and wait until it holds its result, leading a dispatch when none runs.

        Raises:
            Exception: The record's own dispatch exception, re-raised on the requesting task.
        """
        call = loop_caller()
        record.notify = lambda: call(lambda: record.done.set())  # the event current when the callback runs
        with self._queue_lock:
            self._queue[id(record)] = record
            self._queued_keys[record.batch_key] += 1
        self._awaited = max(0, self._awaited - 1)
        try:
            while not self._finished(record):
                with self._queue_lock:
                    lead = self._worker is None and not self._leading and id(record) in self._queue
                    self._leading = self._leading or lead
                if lead:
                    await self._lead(record)
                await record.done.wait()
                if not self._finished(record):  # woken to lead the next dispatch: wait on a fresh event
                    record.done = anyio.Event()
        finally:
            with self._queue_lock:
                self._discard(record)
                # a requester cancelled after being woken to lead passes the turn on to the next queued record
                idle = self._worker is None and not self._leading
                head = next(iter(self._queue.values()), None) if idle and not self._finished(record) else None
            if head is not None:
                head.notify()
            self._awaited += 1  # this requester's next request (or its sample's successor) is likely to follow
        if record.error is not None:
            raise record.error
        if record.output is None:  # only when the worker thread was interrupted (a BaseException, not an error)
            raise RuntimeError("The batched dispatch holding this request was interrupted before it produced a result.")
        return record.output

    @staticmethod
    def _finished(record: BatchRequest) -> bool:
        return record.output is not None or record.error is not None or record.abandoned

    async def _lead(self, record: BatchRequest) -> None:
        """Gather a batch around `record` on the event loop, then hand it to a new worker thread."""
        started = False
        try:
            await self._gather(record)
            with self._queue_lock:
                batch = self._take_batch(record)
                self._worker = threading.Thread(
                    target=self._work, args=(batch,), name="steer-hydra-collator", daemon=True
                )
                self._worker.start()
                started = True
        finally:
            with self._queue_lock:
                self._leading = False
                head = None if started else next((r for r in self._queue.values() if r is not record), None)
            if head is not None:  # the leader was cancelled while gathering: the next record leads
                head.notify()

    def _work(self, batch: list[BatchRequest]) -> None:
        """Worker thread: dispatch `batch`, then every full batch that waits; end by waking the next leader."""
        head = None
        try:
            while batch:
                try:
                    self._dispatch(batch)
                finally:
                    for member in batch:
                        if member.output is None and member.error is None:  # interrupted by a BaseException
                            member.abandoned = True
                        member.notify()
                with self._queue_lock:
                    batch = self._next_full_batch()
        finally:
            with self._queue_lock:
                self._worker = None
                head = next(iter(self._queue.values()), None)
            if head is not None:
                head.notify()

    def _next_full_batch(self) -> list[BatchRequest]:
        """Under the queue lock: the head record's batch if it is full (or dispatches alone), else []."""
        head = next(iter(self._queue.values()), None)
        if head is None:
            return []
        if head.num_choices > 1 or self._batch_ceiling == 1 or self._compatible(head) >= self._batch_ceiling:
            return self._take_batch(head)
        return []

    async def _gather(self, leader: BatchRequest) -> None:
        """Let requests on their way join the leader's batch before it is taken (no clock, no background task).

        The leader yields to the event loop while its batch is below the ceiling and stops after a run of yields
        that admit nothing. The run is short (`FILL_PATIENCE`) when no request is expected, and longer
        (`AWAITED_FILL_PATIENCE`) while requesters served by earlier dispatches have not yet come back (each
        served sample usually sends its next request, or a new sample takes its place): Inspect finishes a
        batch's samples and starts their successors in a burst, sometimes interrupted by a log flush, and
        dispatching the first arrival alone would split that burst into fragments. On an idle loop a yield
        costs microseconds, so the wait is bounded by a few milliseconds when nothing comes.
        """
        if leader.num_choices > 1 or self._batch_ceiling == 1:
            return
        idle = 0
        seen = len(self._queue)
        while self._compatible(leader) < self._batch_ceiling:
            if idle >= (AWAITED_FILL_PATIENCE if self._awaited else FILL_PATIENCE):
                return
            await anyio.lowlevel.checkpoint()
            idle = 0 if len(self._queue) > seen else idle + 1
            seen = len(self._queue)

    def _compatible(self, leader: BatchRequest) -> int:
        return self._queued_keys[leader.batch_key]

    def _take_batch(self, leader: BatchRequest) -> list[BatchRequest]:
        """Remove the leader plus up to ceiling-1 same-key queued records (queue order) from the queue."""
        self._discard(leader)
        batch = [leader]
        room = self._batch_ceiling - 1
        if leader.num_choices > 1 or room <= 0:
            return batch
        for queued in list(self._queue.values()):
            if not room:
                break
            if queued.batch_key == leader.batch_key:
                self._discard(queued)
                batch.append(queued)
                room -= 1
        return batch

    def _discard(self, record: BatchRequest) -> None:
        if self._queue.pop(id(record), None) is not None:
            self._queued_keys[record.batch_key] -= 1

    # ------------------------------------------------------------------ worker thread
    def _dispatch(self, batch: list[BatchRequest]) -> None:
        """Fill each member's result slot (worker thread). Never raises."""
        try:
            outputs = self._run(batch)
        except Exception as error:
            if len(batch) == 1:
                batch[0].error = error
                return
            self._isolate(batch, error)
            return
        for member, output in zip(batch, outputs, strict=True):
            member.output = output

    def _isolate(self, batch: list[BatchRequest], batch_error: Exception) -> None:
        """Poison isolation: re-run each member alone, once."""
        for member in batch:
            try:
                member.output = self._run([member])[0]
            except Exception as error:
                member.error = error
        if all(member.error is None for member in batch):
            message = f"{type(batch_error).__name__}: {batch_error}"
            if message not in self._logged_batch_failures:
                self._logged_batch_failures.add(message)
                logger.warning(
                    "A dispatch of %d requests failed (%s) while every member succeeded serially. This is the "
                    "signature of a runtime-kwarg value whose per-row form is wrong at batch size > 1 (e.g. a "
                    "'row'-scoped value that is not one value per row); throughput degrades to serial until it "
                    "is fixed.",
                    len(batch),
                    message,
                )

    def _runtime_kwargs(self, batch: list[BatchRequest]) -> dict[str, Any]:
        kwargs = dict(self._static_call)
        rows = len(batch)
        for key, value in self._static_row.items():
            kwargs[key] = [value] * rows
        for key in batch[0].per_sample_runtime_kwargs:
            kwargs[key] = [member.per_sample_runtime_kwargs[key] for member in batch]
        return kwargs

    def _run(self, batch: list[BatchRequest]) -> list[Output]:
        """One `pipeline.generate` call for `batch`; one `Output` per record."""
        leader = batch[0]
        gen_kwargs = dict(leader.gen_kwargs)
        if self._chat_template_kwargs is not None:
            gen_kwargs["chat_template_kwargs"] = dict(self._chat_template_kwargs)
        runtime_kwargs = self._runtime_kwargs(batch)
        if leader.num_choices > 1:
            output = self._pipeline.generate(
                runtime_kwargs=runtime_kwargs,
                return_output=True,
                n=leader.num_choices,
                **{self._prompt_path: leader.prompt},
                **gen_kwargs,
            )
            return [output]
        outputs = self._pipeline.generate(
            runtime_kwargs=runtime_kwargs,
            return_output=True,
            **{self._prompt_path: [member.prompt for member in batch]},
            **gen_kwargs,
        )
        outputs = list(outputs)
        if len(outputs) != len(batch):
            raise RuntimeError(
                f"pipeline.generate returned {len(outputs)} output(s) for a dispatch of {len(batch)} prompt(s); "
                "the collator needs one Output per prompt."
            )
        return outputs
