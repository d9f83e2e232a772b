"""Generate time of each state control (and of contrastive decoding) relative to the unsteered pipeline, measured
side by side in one run.

    .venv/bin/python benchmarks/control_overhead.py   # widened tiny model (8 layers, hidden 256), batch 8, 32 tokens
    .venv/bin/python benchmarks/control_overhead.py --model steer_hydra:tiny --repeats 9
    .venv/bin/python benchmarks/control_overhead.py --model <hf id or path> --device cuda --dtype bfloat16

Every arm runs on its own copy of the same weights (PASTA switches its model's attention implementation),
with the same chat prompts, greedy decoding and exactly `--new-tokens` new tokens (min = max). After a warm-up
round, each repeat runs every arm once, in a shuffled order (the machine may be shared); the table shows the
median and the fastest seconds per generate call, each with its ratio to the unsteered arm (on a busy
machine the fastest run is the steadier figure). ActAdd does not batch, so its row is what the provider pays
for the same prompts (`--batch` calls of batch 1), with its batch-1 ratio alongside.

DirectionalAblation projects a given random unit direction out at every layer (its three hooks per layer are the
cost; a fitted direction costs the same per call). ContrastiveDecoding runs its amateur beside the model at every
step: `--amateur` (default: the stock tiny model, seed 1, when `--model` is a tiny one; it must share the model's
vocabulary) names it, and without one for another model its row is left out.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from steer_hydra.controls.output import ContrastiveDecoding
from steer_hydra.controls.state import CAA, PASTA, ActAdd, DirectionalAblation
from steer_hydra.core import ModelSource, SteeringPipeline
from steer_hydra.core.layout import ModelLayout, resolve_layout

DEFAULT_MODEL = "steer_hydra:tiny?hidden_size=256&num_hidden_layers=8&num_attention_heads=8&intermediate_size=688"
QUESTIONS = [
    "what is the capital of france? answer in one word",
    "count from one to five",
    "tell me a short story about a cat and a dog",
    "is the sky blue? reply yes or no",
    "name three rivers in europe",
    "write one sentence about the sea",
    "what is two plus three",
    "describe the moon in a short sentence",
]
TINY_AMATEUR = "steer_hydra:tiny?seed=1"  # 2 layers, hidden 64: the tiny tokenizer, a quarter of the default's width
HIGHLIGHT = ["one word", "five", "cat", "yes or no", "rivers", "sea", "two plus three", "moon"]


def _arms(layout: ModelLayout, amateur: str | None) -> dict[str, Callable[[], list]]:
    layers, hidden, middle = layout.num_layers, layout.hidden_size, layout.num_layers // 2
    arms = {
        "unsteered": lambda: [],
        "PASTA (1 layer, all heads)": lambda: [PASTA(head_config=[middle], alpha=0.01, scale_position="exclude")],
        "PASTA (every layer)": lambda: [PASTA(head_config=list(range(layers)), alpha=0.01, scale_position="exclude")],
        "CAA": lambda: [CAA(steering_vector=torch.randn(hidden), layer_id=middle, multiplier=4.0)],
        "ActAdd": lambda: [ActAdd(positive_prompt="Love", negative_prompt="Hate", multiplier=4.0)],
        "DirectionalAblation (all)": lambda: [DirectionalAblation(direction_vector=torch.randn(hidden))],
    }
    if amateur:
        arms["ContrastiveDecoding"] = lambda: [ContrastiveDecoding(amateur=amateur)]
    return arms


def _pipeline(args: argparse.Namespace, controls: list) -> SteeringPipeline:
    kwargs = {"attn_implementation": args.attn}
    if args.dtype != "float32":
        kwargs["dtype"] = getattr(torch, args.dtype)
    pipeline = SteeringPipeline(ModelSource(args.model, device=args.device, hf_model_kwargs=kwargs), controls=controls)
    return pipeline.steer()


def _timed(pipeline: SteeringPipeline, chats: list, args: argparse.Namespace, substrings: list) -> float:
    runtime = {"substrings": substrings} if any(isinstance(c, PASTA) for c in pipeline.controls) else None
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    pipeline.generate(
        messages=chats,
        runtime_kwargs=runtime,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        return_output=True,
    )
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--amateur", default=None, help="ContrastiveDecoding's amateur (default: a tiny one for a tiny --model)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave the default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    amateur = args.amateur
    if amateur is None and args.model.startswith("steer_hydra:tiny"):
        amateur = TINY_AMATEUR
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(args.batch)]
    substrings = [[HIGHLIGHT[i % len(HIGHLIGHT)]] for i in range(args.batch)]
    probe = _pipeline(args, [])
    layout = resolve_layout(probe.model)
    probe.release()
    torch.manual_seed(0)
    pipelines = {name: _pipeline(args, build()) for name, build in _arms(layout, amateur).items()}
    one_chat, one_substrings = chats[:1], substrings[:1]

    times: dict[str, list[float]] = {name: [] for name in pipelines}
    single: dict[str, list[float]] = {"unsteered": [], "ActAdd": []}
    for pipeline in pipelines.values():  # warm-up round
        _timed(pipeline, chats if pipeline.supports_batching else one_chat, args, substrings)
    order = list(pipelines)
    for repeat in range(args.repeats):
        random.Random(repeat).shuffle(order)  # no arm always runs first (or right after another) on a busy machine
        for name in order:
            pipeline = pipelines[name]
            if pipeline.supports_batching:
                times[name].append(_timed(pipeline, chats, args, substrings))
            else:  # ActAdd: what the model provider does, one request at a time
                times[name].append(args.batch * _timed(pipeline, one_chat, args, one_substrings))
            if name in single:
                single[name].append(_timed(pipeline, one_chat, args, one_substrings))

    base, base_min = statistics.median(times["unsteered"]), min(times["unsteered"])
    print(
        f"model={args.model} device={args.device} dtype={args.dtype} attn={args.attn} "
        f"layers={layout.num_layers} heads={layout.num_heads} hidden={layout.hidden_size} "
        f"batch={args.batch} new_tokens={args.new_tokens} repeats={args.repeats} threads={torch.get_num_threads()} "
        f"amateur={amateur}"
    )
    print(f"{'arm':<30}{'median s/call':>15}{'ratio':>9}{'min s/call':>13}{'ratio':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        note = ""
        if name == "ActAdd":
            ratio = statistics.median(single["ActAdd"]) / statistics.median(single["unsteered"])
            note = f"   (serialized: {args.batch} calls of batch 1; per-call ratio at batch 1: {ratio:.2f}x)"
        fastest = min(values)
        print(f"{name:<30}{median:>15.4f}{median / base:>8.2f}x{fastest:>13.4f}{fastest / base_min:>8.2f}x{note}")
    for pipeline in pipelines.values():
        pipeline.release()


if __name__ == "__main__":
    main()
