"""Steering overhead on a real-size random Llama through `SteeringPipeline`: tokens/s of each arm vs unsteered.

Arms (same weights; PASTA arms share a deep copy, since PASTA switches its model's attention implementation):
  unsteered   plain pipeline, attn_implementation=sdpa
  pasta_1     PASTA on the middle layer (all heads), alpha=0.01, scale_position=exclude, one substring per row
  pasta_all   PASTA on every layer, same settings
  caa         CAA with a given random vector at the middle layer, multiplier 4

Each batch size: one warm-up call per arm (--warmup-tokens new tokens), then --repeats rounds in which every arm
runs once (rotating order); the median counts. Generation is greedy with min_new_tokens = max_new_tokens, so EOS
never ends a row early; the generated token count is checked and reported. Prompts are plain text of exactly
--prompt-tokens tokens (BOS included) when the tokenizer allows, so no row is padded.

Also reports the attention path: which function `config._attn_implementation` resolves to, how transformers' sdpa
function is called (mask, position_bias) and which aten SDPA op / CUDA attention kernels run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from kit import SHAPES, build_shaped_model, describe, dtype_of, dump_modules_at_exit, log, sync  # noqa: E402

dump_modules_at_exit()

PHRASE = "the capital of france"
FALLBACK_WORDS = "the cat and dog run to the city where the river meets the sea and the sun is red".split()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--warmup-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", default="unsteered,pasta_1,pasta_all,caa")
    p.add_argument("--budget-s", type=float, default=0, help="skip remaining batch sizes past this (0: none)")
    p.add_argument("--out", default=None, help="JSON results (rewritten after each batch size)")
    return p.parse_args(argv)


# ---------------------------------------------------------------------- prompts
def corpus_words() -> list[str]:
    try:
        from steer_hydra.models.tiny import _CORPUS_WORDS

        return list(_CORPUS_WORDS)
    except Exception:  # pragma: no cover - private name moved
        return FALLBACK_WORDS


def make_prompt(tokenizer, index: int, n_tokens: int) -> str:
    """Plain text of exactly `n_tokens` tokens (BOS included) when reachable, containing PHRASE."""
    words = corpus_words()

    def length(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    start = (13 * index) % len(words)
    text = " ".join(words[(start + k) % len(words)] for k in range(6)) + " " + PHRASE
    k = 6
    while length(text) < n_tokens:
        candidate = f"{text} {words[(start + k) % len(words)]}"
        k += 1
        if length(candidate) <= n_tokens:
            text = candidate
            continue
        filler = f"{text} a"  # one token in the tiny vocabulary
        if length(filler) <= n_tokens:
            text = filler
            continue
        break
    return text


# ---------------------------------------------------------------------- arms
def build_arms(model, tokenizer, device: str, names: list[str]):
    from steer_hydra.controls.state import CAA, PASTA
    from steer_hydra.core import ModelSource, SteeringPipeline
    from steer_hydra.core.layout import resolve_layout

    layout = resolve_layout(model)
    middle = layout.num_layers // 2
    pasta_model = copy.deepcopy(model) if any(n.startswith("pasta") for n in names) else None
    generator = torch.Generator().manual_seed(0)
    vector = torch.randn(layout.hidden_size, generator=generator)
    specs = {
        "unsteered": (model, []),
        "caa": (model, [CAA(steering_vector=vector, layer_id=middle, multiplier=4.0)]),
        "pasta_1": (pasta_model, [PASTA(head_config=[middle], alpha=0.01, scale_position="exclude")]),
        "pasta_all": (
            pasta_model,
            [PASTA(head_config=list(range(layout.num_layers)), alpha=0.01, scale_position="exclude")],
        ),
    }
    pipes = {}
    for name in names:
        target, controls = specs[name]
        pipes[name] = SteeringPipeline(ModelSource(device=device), controls, model=target, tokenizer=tokenizer).steer()
    return pipes, layout


LAST_IDS: dict[int, list] = {}  # id(pipe) -> the last call's continuation rows (to see whether steering changed them)


def run_call(pipe, prompts: list[str], new_tokens: int, device: str) -> tuple[float, int, int]:
    """Seconds of one synchronized generate call, generated tokens, and the padded prompt width."""
    runtime = (
        {"substrings": [[PHRASE] for _ in prompts]} if any(type(c).__name__ == "PASTA" for c in pipe.controls) else None
    )
    sync(device)
    start = time.perf_counter()
    outputs = pipe.generate(
        text=prompts,
        runtime_kwargs=runtime,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        return_output=True,
    )
    sync(device)
    elapsed = time.perf_counter() - start
    generated = sum(int(o.output_ids.shape[-1]) for o in outputs)
    LAST_IDS[id(pipe)] = [o.output_ids[0].tolist() for o in outputs]
    first = outputs[0].adapted_input_ids
    width = int(first.shape[-1]) if first is not None else -1
    return elapsed, generated, width


# ---------------------------------------------------------------------- attention path
def attention_report(pipes, prompts: list[str], device: str) -> dict:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    report = {}
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping
    for name, pipe in pipes.items():
        impl = pipe.model.config._attn_implementation
        try:
            fn = ALL_ATTENTION_FUNCTIONS[impl]
            fn_name = f"{fn.__module__}.{getattr(fn, '__name__', fn)}"
        except KeyError:
            fn_name = "eager (model's own)"
        calls: Counter = Counter()

        def counting(module, query, key, value, attention_mask, *args, calls=calls, **kwargs):
            bias = kwargs.get("position_bias")
            mask = "None" if attention_mask is None else f"{attention_mask.dtype}".replace("torch.", "")
            phase = "prefill" if query.shape[2] > 1 else "decode"
            calls[f"{phase} mask={mask} position_bias={'yes' if bias is not None else 'no'}"] += 1
            return original(module, query, key, value, attention_mask, *args, **kwargs)

        ALL_ATTENTION_FUNCTIONS["sdpa"] = counting
        try:
            run_call(pipe, prompts, 2, device)
        finally:
            if had_local:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = original
            else:
                del ALL_ATTENTION_FUNCTIONS["sdpa"]
        ops = profile_ops(pipe, prompts, device)
        report[name] = {"attn_implementation": impl, "function": fn_name, "sdpa_calls": dict(calls), "ops": ops}
        log(f"  {name:<10} attn_implementation={impl} -> {fn_name}")
        for k, v in sorted(calls.items()):
            log(f"  {'':<10}   sdpa call [{k}] x{v}")
        for k, v in ops.items():
            log(f"  {'':<10}   op {k}: {v}")
    return report


def profile_ops(pipe, prompts, device) -> dict:
    """aten SDPA ops (which backend) and, on CUDA, attention kernels, during a 3-token generate."""
    from torch.profiler import ProfilerActivity, profile

    keys = ("scaled_dot_product", "flash", "fmha", "efficient", "cudnn", "attention", "softmax")
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    try:
        with profile(activities=activities) as prof:
            run_call(pipe, prompts, 3, device)
        found = {}
        for event in prof.key_averages():
            lowered = event.key.lower()
            if any(k in lowered for k in keys):
                found[event.key[:110]] = int(event.count)
        return dict(sorted(found.items(), key=lambda kv: -kv[1])[:12])
    except Exception as exc:  # profiler unavailable (e.g. no CUPTI): keep going
        return {"profiler_error": repr(exc)[:200]}


# ---------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    device, dtype = args.device, dtype_of(args.dtype)
    arms = [a for a in args.arms.split(",") if a]
    batches = [int(b) for b in args.batches.split(",") if b]
    started = time.perf_counter()
    results: dict = {
        "shape": args.shape,
        "device": device,
        "dtype": args.dtype,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        "batches": {},
    }

    def dump():
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))

    log(f"building {args.shape} on {device} in {args.dtype}")
    t = time.perf_counter()
    model, tokenizer = build_shaped_model(args.shape, device, dtype, max_positions=args.prompt_tokens + 512)
    sync(device)
    results["build_s"] = round(time.perf_counter() - t, 2)
    results["model"] = describe(model)
    log(f"built in {results['build_s']}s: {results['model']}")
    t = time.perf_counter()
    pipes, layout = build_arms(model, tokenizer, device, arms)
    sync(device)
    log(f"arms steered in {time.perf_counter() - t:.1f}s: {', '.join(pipes)} (middle layer {layout.num_layers // 2})")
    if device.startswith("cuda"):
        log(f"GPU memory allocated {torch.cuda.memory_allocated() / 2**30:.1f} GiB")

    t = time.perf_counter()
    all_prompts = [make_prompt(tokenizer, i, args.prompt_tokens) for i in range(max(batches))]
    lengths = [len(tokenizer(p)["input_ids"]) for p in all_prompts]
    results["prompt_lengths"] = {"min": min(lengths), "max": max(lengths)}
    log(f"{len(all_prompts)} prompts in {time.perf_counter() - t:.1f}s: tokens min {min(lengths)} max {max(lengths)}")

    log("attention path (batch 2, 2-3 new tokens):")
    try:
        results["attention"] = attention_report(pipes, all_prompts[:2], device)
    except Exception as exc:
        log(f"attention report failed: {exc!r}")
        results["attention"] = {"error": repr(exc)}
    dump()

    round_s = None  # seconds of one round (every arm once) at the previous batch size
    for batch in batches:
        repeats = args.repeats
        if args.budget_s:
            left = args.budget_s - (time.perf_counter() - started)
            guess = None if round_s is None else 1.5 * round_s  # a larger batch is slower
            if left <= 0 or (guess is not None and left < 1.3 * guess):
                log(f"budget {args.budget_s}s: {left:.0f}s left, a round would take ~{guess}s: skipping batch {batch}")
                results["batches"][str(batch)] = {"skipped": "budget"}
                continue
            if guess is not None and left < (repeats + 0.3) * guess:
                repeats = max(1, int(left / guess - 0.3))
                log(f"budget: {left:.0f}s left, ~{guess:.0f}s per round: {repeats} round(s) at batch {batch}")
        prompts = all_prompts[:batch]
        entry: dict = {"repeats": repeats}
        try:
            for pipe in pipes.values():  # warm-up
                run_call(pipe, prompts, args.warmup_tokens, device)
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            times: dict[str, list[float]] = {name: [] for name in pipes}
            generated: dict[str, int] = {}
            width = -1
            order = list(pipes)
            t_rounds = time.perf_counter()
            for repeat in range(repeats):
                for name in order[repeat % len(order) :] + order[: repeat % len(order)]:
                    seconds, tokens, width = run_call(pipes[name], prompts, args.new_tokens, device)
                    times[name].append(seconds)
                    generated[name] = tokens
                log(f"  batch {batch} round {repeat + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f}s" for n in order))
            round_s = (time.perf_counter() - t_rounds) / repeats
            base = statistics.median(times["unsteered"]) if "unsteered" in times else None
            for name in pipes:
                median = statistics.median(times[name])
                entry[name] = {
                    "median_s": round(median, 4),
                    "times_s": [round(x, 4) for x in times[name]],
                    "generated_tokens": generated[name],
                    "tokens_per_s": round(generated[name] / median, 1),
                    "ms_per_step": round(1000 * median / args.new_tokens, 2),
                    "ratio_time_vs_unsteered": round(median / base, 3) if base else None,
                    "ratio_tps_vs_unsteered": round(base / median, 3) if base else None,
                }
            entry["prompt_width"] = width
            if "unsteered" in pipes:  # fraction of rows whose greedy continuation the arm changed
                base_rows = LAST_IDS.get(id(pipes["unsteered"]), [])
                for name in pipes:
                    rows = LAST_IDS.get(id(pipes[name]), [])
                    changed = sum(a != b for a, b in zip(rows, base_rows, strict=False))
                    entry[name]["rows_changed_vs_unsteered"] = f"{changed}/{len(rows)}"
            if device.startswith("cuda"):
                entry["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        except Exception as exc:
            log(f"batch {batch} failed: {exc!r}")
            entry["error"] = repr(exc)[:500]
        results["batches"][str(batch)] = entry
        dump()
        log(f"batch {batch} done (prompt width {entry.get('prompt_width')}, peak {entry.get('peak_mem_gib')} GiB)")
        for name in pipes:
            row = entry.get(name)
            if row:
                log(
                    f"  {name:<10} {row['median_s']:8.3f} s  {row['tokens_per_s']:9.1f} tok/s  "
                    f"{row['ms_per_step']:7.2f} ms/step  x{row['ratio_time_vs_unsteered']} time  "
                    f"gen={row['generated_tokens']}  changed={row.get('rows_changed_vs_unsteered')}  "
                    f"runs={row['times_s']}"
                )

    print("\nSTEERING OVERHEAD  (" + results["model"] + ")")
    print(
        f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens (greedy, min=max), median of {args.repeats}"
    )
    print(
        f"{'batch':>5} {'arm':<10} {'median s':>9} {'tok/s':>9} {'ms/step':>8} {'time ratio':>10} {'tok/s ratio':>11}"
        f" {'rows changed':>12}"
    )
    for batch, entry in results["batches"].items():
        for name in pipes:
            row = entry.get(name)
            if row:
                print(
                    f"{batch:>5} {name:<10} {row['median_s']:>9.3f} {row['tokens_per_s']:>9.1f} "
                    f"{row['ms_per_step']:>8.2f} {row['ratio_time_vs_unsteered']:>10.3f} "
                    f"{row['ratio_tps_vs_unsteered']:>11.3f} {row.get('rows_changed_vs_unsteered', '?'):>12}"
                )
    for pipe in reversed(list(pipes.values())):
        pipe.release()
    results["total_s"] = round(time.perf_counter() - started, 1)
    dump()
    log(f"overhead done in {results['total_s']}s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.exit(main())
