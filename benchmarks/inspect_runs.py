"""The Inspect side of the throughput benchmarks: prompts, the task, one eval through the provider or `hf/`.

Shared by `provider_throughput.py`, `realistic_throughput.py`, `inspect_overhead.py` and `vllm_realistic.py` so
that every benchmark measures the provider (and Inspect's own `hf/` provider) the same way: the same prompts,
greedy decoding, one `max_tokens`, `display="none"`, and rates over the sample window (first sample start to
last sample end, from the log) as well as over the whole `eval()` call.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("INSPECT_DISPLAY", "none")
os.environ.setdefault("INSPECT_LOG_LEVEL", "error")

from inspect_ai import Task  # noqa: E402
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.dataset import MemoryDataset, Sample  # noqa: E402
from inspect_ai.model import get_model  # noqa: E402
from inspect_ai.scorer import includes  # noqa: E402
from inspect_ai.solver import generate  # noqa: E402

from steer_hydra.evaluation import ProviderOptions, as_inspect_model  # noqa: E402

WORDS = (
    "the cat and dog run to the city of paris in france where the river meets the sea and the sun is red "
    "tell me a short story about a happy bird that can read and write please explain the sum of two numbers"
).split()

LEAN_LOGS = {"log_realtime": False, "log_buffer": 100}


def make_prompts(count: int) -> list[str]:
    """Deterministic prompts of varied length (so batches are ragged, as in a real task)."""
    prompts = []
    for i in range(count):
        start, length = (7 * i) % len(WORDS), 4 + (i % 9)
        words = [WORDS[(start + k) % len(WORDS)] for k in range(length)]
        prompts.append(f"{' '.join(words)} {i}")
    return prompts


def make_task(prompts: list[str]) -> Task:
    samples = [Sample(input=p, target="paris", id=i) for i, p in enumerate(prompts)]
    return Task(dataset=MemoryDataset(samples), solver=[generate()], scorer=includes(), name="throughput")


def continuation_length(output: Any, pad: int | None) -> int:
    """Generated tokens of a one-row `Output` (padding excluded)."""
    ids = output.output_ids[0]
    return int((ids != pad).sum()) if pad is not None else int(ids.numel())


class CountingPipeline:
    """Delegates to the pipeline; records each static dispatch's size, start/end times and row-steps."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline
        self.sizes: list[int] = []
        self.spans: list[tuple[float, float]] = []
        self.useful = 0  # tokens returned by static dispatches
        self.computed = 0  # row-steps they decoded (rows x the longest row)

    def __getattr__(self, name: str):
        return getattr(self._pipeline, name)

    def generate(self, *args, **kwargs):
        prompts = kwargs.get("messages") if kwargs.get("messages") is not None else kwargs.get("text")
        single = isinstance(prompts, str) or (prompts and isinstance(prompts[0], dict))
        self.sizes.append(1 if single else len(prompts))
        start = time.perf_counter()
        try:
            outputs = self._pipeline.generate(*args, **kwargs)
        finally:
            self.spans.append((start, time.perf_counter()))
        if isinstance(outputs, list) and outputs:
            rows = [continuation_length(o, self._pipeline.tokenizer.pad_token_id) for o in outputs]
            self.useful += sum(rows)
            self.computed += len(rows) * max(rows)
        return outputs

    def timing_ms(self) -> tuple[float, float]:
        """Mean dispatch duration and mean idle gap between consecutive dispatches, in milliseconds."""
        if not self.spans:  # refill: no static dispatch
            return float("nan"), float("nan")
        busy = statistics.mean(end - start for start, end in self.spans)
        gaps = [b[0] - a[1] for a, b in zip(self.spans, self.spans[1:], strict=False)] or [0.0]
        return 1000 * busy, 1000 * statistics.mean(gaps)


def sample_window_seconds(log) -> float:
    starts = [datetime.fromisoformat(s.started_at) for s in log.samples if s.started_at]
    ends = [datetime.fromisoformat(s.completed_at) for s in log.samples if s.completed_at]
    return (max(ends) - min(starts)).total_seconds()


def sample_window_rate(log) -> float:
    return len(log.samples) / sample_window_seconds(log)


def timed_eval(
    model: Any, prompts: list[str], max_tokens: int, connections: int, log_dir: Path, log_options: dict[str, Any]
) -> tuple[Any, float, float]:
    """One greedy `inspect_ai.eval` of the prompts task on `model`: `(log, wall seconds, CPU seconds)`."""
    start, cpu = time.perf_counter(), time.process_time()
    (log,) = inspect_eval(
        make_task(prompts),
        model=model,
        display="none",
        log_dir=str(log_dir),
        temperature=0,
        max_tokens=max_tokens,
        max_connections=connections,
        **log_options,
    )
    return log, time.perf_counter() - start, time.process_time() - cpu


def check_success(log: Any, what: str) -> None:
    if log.status != "success":
        raise RuntimeError(f"{what} eval failed: {log.error}")


def run_provider(
    pipeline: Any,
    prompts: list[str],
    *,
    ceiling: int,
    max_tokens: int,
    log_dir: Path,
    log_options: dict[str, Any],
    batching: str = "static",
    factor: int | None = None,
) -> dict[str, Any]:
    """One `inspect_ai.eval` through `as_inspect_model(pipeline)`.

    `factor` sets Inspect's `max_connections` to `factor * ceiling`; None takes the provider's own
    `max_connections()` (what `InspectSuite` passes). Returns rates over the sample window (`samples`,
    `tok_s`) and the wall time, static dispatch sizes and timing, waste, and refill occupancy.
    """
    counting = CountingPipeline(pipeline)
    options = ProviderOptions(max_batch_size=ceiling, reasoning_tags=None, batching=batching)
    model = as_inspect_model(counting, options=options)
    connections = model.api.max_connections() if factor is None else factor * model.api.batch_ceiling
    log, wall, cpu = timed_eval(model, prompts, max_tokens, connections, log_dir, log_options)
    engine = getattr(model.api.collator, "engine", None)
    occupancy = None
    if engine is not None and engine.stats.slot_steps:
        occupancy = engine.stats.row_steps / engine.stats.slot_steps
    model.api.close()
    check_success(log, "provider")
    window = sample_window_seconds(log)
    useful = sum(s.output.usage.output_tokens for s in log.samples if s.output and s.output.usage)
    busy_ms, gap_ms = counting.timing_ms()
    return {
        "samples_s": len(log.samples) / window,
        "wall": len(prompts) / wall,
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": useful,
        "tok_s": useful / window,
        "waste": 1 - counting.useful / counting.computed if counting.computed else 0.0,
        "occupancy": occupancy,
        "connections": connections,
        "mean_dispatch": statistics.mean(counting.sizes) if counting.sizes else None,
        "dispatches": len(counting.sizes),
        "busy_ms": busy_ms,
        "gap_ms": gap_ms,
        "completions": {s.id: s.output.completion for s in log.samples},
    }


def run_hf(
    path: str | Path,
    prompts: list[str],
    *,
    batch: int,
    max_tokens: int,
    log_dir: Path,
    log_options: dict[str, Any],
    device: str = "cpu",
    dtype: str = "float32",
    hook: Any = None,
) -> dict[str, Any]:
    """One `inspect_ai.eval` through Inspect's own `hf/` provider on the checkpoint at `path` (greedy).

    `hook` (an object with `install(model) -> handle`) is installed on `hf/`'s model for the run (the realistic
    workload's EOS hazard). Output tokens are counted from the completions: `hf/` reports each row's padded
    batch length as its output tokens.
    """
    model_args: dict[str, Any] = {"device": "cuda:0" if device == "cuda" else device, "do_sample": False}
    if dtype != "float32":
        model_args["dtype"] = dtype
    model = get_model(f"hf/{path}", **model_args)
    handle = hook.install(model.api.model) if hook is not None else None
    try:
        log, wall, cpu = timed_eval(model, prompts, max_tokens, batch, log_dir, log_options)
    finally:
        if handle is not None:
            handle.remove()
    check_success(log, "hf/")
    window = sample_window_seconds(log)
    tokenizer = model.api.tokenizer
    useful = sum(len(tokenizer(s.output.completion, add_special_tokens=False)["input_ids"]) for s in log.samples)
    return {
        "samples_s": len(log.samples) / window,
        "wall": len(prompts) / wall,
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": useful,
        "tok_s": useful / window,
        "waste": None,
        "occupancy": None,
    }
