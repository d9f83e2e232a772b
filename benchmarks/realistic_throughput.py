"""Throughput when output lengths vary: static batching vs slot refill, raw and through Inspect.

Workload (seeded): the tiny checkpoint of `provider_throughput.py`, greedy decoding, one `max_tokens` for every
sample (as a real task sets it), and rows that end by EOS at long-tailed lengths. A random model almost never
emits EOS on its own, so the benchmark gives it a seeded EOS hazard: a forward hook forces EOS at the step whose
(last token, position id) hashes below `a / (position + b)`. The hazard falls with the position, so lengths are
long-tailed (many short answers, a few that run to `max_tokens`), and a row's length depends only on its own
tokens: static and refill decode the same rows to the same lengths. The printed length summary shows the spread.

Modes, at one batch ceiling B, run in interleaved rounds (medians reported; the machine may be shared):
  raw-static@B      `pipeline.generate` on pre-formed batches of B (each batch runs until its longest row ends)
  raw-refill@B      the pipeline's refill engine, fed from a queue (a finished row's slot takes the next prompt)
  provider-static@B `inspect_ai.eval` through `as_inspect_model(..., batching="static")`, max_connections: the
                    provider's `max_connections()` (2B); `provider-static-xN` sets N * B
  provider-refill@B the same with `batching="refill"`
  hf/@B             Inspect's own `hf/` provider (the same checkpoint and EOS hazard), max_connections=B, in every
                    round on `--hf-samples` samples (it is slow: it waits for its queue to drain)

The Inspect side (prompts, task, one eval through the provider or `hf/`) is `inspect_runs.py`, shared with
`provider_throughput.py`. Ratios are printed two ways: of the medians, and the median over rounds of each
round's ratio (paired within a round, so a load swing between rounds cancels; the machine may be shared).

Columns: useful tok/s (tokens returned to Inspect, or by the pipeline, per second of the sample window), samples/s,
waste (the fraction of row-steps spent on rows that had already finished: static batches only; refill never
decodes a finished row), occupancy (active rows / B over the decode steps), and CPU s (the process's CPU time
for the run: every thread, Inspect's start-up and log finalization included; on a loaded machine a more stable
measure of the work than the wall clock).

    .venv/bin/python benchmarks/realistic_throughput.py                    # defaults: 96 samples, B=8, 3 rounds
    .venv/bin/python benchmarks/realistic_throughput.py --samples 32 --rounds 1 --skip-hf     # quick look

Target: raw-refill / raw-static >= 1.5 in useful tokens/s.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from inspect_runs import LEAN_LOGS, make_prompts, run_hf, run_provider  # noqa: E402

from steer_hydra.core import ModelSource, SteeringPipeline  # noqa: E402
from steer_hydra.models import TinySpec, save_tiny_model  # noqa: E402

MODES = ("raw-static", "raw-refill", "provider-static", "provider-refill")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {MODES}")
    parser.add_argument("--hazard-a", type=float, default=1.3, help="EOS hazard a / (position + b)")
    parser.add_argument("--hazard-b", type=float, default=12.0)
    parser.add_argument("--seed", type=int, default=0, help="seeds the EOS hazard")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--hf-samples", type=int, default=None, help="samples for hf/ (default: --samples)")
    parser.add_argument("--lean-logs", action="store_true", help="log_realtime=False, log_buffer=100")
    parser.add_argument(
        "--connections-factor",
        type=int,
        default=None,
        help="Inspect max_connections = factor * B for the provider modes (default: max_connections(), 2B)",
    )
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval (seconds; Python's default 0.005)"
    )
    parser.add_argument("--checkpoint", default=None, help="use this checkpoint instead of building the tiny one")
    return parser.parse_args(argv)


class EosHazard:
    """Forward hook on a causal LM: force EOS where hash(last token, position) < a / (position + b)."""

    def __init__(self, eos_id: int, a: float, b: float, seed: int) -> None:
        self.eos_id, self.a, self.b, self.seed = eos_id, a, b, seed

    def __call__(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids")
        positions = kwargs.get("position_ids")
        if ids is None or positions is None:
            return None
        token, position = ids[:, -1].long(), positions[:, -1].long()
        mixed = (token * 2654435761 + position * 40503 + self.seed * 97 + 12345) % 100003
        draw = mixed.double() / 100003
        hit = draw < self.a / (position.double() + self.b)
        if bool(hit.any()):
            logits = output.logits.clone()
            top = logits[:, -1].max(dim=-1).values
            logits[hit, -1, self.eos_id] = top[hit] + 10.0
            output.logits = logits
        return output

    def install(self, model: torch.nn.Module):
        return model.register_forward_hook(self, with_kwargs=True)


def lengths_of(outputs, pad: int) -> list[int]:
    return [int((o.output_ids[0] != pad).sum()) for o in outputs]


def run_raw_static(pipeline, chats, batch, max_tokens) -> dict:
    pad = pipeline.tokenizer.pad_token_id
    lengths, computed = [], 0
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(chats), batch):
        outputs = pipeline.generate(
            messages=chats[i : i + batch], return_output=True, max_new_tokens=max_tokens, do_sample=False
        )
        rows = lengths_of(outputs, pad)
        lengths += rows
        computed += len(rows) * max(rows)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    useful = sum(lengths)
    return {
        "tokens": useful,
        "tok_s": useful / elapsed,
        "samples_s": len(chats) / elapsed,
        "cpu_s": cpu,
        "waste": 1 - useful / computed,
        "occupancy": None,
        "lengths": lengths,
        "busy_ms": 1000 * elapsed / -(-len(chats) // batch),
    }


def run_raw_refill(pipeline, chats, batch, max_tokens) -> dict:
    engine = pipeline.open_refill(batch)
    lengths: list[int] = []
    pad = pipeline.tokenizer.pad_token_id

    def done(output, error):
        if error is not None:
            raise error
        lengths.append(int((output.output_ids[0] != pad).sum()))

    queue = list(chats)
    start, cpu = time.perf_counter(), time.process_time()
    while queue or not engine.idle:
        if queue and engine.room:
            group, queue = queue[: engine.room], queue[engine.room :]
            pipeline.admit_refill(
                engine, [done] * len(group), messages=group, max_new_tokens=max_tokens, do_sample=False
            )
        engine.step()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    useful = sum(lengths)
    stats = engine.stats
    return {
        "tokens": useful,
        "tok_s": useful / elapsed,
        "samples_s": len(chats) / elapsed,
        "cpu_s": cpu,
        "waste": 0.0,
        "occupancy": stats.row_steps / stats.slot_steps if stats.slot_steps else None,
        "lengths": lengths,
    }


def _provider_mode(mode: str) -> tuple[str, int | None] | None:
    """`provider-static` / `provider-refill`, optionally `-xN` (Inspect max_connections = N * B)."""
    parts = mode.split("-")
    if len(parts) not in (2, 3) or parts[0] != "provider" or parts[1] not in ("static", "refill"):
        return None
    if len(parts) == 3:
        if not (parts[2].startswith("x") and parts[2][1:].isdigit()):
            return None
        return parts[1], int(parts[2][1:])
    return parts[1], None


def median_of(results: list[dict], key: str):
    values = [r[key] for r in results if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    modes = [m for m in args.modes.split(",") if m]
    if args.hazard_a == 0 and args.threads:  # fixed-length workload: every row runs to max_tokens
        logging.getLogger(__name__).info("No EOS hazard: every row decodes max_tokens tokens.")
    unknown = sorted(m for m in modes if m not in MODES and not _provider_mode(m))
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; valid: {MODES}")
    log_options = dict(LEAN_LOGS) if args.lean_logs else {}
    prompts = make_prompts(args.samples)
    chats = [[{"role": "user", "content": p}] for p in prompts]
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="realistic-throughput-") as tmp:
        root = Path(tmp)
        if args.checkpoint:
            checkpoint = Path(args.checkpoint)
        else:
            spec = TinySpec(
                hidden_size=args.hidden_size, num_hidden_layers=args.layers, intermediate_size=args.intermediate_size
            )
            checkpoint = save_tiny_model(root / "checkpoint", spec)
        pipeline = SteeringPipeline(
            ModelSource(str(checkpoint), device=args.device, hf_model_kwargs={"dtype": dtype})
        ).steer()
        eos = pipeline.model.generation_config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        hazard = EosHazard(int(eos), args.hazard_a, args.hazard_b, args.seed)
        handle = hazard.install(pipeline.model)
        params = sum(p.numel() for p in pipeline.model.parameters())
        print(
            f"checkpoint params={params:,} device={args.device} dtype={args.dtype}; samples={len(prompts)} "
            f"max_tokens={args.max_tokens} batch={args.batch} rounds={args.rounds} torch_threads="
            f"{torch.get_num_threads()} cpus={os.cpu_count()} lean_logs={args.lean_logs} "
            f"connections={args.connections_factor or 'max_connections() '}xB switch={sys.getswitchinterval()} "
            f"hazard={args.hazard_a}/(pos+{args.hazard_b}) seed={args.seed} load={os.getloadavg()[0]:.1f}",
            flush=True,
        )
        # warm-up of every path on a few prompts
        run_raw_static(pipeline, chats[: args.batch], args.batch, 8)
        run_raw_refill(pipeline, chats[: args.batch], args.batch, 8)
        for batching in ("static", "refill"):
            if any(_provider_mode(m) and _provider_mode(m)[0] == batching for m in modes):
                run_provider(
                    pipeline,
                    prompts[: args.batch],
                    ceiling=args.batch,
                    max_tokens=8,
                    log_dir=root / f"w{batching}",
                    log_options=log_options,
                    batching=batching,
                )
        hf_prompts = prompts[: args.hf_samples] if args.hf_samples else prompts
        if not args.skip_hf:
            modes.append("hf")

        results: dict[str, list[dict]] = {m: [] for m in modes}
        for round_index in range(args.rounds):
            order = modes[round_index % len(modes) :] + modes[: round_index % len(modes)]  # rotate the order
            for mode in order:
                if mode == "hf":
                    result = run_hf(
                        checkpoint,
                        hf_prompts,
                        batch=args.batch,
                        max_tokens=args.max_tokens,
                        log_dir=root / f"hf{round_index}",
                        log_options=log_options,
                        device=args.device,
                        dtype=args.dtype,
                        hook=hazard,
                    )
                elif mode == "raw-static":
                    result = run_raw_static(pipeline, chats, args.batch, args.max_tokens)
                elif mode == "raw-refill":
                    result = run_raw_refill(pipeline, chats, args.batch, args.max_tokens)
                else:
                    batching, factor = _provider_mode(mode)
                    result = run_provider(
                        pipeline,
                        prompts,
                        ceiling=args.batch,
                        max_tokens=args.max_tokens,
                        log_dir=root / f"{mode}{round_index}",
                        log_options=log_options,
                        batching=batching,
                        factor=factor or args.connections_factor,
                    )
                results[mode].append(result)
            line = ", ".join(f"{m} {results[m][-1]['tok_s']:.0f} tok/s" for m in modes)
            print(f"round {round_index + 1}: {line}", flush=True)
        lengths = next((r[0]["lengths"] for r in results.values() if r and "lengths" in r[0]), None)
        handle.remove()
        pipeline.release()

    if lengths:
        ordered = sorted(lengths)
        print(
            f"\noutput lengths: min {ordered[0]}, median {statistics.median(ordered):.0f}, "
            f"p90 {ordered[int(0.9 * (len(ordered) - 1))]}, max {ordered[-1]}, mean {statistics.mean(ordered):.1f}"
        )
    header = f"{'useful tok/s':>13}{'samples/s':>11}{'waste':>8}{'occupancy':>11}{'tokens':>8}{'CPU s':>8}"
    print(f"\n{'mode':<22}{header}  note")
    keys = ("tok_s", "samples_s", "waste", "occupancy", "tokens", "cpu_s")
    table = {m: {k: median_of(results[m], k) for k in keys} for m in modes}
    notes = {}
    for mode in modes:
        if mode.startswith("provider"):
            gap = median_of(results[mode], "gap_ms")
            size = median_of(results[mode], "mean_dispatch")
            if size is not None and size == size:  # static dispatches happened (not NaN)
                busy = median_of(results[mode], "busy_ms")
                notes[mode] = (
                    f"mean dispatch {size:.2f} rows, generate {fmt(busy, '.0f')} ms/dispatch, idle {fmt(gap, '.0f')} "
                    "ms between dispatches"
                )
            else:
                notes[mode] = "refill loop"
    if "raw-static" in modes:
        notes["raw-static"] = f"generate {fmt(median_of(results['raw-static'], 'busy_ms'), '.0f')} ms/batch"
    if "hf" in modes:
        notes["hf"] = f"{len(hf_prompts)} samples per round"
    rows = [(f"{'hf/' if m == 'hf' else m}@{args.batch}", table[m], notes.get(m, "")) for m in modes]
    for name, r, note in rows:
        print(
            f"{name:<22}{fmt(r['tok_s'], '.1f'):>13}{fmt(r['samples_s'], '.2f'):>11}{fmt(r['waste'], '.2f'):>8}"
            f"{fmt(r['occupancy'], '.2f'):>11}{fmt(r['tokens'], '.0f'):>8}{fmt(r['cpu_s'], '.1f'):>8}  {note}"
        )

    pairs = [(m, "raw-static") for m in modes if m != "raw-static" and "raw-static" in table]
    cpu_pairs = [(m, b) for m, b in pairs if table[m]["cpu_s"] and table[b]["cpu_s"]]
    pairs += [
        (a, b)
        for a, b in (("provider-refill", "provider-static"), ("provider-static", "hf"), ("provider-refill", "hf"))
        if {a, b} <= set(table)
    ]
    if pairs:
        print(f"\n{'useful tok/s ratio':<34}{'of medians':>11}{'per-round median':>18}  rounds")
    for a, b in pairs:
        per_round = [x["tok_s"] / y["tok_s"] for x, y in zip(results[a], results[b], strict=True)]
        target = "   target >= 1.5" if (a, b) == ("raw-refill", "raw-static") else ""
        print(
            f"{a + '/' + b:<34}{table[a]['tok_s'] / table[b]['tok_s']:>11.2f}{statistics.median(per_round):>18.2f}  "
            f"{' '.join(f'{r:.2f}' for r in per_round)}{target}"
        )
    if cpu_pairs:
        print("\nCPU seconds per run, b / a (the work a needs relative to b, whatever the machine's load):")
    for a, b in cpu_pairs:
        per_round = [y["cpu_s"] / x["cpu_s"] for x, y in zip(results[a], results[b], strict=True)]
        print(f"{a + '/' + b:<34}{statistics.median(per_round):>11.2f}  {' '.join(f'{r:.2f}' for r in per_round)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
