"""`RefillCollator`: serves Inspect's concurrent requests from one continuously refilled decode loop.

How it runs: `serve()` puts an admitted record in a thread-safe inbox and waits on its `done` event. One worker
thread (started by the first request, ended when the inbox is empty and no row is active) drives the pipeline's
refill engine: between decode steps it admits waiting records into free slots (records with the same batch key
are prefilled together, up to the room left) and delivers each row as soon as it finishes, so Inspect scores
that sample and sends its successor while the other rows keep decoding. Records the engine cannot take
(`num_choices > 1`, a per-sample runtime-kwarg key set other than the running rows', or a call the pipeline
refuses to refill) are dispatched statically on the same thread between two steps, with the collator's
poison isolation.

Invariants:
- the worker thread is the only caller of the pipeline (one generation in flight, as on the static path);
- `done` events are set on the event-loop thread (`call_soon_threadsafe` / trio's `run_sync_soon`);
- a row's tokens depend only on its own request (prompt, gen kwargs, runtime kwargs, seed), not on which
  records shared the loop with it: greedy rows match static batching; a seeded sampling row draws from its own
  generator, seeded from its request's own seed (`seeds_per_request`, see `steer_hydra.evaluation.batching`)
  whatever `seed_scope` says, so a rerun repeats its draws whatever the arrival timing.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from steer_hydra.evaluation.batching import BatchRequest, LockLeaderCollator, loop_caller

if TYPE_CHECKING:
    from steer_hydra.core.output import Output

logger = logging.getLogger(__name__)


def threadsafe_setter(event: anyio.Event) -> Callable[[], None]:
    """A function that sets `event` from any thread (call on the event-loop thread that awaits it)."""
    call = loop_caller()
    return lambda: call(event.set)


class RefillCollator(LockLeaderCollator):
    """A collator whose dispatches are rows of one refilled decode loop (see the module docstring).

    Takes `LockLeaderCollator`'s arguments; the pipeline must have an empty `refill_blockers()`.
    """

    seeds_per_request = True

    def __init__(self, pipeline: Any, **kwargs: Any) -> None:
        super().__init__(pipeline, **kwargs)
        self._inbox: deque[BatchRequest] = deque()
        self._inbox_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._engine: Any = None
        self._engine_keys: tuple[str, ...] | None = None
        self._in_engine: set[BatchRequest] = set()  # records admitted to the engine and not finished
        self.static_dispatches = 0

    @property
    def queued(self) -> int:
        return len(self._inbox)

    def close(self) -> None:
        """Refuse new admissions; rows in flight finish, except rows whose requesters stopped waiting (their samples
        were cancelled, e.g. by Ctrl-C), which are dropped at the next step; waits for the worker thread to end
        (at most `CLOSE_WAIT` seconds); the engine (and its model reference) is dropped after."""
        super().close()
        with self._inbox_lock:
            if self._worker is None:
                self._engine = None

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive (it ends once no request is queued and no row is active)."""
        return self._worker is not None

    @property
    def engine(self) -> Any:
        """The refill engine (None before the first request); its `stats` count steps and admissions."""
        return self._engine

    async def serve(self, record: BatchRequest) -> Output:
        record.notify = threadsafe_setter(record.done)
        with self._inbox_lock:
            self._inbox.append(record)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="steer-hydra-refill", daemon=True)
                self._worker.start()
        try:
            await record.done.wait()
        finally:
            if not record.done.is_set():
                record.abandoned = True  # nobody waits for it any more: once closed, its row is dropped
                with self._inbox_lock:  # a waiter cancelled while queued is never dispatched
                    if record in self._inbox:
                        self._inbox.remove(record)
        if record.error is not None:
            raise record.error
        if record.output is None:
            raise RuntimeError("The refill loop holding this request stopped before it produced a result.")
        return record.output

    # ------------------------------------------------------------------ worker thread
    def _work(self) -> None:
        try:
            while True:
                with self._inbox_lock:
                    if not self._inbox and (self._engine is None or self._engine.idle):
                        self._worker = None
                        if self._closed:
                            self._engine = None  # holds the model: let release() free it
                        return
                    refill, static = self._take()
                if static:
                    self._run_static(static)
                if refill:
                    self._admit(refill)
                if self._closed and self._engine is not None and self._nobody_waits():
                    self._engine.abort(RuntimeError("The provider was closed while no requester waited for the row."))
                if self._engine is not None:
                    self._engine.step()
        except BaseException as error:  # the loop itself broke: fail what it holds, let the next request restart it
            logger.exception("The refill loop stopped.")
            with self._inbox_lock:
                stranded = list(self._inbox)
                self._inbox.clear()
                self._worker = None
            engine, self._engine = self._engine, None
            if engine is not None:
                engine.abort(error)
            for record in stranded:
                self._finish(record, None, error)
            raise

    def _nobody_waits(self) -> bool:
        """Whether every row in the engine belongs to a requester that stopped waiting (worker thread)."""
        return not self._engine.idle and all(record.abandoned for record in list(self._in_engine))

    def _take(self) -> tuple[list[BatchRequest], list[BatchRequest]]:
        """Under the inbox lock: the next records for the engine (one batch key, up to the room) or for a static
        dispatch (the head record plus same-key records, up to the ceiling)."""
        if not self._inbox:
            return [], []
        head = self._inbox[0]
        keys = tuple(sorted(head.per_sample_runtime_kwargs))
        engine_fits = head.num_choices == 1 and (self._engine is None or self._engine.idle or keys == self._engine_keys)
        if not engine_fits:
            return [], self._pop_same_key(head, self._batch_ceiling if head.num_choices == 1 else 1)
        room = self._batch_ceiling if self._engine is None else self._engine.room
        if room == 0:
            return [], []
        return self._pop_same_key(head, room), []

    def _pop_same_key(self, head: BatchRequest, limit: int) -> list[BatchRequest]:
        taken = [record for record in self._inbox if record.batch_key == head.batch_key][:limit]
        for record in taken:
            self._inbox.remove(record)
        return taken

    def _admit(self, group: list[BatchRequest]) -> None:
        if self._engine is None:
            self._engine = self._pipeline.open_refill(self._batch_ceiling)
        leader = group[0]
        gen_kwargs = dict(leader.gen_kwargs)
        if self._chat_template_kwargs is not None:
            gen_kwargs["chat_template_kwargs"] = dict(self._chat_template_kwargs)
        callbacks = [self._callback(record) for record in group]
        try:
            self._pipeline.admit_refill(
                self._engine,
                callbacks,
                runtime_kwargs=self._runtime_kwargs(group),
                row_seeds=[record.gen_kwargs.get("seed") for record in group],
                **{self._prompt_path: [record.prompt for record in group]},
                **gen_kwargs,
            )
        except Exception as error:  # refused or failed before any row started: the static path decides per record
            logger.debug("Refill admission failed (%s); dispatching %d request(s) statically.", error, len(group))
            self._run_static(group)
            return
        self._engine_keys = tuple(sorted(leader.per_sample_runtime_kwargs))
        self._in_engine.update(record for record in group if record.output is None and record.error is None)

    def _callback(self, record: BatchRequest) -> Callable[[Any, BaseException | None], None]:
        def on_done(output: Any, error: BaseException | None) -> None:
            self._in_engine.discard(record)
            self._finish(record, output, error)

        return on_done

    def _run_static(self, batch: list[BatchRequest]) -> None:
        self.static_dispatches += 1
        self._dispatch(batch)
        for record in batch:
            record.notify()

    @staticmethod
    def _finish(record: BatchRequest, output: Any, error: BaseException | None) -> None:
        record.output, record.error = output, error
        if record.notify is not None:
            record.notify()
