"""Throughput of the steer_hydra Inspect provider against raw batched generation and Inspect's own `hf/` provider.

One process, one tiny checkpoint saved to disk, the same prompts, greedy decoding and the same `max_tokens` for:

  (a) provider@B   `inspect_ai.eval` through `as_inspect_model(pipeline)` at ceiling B (max_connections: the
                   provider's `max_connections()`, 2B, unless --connections-factor says otherwise)
  (b) raw@B        `pipeline.generate(messages=..., return_output=True)` on pre-formed batches of B
  (c) provider@1   the provider at ceiling 1
  (d) hf/@B        Inspect's `hf/<checkpoint>` provider (max_connections=B, do_sample=False), fully offline

Modes (a)-(c) run in interleaved rounds (the best round counts) so a noisy shared machine hurts them alike.
The Inspect side (prompts, task, one eval through the provider or `hf/`) is `inspect_runs.py`, shared with
`realistic_throughput.py`. `--checkpoint/--device/--dtype` run it on another model (the GPU driver uses them).
Torch runs with one intra-op thread by default (`--threads`), the same for every mode.
For the Inspect modes two rates are printed: `wall` (the whole `eval()` call, including Inspect's fixed start-up
and log finalization) and `samples` (first sample start to last sample end, from the log). Ratios use `samples`
for provider/raw (what the provider and collator control) and `wall` for provider/hf.

    .venv/bin/python benchmarks/provider_throughput.py                 # defaults: 256 samples, 64 new tokens
    .venv/bin/python benchmarks/provider_throughput.py --samples 128 --hf-samples 64 --rounds 1

Targets: provider/raw >= 0.95 with Inspect's default logs (0.90 on a GPU), provider/hf >= 3.

Reading the notes: "generate ms/call" is the pipeline's time per dispatch and "idle ms between calls" is the time
the model waits between dispatches. Under the provider that idle time is Inspect finishing one batch's samples
(scoring, logging) and starting the next ones on its event loop; the provider's own work per request (conversion,
config mapping, batch key, output assembly) is a fraction of a millisecond.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from inspect_runs import LEAN_LOGS, make_prompts, run_hf, run_provider  # noqa: E402

from steer_hydra.core import ModelSource, SteeringPipeline  # noqa: E402
from steer_hydra.models import TinySpec, save_tiny_model  # noqa: E402


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
        default=None,
        help="Inspect max_connections = factor * ceiling for the provider (default: its max_connections(), 2x)",
    )
    parser.add_argument(
        "--lean-logs",
        action="store_true",
        help="log_realtime=False, log_buffer=100 for every Inspect mode (less per-sample logging work)",
    )
    parser.add_argument("--checkpoint", default=None, help="use this checkpoint instead of building the tiny one")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    return parser.parse_args(argv)


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
    return {"wall": rate, "samples_s": rate, "tokens": tokens, "busy_ms": 1000 * elapsed / batches, "gap_ms": 0.0}


def best(results: list[dict]) -> dict:
    return max(results, key=lambda r: r["samples_s"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    log_options = dict(LEAN_LOGS) if args.lean_logs else {}
    prompts = make_prompts(args.samples)
    serial_prompts = prompts[: args.serial_samples] if args.serial_samples else prompts
    hf_prompts = prompts[: args.hf_samples] if args.hf_samples else prompts
    spec = TinySpec(
        hidden_size=args.hidden_size, num_hidden_layers=args.layers, intermediate_size=args.intermediate_size
    )
    with tempfile.TemporaryDirectory(prefix="provider-throughput-") as tmp:
        root = Path(tmp)
        checkpoint = Path(args.checkpoint) if args.checkpoint else save_tiny_model(root / "checkpoint", spec)
        dtype = getattr(torch, args.dtype)
        pipeline = SteeringPipeline(
            ModelSource(str(checkpoint), device=args.device, hf_model_kwargs={"dtype": dtype})
        ).steer()
        params = sum(p.numel() for p in pipeline.model.parameters())
        print(
            f"checkpoint params={params:,} device={args.device} dtype={args.dtype}; "
            f"samples={len(prompts)} max_tokens={args.max_tokens} batch={args.batch} torch_threads="
            f"{torch.get_num_threads()} cpus={os.cpu_count()} lean_logs={args.lean_logs} "
            f"load={os.getloadavg()[0]:.1f}",
            flush=True,
        )
        # warm-up (allocator, kernels, Inspect imports and registry)
        run_raw(pipeline, prompts[: args.batch], args.batch, 8)
        common = {"max_tokens": args.max_tokens, "log_options": log_options}
        run_provider(
            pipeline, prompts[: args.batch], ceiling=args.batch, max_tokens=8, log_dir=root / "w", log_options={}
        )

        results: dict[str, list[dict]] = {"provider": [], "raw": [], "serial": []}
        for round_index in range(args.rounds):
            results["raw"].append(run_raw(pipeline, prompts, args.batch, args.max_tokens))
            results["provider"].append(
                run_provider(
                    pipeline,
                    prompts,
                    ceiling=args.batch,
                    log_dir=root / f"p{round_index}",
                    batching=args.batching,
                    factor=args.connections_factor,
                    **common,
                )
            )
            results["serial"].append(
                run_provider(pipeline, serial_prompts, ceiling=1, log_dir=root / f"s{round_index}", **common)
            )
            print(
                f"round {round_index + 1}: raw {results['raw'][-1]['samples_s']:.1f}/s, provider@{args.batch} "
                f"{results['provider'][-1]['samples_s']:.1f}/s, provider@1 {results['serial'][-1]['samples_s']:.1f}/s",
                flush=True,
            )
        hf = None
        if not args.skip_hf:
            hf = run_hf(
                checkpoint,
                hf_prompts,
                batch=args.batch,
                log_dir=root / "hf",
                device=args.device,
                dtype=args.dtype,
                **common,
            )
        pipeline.release()

    provider, raw, serial = best(results["provider"]), best(results["raw"]), best(results["serial"])

    def timing(result: dict) -> str:
        return f"generate {result['busy_ms']:.0f} ms/call, idle {result['gap_ms']:.0f} ms between calls"

    def dispatches(result: dict) -> str:  # no static dispatch under refill
        if result["mean_dispatch"] is None:
            return "refill loop"
        return f"mean dispatch {result['mean_dispatch']:.2f}; {timing(result)}"

    rows = [
        (f"(a) provider@{args.batch}", provider, dispatches(provider)),
        (f"(b) raw@{args.batch}", raw, timing(raw)),
        ("(c) provider@1", serial, dispatches(serial)),
    ]
    if hf is not None:
        rows.append((f"(d) hf/@{args.batch}", hf, f"{len(hf_prompts)} samples"))
    print(f"\n{'mode':<18}{'samples/s':>11}{'wall/s':>9}{'out tokens':>12}  note")
    for name, result, note in rows:
        print(f"{name:<18}{result['samples_s']:>11.2f}{result['wall']:>9.2f}{result['tokens']:>12}  {note}")
    ratio = provider["samples_s"] / raw["samples_s"]
    print(f"\nprovider/raw (samples window)  {ratio:.2f}   target >= 0.95 (0.90 on a GPU)")
    print(f"provider/raw (wall)            {provider['wall'] / raw['wall']:.2f}")
    print(f"provider@{args.batch}/provider@1          {provider['samples_s'] / serial['samples_s']:.2f}")
    if hf is not None:
        print(f"provider/hf (wall)             {provider['wall'] / hf['wall']:.2f}   target >= 3")
        print(f"provider/hf (samples window)   {provider['samples_s'] / hf['samples_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
