"""Live sample progress while Inspect runs: one tqdm bar (samples done / total, rate, ETA) fed by Inspect hooks.

How it runs: `sample_progress()` opens the bar and makes it the current one; a process-wide Inspect hook
(`@hooks`, enabled only while a bar is open) adds each task's planned samples when the task starts (the dataset
size cut by `limit` or `sample_id`, times epochs), advances the bar as samples end, and at the task's end
counts the samples it did not see (resumed from an earlier log) as done, so the bar always reaches its total.
The total grows as tasks start (one after another, or all at once when the suite runs them side by side); the bar
names the task that started last.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from inspect_ai.hooks import Hooks, SampleEnd, TaskEnd, TaskStart, hooks
from tqdm.auto import tqdm

_current: SampleProgress | None = None


class SampleProgress:
    """The bar and each running task's planned and finished sample counts (keyed by Inspect's eval_id)."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.tasks: dict[str, list[int]] = {}  # eval_id -> [planned, done]
        self._lock = threading.Lock()

    def task_started(self, eval_id: str, task: str, planned: int) -> None:
        with self._lock:
            self.tasks[eval_id] = [planned, 0]
            self.bar.total = (self.bar.total or 0) + planned
            self.bar.set_postfix_str(task.split("/")[-1], refresh=False)
            self.bar.refresh()

    def sample_ended(self, eval_id: str) -> None:
        with self._lock:
            counts = self.tasks.get(eval_id)
            if counts is not None and counts[1] < counts[0]:
                counts[1] += 1
                self.bar.update(1)

    def task_ended(self, eval_id: str) -> None:
        with self._lock:
            planned, done = self.tasks.pop(eval_id, (0, 0))
            if planned > done:  # samples carried over from an earlier log, or fewer than planned
                self.bar.update(planned - done)


def planned_samples(spec: Any) -> int:
    """How many samples a task will report: dataset size, cut by `limit` or `sample_id`, times epochs."""
    count = int(getattr(spec.dataset, "samples", None) or 0)
    config = spec.config
    limit = getattr(config, "limit", None)
    if isinstance(limit, int):
        count = min(count, limit)
    elif isinstance(limit, (tuple, list)) and len(limit) == 2:
        count = min(count, max(0, int(limit[1]) - int(limit[0])))
    sample_id = getattr(config, "sample_id", None)
    if sample_id is not None:
        count = len(sample_id) if isinstance(sample_id, (list, tuple)) else 1
    epochs = getattr(config, "epochs", None) or 1
    return count * int(epochs)


@hooks(name="steer_hydra_sample_progress", description="steer_hydra's live sample progress bar")
class SampleProgressHooks(Hooks):
    """Feeds the current `SampleProgress`; off (never called) while no bar is open."""

    def enabled(self) -> bool:
        return _current is not None

    async def on_task_start(self, data: TaskStart) -> None:
        if _current is not None:
            _current.task_started(data.eval_id, str(data.spec.task), planned_samples(data.spec))

    async def on_sample_end(self, data: SampleEnd) -> None:
        if _current is not None:
            _current.sample_ended(data.eval_id)

    async def on_task_end(self, data: TaskEnd) -> None:
        if _current is not None:
            _current.task_ended(data.eval_id)


@contextlib.contextmanager
def sample_progress(*, enabled: bool, desc: str = "samples") -> Iterator[SampleProgress | None]:
    """A samples bar for the evaluations run inside the block (None when disabled); closed on exit."""
    global _current
    if not enabled:
        yield None
        return
    progress = SampleProgress(tqdm(total=0, desc=desc, unit="sample", dynamic_ncols=True, leave=True))
    previous, _current = _current, progress
    try:
        yield progress
    finally:
        _current = previous
        progress.bar.close()
