"""Throughput of the steer_hydra Inspect provider against raw batched generation and Inspect's own `hf/` provider.

One process, one tiny checkpoint saved to disk, the same prompts, greedy decoding and the same `max_tokens` for:

  (a) provider@B   `inspect_ai.eval` through `as_inspect_model(pipeline)` at ceiling B (max_connections=B)
  (b) raw@B        `pipeline.generate(messages=..., return_output=True)` on pre-formed batches of B
  (c) provider@1   the provider at ceiling 1 (max_connections=1)
  (d) hf/@B        Inspect's `hf/<checkpoint>` provider (max_connections=B, do_sample=False), fully offline

Modes (a)-(c) run in interleaved rounds (the best round counts) so a noisy shared machine hurts them alike.
Torch runs with one intra-op thread by default (`--threads`), the same for every mode.
For the Inspect modes two rates are printed: `wall` (the whole `eval()` call, including Inspect's fixed start-up
and log finalization) and `samples` (first sample start to last sample end, from the log). Ratios use `samples`
for provider/raw (what the provider and collator control) and `wall` for provider/hf.

    .venv/bin/python benchmarks/provider_throughput.py                 # defaults: 256 samples, 64 new tokens
    .venv/bin/python benchmarks/provider_throughput.py --samples 128 --hf-samples 64 --rounds 1

Targets: provider/raw >= 0.85, provider/hf >= 3.

Reading the notes: "generate ms/call" is the pipeline's time per dispatch and "idle ms between calls" is the time
the model waits between dispatches. Under the provider that idle time is Inspect finishing one batch's samples
(scoring, logging) and starting the next ones on its event loop; the provider's own work per request (conversion,
config mapping, batch key, output assembly) is a fraction of a millisecond.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("INSPECT_DISPLAY", "none")
os.environ.setdefault("INSPECT_LOG_LEVEL", "error")

import torch  # noqa: E402
from inspect_ai import Task  # noqa: E402
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.dataset import MemoryDataset, Sample  # noqa: E402
from inspect_ai.scorer import includes  # noqa: E402
from inspect_ai.solver import generate  # noqa: E402

from steer_hydra.core import SteeringPipeline  # noqa: E402
from steer_hydra.evaluation import ProviderOptions, as_inspect_model  # noqa: E402
from steer_hydra.models import TinySpec, save_tiny_model  # noqa: E402

WORDS = (
    "the cat and dog run to the city of paris in france where the river meets the sea and the sun is red "
    "tell me a short story about a happy bird that can read and write please explain the sum of two numbers"
).split()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256, help="prompts per mode (default 256)")
    parser.add_argument("--hf-samples", type=int, default=None, help="prompts for hf/ (default: --samples)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per sample (default 64)")
    parser.add_argument("--batch", type=int, default=8, help="batch ceiling (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of (a)-(c) (default 2)")
    parser.add_argument("--serial-samples", type=int, default=None, help="prompts for provider@1 (default: all)")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1: OpenMP spin-waits make multi-thread CPU timings erratic on a "
        "shared machine, and one core stays free for Inspect's event loop; 0 keeps torch's default)",
    )
    parser.add_argument("--skip-hf", action="store_true", help="skip Inspect's hf/ provider")
    parser.add_argument(
        "--batching", default="static", choices=("static", "refill", "auto"), help="ProviderOptions.batching"
    )
    parser.add_argument(
        "--connections-factor",
        type=int,
        default=1,
        help="Inspect max_connections = factor * ceiling for the provider (2 keeps the next batch queued)",
    )
    parser.add_argument(
        "--lean-logs",
        action="store_true",
        help="log_realtime=False, log_buffer=100 for every Inspect mode (less per-sample logging work)",
    )
    return parser.parse_args(argv)


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


class CountingPipeline:
    """Delegates to the pipeline; records each dispatch's size and its start/end times (what the provider did)."""

    def __init__(self, pipeline: SteeringPipeline) -> None:
        self._pipeline = pipeline
        self.sizes: list[int] = []
        self.spans: list[tuple[float, float]] = []

    def __getattr__(self, name: str):
        return getattr(self._pipeline, name)

    def generate(self, *args, **kwargs):
        prompts = kwargs.get("messages") if kwargs.get("messages") is not None else kwargs.get("text")
        single = isinstance(prompts, str) or (prompts and isinstance(prompts[0], dict))
        self.sizes.append(1 if single else len(prompts))
        start = time.perf_counter()
        try:
            return self._pipeline.generate(*args, **kwargs)
        finally:
            self.spans.append((start, time.perf_counter()))

    def timing_ms(self) -> tuple[float, float]:
        """Mean dispatch duration and mean idle gap between consecutive dispatches, in milliseconds."""
        if not self.spans:  # refill: no static dispatch
            return float("nan"), float("nan")
        busy = statistics.mean(end - start for start, end in self.spans)
        gaps = [b[0] - a[1] for a, b in zip(self.spans, self.spans[1:], strict=False)] or [0.0]
        return 1000 * busy, 1000 * statistics.mean(gaps)


def sample_window_rate(log) -> float:
    starts = [datetime.fromisoformat(s.started_at) for s in log.samples if s.started_at]
    ends = [datetime.fromisoformat(s.completed_at) for s in log.samples if s.completed_at]
    return len(log.samples) / (max(ends) - min(starts)).total_seconds()


def output_tokens(log) -> int:
    return sum(s.output.usage.output_tokens for s in log.samples if s.output and s.output.usage)


def run_provider(pipeline, prompts, ceiling, max_tokens, log_dir, log_options, batching="static", factor=1) -> dict:
    counting = CountingPipeline(pipeline)
    options = ProviderOptions(max_batch_size=ceiling, reasoning_tags=None, batching=batching)
    model = as_inspect_model(counting, options=options)
    start = time.perf_counter()
    (log,) = inspect_eval(
        make_task(prompts),
        model=model,
        display="none",
        log_dir=str(log_dir),
        temperature=0,
        max_tokens=max_tokens,
        max_connections=factor * model.api.effective_max_batch,
        **log_options,
    )
    wall = time.perf_counter() - start
    model.api.close()
    if log.status != "success":
        raise RuntimeError(f"provider eval failed: {log.error}")
    busy_ms, gap_ms = counting.timing_ms()
    return {
        "wall": len(prompts) / wall,
        "samples": sample_window_rate(log),
        "tokens": output_tokens(log),
        "mean_dispatch": statistics.mean(counting.sizes) if counting.sizes else float("nan"),
        "dispatches": len(counting.sizes),
        "busy_ms": busy_ms,
        "gap_ms": gap_ms,
    }


def run_raw(pipeline, prompts, batch, max_tokens) -> dict:
    chats = [[{"role": "user", "content": p}] for p in prompts]
    tokens = 0
    pad = pipeline.tokenizer.pad_token_id
    start = time.perf_counter()
    for i in range(0, len(chats), batch):
        outputs = pipeline.generate(
            messages=chats[i : i + batch], return_output=True, max_new_tokens=max_tokens, do_sample=False
        )
        tokens += sum(int((o.output_ids != pad).sum()) for o in outputs)
    elapsed = time.perf_counter() - start
    rate = len(prompts) / elapsed
    batches = -(-len(chats) // batch)
    return {"wall": rate, "samples": rate, "tokens": tokens, "busy_ms": 1000 * elapsed / batches, "gap_ms": 0.0}


def run_hf(path, prompts, batch, max_tokens, log_dir, log_options) -> dict:
    start = time.perf_counter()
    (log,) = inspect_eval(
        make_task(prompts),
        model=f"hf/{path}",
        model_args={"device": "cpu", "do_sample": False},
        display="none",
        log_dir=str(log_dir),
        temperature=0,
        max_tokens=max_tokens,
        max_connections=batch,
        **log_options,
    )
    wall = time.perf_counter() - start
    if log.status != "success":
        raise RuntimeError(f"hf/ eval failed: {log.error}")
    return {"wall": len(prompts) / wall, "samples": sample_window_rate(log), "tokens": output_tokens(log)}


def best(results: list[dict]) -> dict:
    return max(results, key=lambda r: r["samples"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    log_options = {"log_realtime": False, "log_buffer": 100} if args.lean_logs else {}
    prompts = make_prompts(args.samples)
    serial_prompts = prompts[: args.serial_samples] if args.serial_samples else prompts
    hf_prompts = prompts[: args.hf_samples] if args.hf_samples else prompts
    spec = TinySpec(
        hidden_size=args.hidden_size, num_hidden_layers=args.layers, intermediate_size=args.intermediate_size
    )
    with tempfile.TemporaryDirectory(prefix="provider-throughput-") as tmp:
        root = Path(tmp)
        checkpoint = save_tiny_model(root / "checkpoint", spec)
        pipeline = SteeringPipeline(model_name_or_path=str(checkpoint), device="cpu").steer()
        params = sum(p.numel() for p in pipeline.model.parameters())
        print(
            f"tiny checkpoint: hidden={spec.hidden_size} layers={spec.num_hidden_layers} params={params:,}; "
            f"samples={len(prompts)} max_tokens={args.max_tokens} batch={args.batch} torch_threads="
            f"{torch.get_num_threads()} cpus={os.cpu_count()} lean_logs={args.lean_logs}",
            flush=True,
        )
        # warm-up (allocator, kernels, Inspect imports and registry)
        run_raw(pipeline, prompts[: args.batch], args.batch, 8)
        run_provider(pipeline, prompts[: args.batch], args.batch, 8, root / "warmup", log_options, args.batching)

        results: dict[str, list[dict]] = {"provider": [], "raw": [], "serial": []}
        for round_index in range(args.rounds):
            results["raw"].append(run_raw(pipeline, prompts, args.batch, args.max_tokens))
            results["provider"].append(
                run_provider(
                    pipeline,
                    prompts,
                    args.batch,
                    args.max_tokens,
                    root / f"p{round_index}",
                    log_options,
                    args.batching,
                    args.connections_factor,
                )
            )
            results["serial"].append(
                run_provider(pipeline, serial_prompts, 1, args.max_tokens, root / f"s{round_index}", log_options)
            )
            print(
                f"round {round_index + 1}: raw {results['raw'][-1]['samples']:.1f}/s, provider@{args.batch} "
                f"{results['provider'][-1]['samples']:.1f}/s, provider@1 {results['serial'][-1]['samples']:.1f}/s",
                flush=True,
            )
        hf = None
        if not args.skip_hf:
            hf = run_hf(checkpoint, hf_prompts, args.batch, args.max_tokens, root / "hf", log_options)
        pipeline.release()

    provider, raw, serial = best(results["provider"]), best(results["raw"]), best(results["serial"])

    def timing(result: dict) -> str:
        return f"generate {result['busy_ms']:.0f} ms/call, idle {result['gap_ms']:.0f} ms between calls"

    rows = [
        (f"(a) provider@{args.batch}", provider, f"mean dispatch {provider['mean_dispatch']:.2f}; {timing(provider)}"),
        (f"(b) raw@{args.batch}", raw, timing(raw)),
        ("(c) provider@1", serial, f"mean dispatch {serial['mean_dispatch']:.2f}; {timing(serial)}"),
    ]
    if hf is not None:
        rows.append((f"(d) hf/@{args.batch}", hf, f"{len(hf_prompts)} samples"))
    print(f"\n{'mode':<18}{'samples/s':>11}{'wall/s':>9}{'out tokens':>12}  note")
    for name, result, note in rows:
        print(f"{name:<18}{result['samples']:>11.2f}{result['wall']:>9.2f}{result['tokens']:>12}  {note}")
    print(f"\nprovider/raw (samples window)  {provider['samples'] / raw['samples']:.2f}   target >= 0.85")
    print(f"provider/raw (wall)            {provider['wall'] / raw['wall']:.2f}")
    print(f"provider@{args.batch}/provider@1          {provider['samples'] / serial['samples']:.2f}")
    if hf is not None:
        print(f"provider/hf (wall)             {provider['wall'] / hf['wall']:.2f}   target >= 3")
        print(f"provider/hf (samples window)   {provider['samples'] / hf['samples']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
