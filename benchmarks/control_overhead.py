"""Generate time of each state, structural and batched output control relative to the unsteered pipeline, measured
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
cost; a fitted direction costs the same per call). ITI shifts two heads of every layer (a pre-hook on each output
projection); CAST reads its condition on the prefill and adds CAA's vector to every row (threshold 0: the gate is
always open, so the row pays both); AngularSteering rotates the middle layer's output; ActivationAdapter runs CAA's
form (the generic edit hooks against CAA's own row). LoRAAdapter serves a random rank-8 adapter on every attention
and MLP projection, built here for `--model` (merged into the weights, and as live LoRA layers).
ConstrainedDecoding holds every row to a regex of lowercase words (a grammar mask per row and step).
ContrastiveDecoding runs its amateur beside the model at every step, RewardGuidedDecoding its reward model on the
top 20 candidates of every row: `--amateur` and `--reward` (default: the stock tiny model, seed 1, and the tiny
reward model when `--model` is a tiny one; both must share the model's vocabulary) name them, and without one for
another model their rows are left out. ThinkingBudget (a decoding driver) opens a thinking channel, caps it at half
of `--new-tokens`, closes it and answers; a driver takes no `min_new_tokens`, so its rows run without one: the
`tok/row` column gives the new tokens each arm generated per row (a random tiny model almost never ends early).

UserPrefix puts a sentence before each question (a longer prompt). PhasedDecoding forces "Answer:" then generates the
rest (one rollout); RoutedDecoding sends the counting and arithmetic questions to that plan and the rest to plain
decoding (two rollouts of half the rows). SearchDecoding (one prompt at a time, like ActAdd) samples 4 proposals per
prompt in one round and keeps the longest. ValueGuidance scores the top 20 candidates with the reward model's raw
logit, min-max normalized; SASA fits its subspace from three sentiment pairs and runs each row's top 20 candidates
as one more position on the model itself; DExperts runs two second models (the amateur and another tiny model) beside
the model (proxy-tuning is the same computation at another weight).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from steer_hydra.controls.input import UserPrefix
from steer_hydra.controls.output import (
    SASA,
    ConstrainedDecoding,
    ContrastiveDecoding,
    DExperts,
    KeywordRouter,
    PhasedDecoding,
    RewardGuidedDecoding,
    RoutedDecoding,
    SearchDecoding,
    ThinkingBudget,
    ValueGuidance,
)
from steer_hydra.controls.state import (
    CAA,
    CAST,
    ITI,
    PASTA,
    ActAdd,
    ActivationAdapter,
    AngularSteering,
    DirectionalAblation,
)
from steer_hydra.controls.structural import LoRAAdapter
from steer_hydra.core import DecodingDriver, ModelSource, SteeringPipeline
from steer_hydra.core.layout import ModelLayout, resolve_layout
from steer_hydra.core.tensors import strip_trailing
from steer_hydra.models import resolve_model_reference

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
TINY_REWARD = "steer_hydra:tiny-reward"  # a sequence classifier on the tiny tokenizer: RAD's prefix-cache path
TINY_ANTI_EXPERT = "steer_hydra:tiny?seed=2"  # DExperts' second tiny model beside the amateur
SENTIMENT = [  # SASA's labeled pairs (the negative response unwanted)
    {
        "prompt": "How do you feel today?",
        "positive": "I feel wonderful and happy.",
        "negative": "I feel awful and sad.",
    },
    {"prompt": "Describe the weather.", "positive": "It is a bright, lovely day.", "negative": "It is a gloomy day."},
    {"prompt": "What do you think of people?", "positive": "People are kind and good.", "negative": "People are bad."},
]
WORDS = "[a-z]+( [a-z]+)*"  # ConstrainedDecoding's regex: lowercase words, as long as the call runs
HIGHLIGHT = ["one word", "five", "cat", "yes or no", "rivers", "sea", "two plus three", "moon"]


def _random_adapter(model: str, folder: str) -> str:
    """A random rank-8 LoRA adapter on every attention and MLP projection of `model` (nothing trained)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model_reference(model))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    get_peft_model(base, LoraConfig(r=8, target_modules=targets, init_lora_weights=False)).save_pretrained(folder)
    return folder


def _arms(
    layout: ModelLayout,
    amateur: str | None,
    reward: str | None,
    adapter: str,
    new_tokens: int,
    anti_expert: str | None = None,
) -> dict[str, Callable[[], list]]:
    layers, hidden, middle = layout.num_layers, layout.hidden_size, layout.num_layers // 2
    arms = {
        "unsteered": lambda: [],
        "PASTA (1 layer, all heads)": lambda: [PASTA(head_config=[middle], alpha=0.01, scale_position="exclude")],
        "PASTA (every layer)": lambda: [PASTA(head_config=list(range(layers)), alpha=0.01, scale_position="exclude")],
        "CAA": lambda: [CAA(steering_vector=torch.randn(hidden), layer_id=middle, multiplier=4.0)],
        "ActAdd": lambda: [ActAdd(positive_prompt="Love", negative_prompt="Hate", multiplier=4.0)],
        "DirectionalAblation (all)": lambda: [DirectionalAblation(direction_vector=torch.randn(hidden))],
        "ITI (2 heads per layer)": lambda: [
            ITI(
                directions=torch.randn(layers, layout.num_heads, layout.head_dim),
                heads=[[layer, head] for layer in range(layers) for head in range(min(2, layout.num_heads))],
                alpha=4.0,
                strength_unit="absolute",
            )
        ],
        "CAST (gate open, CAA)": lambda: [
            CAST(
                steering_vector=torch.randn(hidden),
                layer_id=middle,
                multiplier=4.0,
                condition_vector=torch.randn(hidden),
                threshold=0.0,
            )
        ],
        "AngularSteering (1 layer)": lambda: [
            AngularSteering(steering_vector=torch.randn(hidden), angle=60.0, layers=[middle])
        ],
        "ActivationAdapter (CAA form)": lambda: [
            ActivationAdapter(vector=torch.randn(hidden), layers=[middle], multiplier=4.0)
        ],
        "LoRAAdapter (merged)": lambda: [LoRAAdapter(adapter=adapter)],
        "LoRAAdapter (unmerged)": lambda: [LoRAAdapter(adapter=adapter, merge=False)],
        "ConstrainedDecoding (regex)": lambda: [ConstrainedDecoding(regex=WORDS)],
        "ThinkingBudget (driver)": lambda: [ThinkingBudget(max_thinking_tokens=new_tokens // 2)],
        "UserPrefix": lambda: [UserPrefix(text="Answer in one short sentence.")],
        "PhasedDecoding (prefix, rest)": lambda: [PhasedDecoding(phases=[{"force": "Answer:"}, {"generate": None}])],
        "RoutedDecoding (2 routes)": lambda: [
            RoutedDecoding(
                routes={"plain": [], "phased": [PhasedDecoding(phases=[{"force": "Answer:"}, {"generate": None}])]},
                router=KeywordRouter({"phased": ["count", "plus", "three"]}),
                default_route="plain",
            )
        ],
        "SearchDecoding (4 proposals)": lambda: [
            SearchDecoding(scorer=lambda response, row: float(len(response)), proposals=4)
        ],
        "SASA (top 20, fitted)": lambda: [SASA(data=SENTIMENT, beta=1.0, top_k=20)],
    }
    if amateur:
        arms["ContrastiveDecoding"] = lambda: [ContrastiveDecoding(amateur=amateur)]
        arms["DExperts (2 second models)"] = lambda: [DExperts(expert=amateur, anti_expert=anti_expert)]
    if reward:
        arms["RewardGuidedDecoding"] = lambda: [RewardGuidedDecoding(reward_model=reward)]
        arms["ValueGuidance (logit, minmax)"] = lambda: [
            ValueGuidance(value_model=reward, beta=2.0, value="logit", normalize="minmax")
        ]
    return arms


def _pipeline(args: argparse.Namespace, controls: list) -> SteeringPipeline:
    kwargs = {"attn_implementation": args.attn}
    if args.dtype != "float32":
        kwargs["dtype"] = getattr(torch, args.dtype)
    pipeline = SteeringPipeline(ModelSource(args.model, device=args.device, hf_model_kwargs=kwargs), controls=controls)
    return pipeline.steer()


def _timed(
    pipeline: SteeringPipeline, chats: list, args: argparse.Namespace, substrings: list, tokens: list | None = None
) -> float:
    """Seconds of one generate call (exactly `--new-tokens` per row, except under a driver); appends the mean new
    tokens per row to `tokens`."""
    runtime = {"substrings": substrings} if any(isinstance(c, PASTA) for c in pipeline.controls) else None
    driven = any(isinstance(c, DecodingDriver) for c in pipeline.controls)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = pipeline.generate(
        messages=chats,
        runtime_kwargs=runtime,
        max_new_tokens=args.new_tokens,
        **({} if driven else {"min_new_tokens": args.new_tokens}),
        return_output=True,
    )
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if tokens is not None:
        pad = pipeline.tokenizer.pad_token_id
        rows = [strip_trailing(row, pad)[0] for o in outputs for row in o.output_ids.tolist()]
        tokens.append(sum(len(r) for r in rows) / len(rows))
    return seconds


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
    parser.add_argument(
        "--reward", default=None, help="RewardGuidedDecoding's reward model (default: the tiny one for a tiny --model)"
    )
    parser.add_argument(
        "--anti-expert", default=None, help="DExperts' anti-expert (default: a tiny one for a tiny --model)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave the default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    amateur, reward, anti_expert = args.amateur, args.reward, args.anti_expert
    if args.model.startswith("steer_hydra:tiny"):
        amateur, reward = amateur or TINY_AMATEUR, reward or TINY_REWARD
        anti_expert = anti_expert or TINY_ANTI_EXPERT
    anti_expert = anti_expert or amateur
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(args.batch)]
    substrings = [[HIGHLIGHT[i % len(HIGHLIGHT)]] for i in range(args.batch)]
    probe = _pipeline(args, [])
    layout = resolve_layout(probe.model)
    probe.release()
    torch.manual_seed(0)
    adapter = _random_adapter(args.model, tempfile.mkdtemp(prefix="steer_hydra_lora_"))
    arms = _arms(layout, amateur, reward, adapter, args.new_tokens, anti_expert)
    pipelines = {name: _pipeline(args, build()) for name, build in arms.items()}
    one_chat, one_substrings = chats[:1], substrings[:1]

    times: dict[str, list[float]] = {name: [] for name in pipelines}
    tokens: dict[str, list[float]] = {name: [] for name in pipelines}
    # arms that do not batch (ActAdd, SearchDecoding) are also timed at batch 1 beside the unsteered arm
    single: dict[str, list[float]] = {"unsteered": []}
    single |= {name: [] for name, pipeline in pipelines.items() if not pipeline.supports_batching}
    for pipeline in pipelines.values():  # warm-up round
        _timed(pipeline, chats if pipeline.supports_batching else one_chat, args, substrings)
    order = list(pipelines)
    for repeat in range(args.repeats):
        random.Random(repeat).shuffle(order)  # no arm always runs first (or right after another) on a busy machine
        for name in order:
            pipeline = pipelines[name]
            if pipeline.supports_batching:
                times[name].append(_timed(pipeline, chats, args, substrings, tokens[name]))
            else:  # ActAdd, SearchDecoding: what the model provider does, one request at a time
                times[name].append(args.batch * _timed(pipeline, one_chat, args, one_substrings, tokens[name]))
            if name in single:
                single[name].append(_timed(pipeline, one_chat, args, one_substrings))

    base, base_min = statistics.median(times["unsteered"]), min(times["unsteered"])
    print(
        f"model={args.model} device={args.device} dtype={args.dtype} attn={args.attn} "
        f"layers={layout.num_layers} heads={layout.num_heads} hidden={layout.hidden_size} "
        f"batch={args.batch} new_tokens={args.new_tokens} repeats={args.repeats} threads={torch.get_num_threads()} "
        f"amateur={amateur} reward={reward} anti_expert={anti_expert}"
    )
    print(f"{'arm':<30}{'median s/call':>15}{'ratio':>9}{'min s/call':>13}{'ratio':>9}{'tok/row':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        note = ""
        if name in single and name != "unsteered":
            ratio = statistics.median(single[name]) / statistics.median(single["unsteered"])
            note = f"   (serialized: {args.batch} calls of batch 1; per-call ratio at batch 1: {ratio:.2f}x)"
        fastest = min(values)
        made = statistics.mean(tokens[name])
        print(
            f"{name:<30}{median:>15.4f}{median / base:>8.2f}x{fastest:>13.4f}{fastest / base_min:>8.2f}x{made:>9.1f}"
            f"{note}"
        )
    for pipeline in pipelines.values():
        pipeline.release()
    shutil.rmtree(adapter, ignore_errors=True)


if __name__ == "__main__":
    main()
