"""What in-engine steering costs inside vLLM: unsteered vs CAA at one layer vs CAA at every layer, one engine.

Workload: SmolLM2-135M-Instruct in float32 (eager, `max_num_seqs=--batch`) answers `--prompts` chats (the
questions of `vllm_realistic.make_chats`) greedily, all submitted at once so vLLM's scheduler admits and retires
requests mid-decode. Every row decodes exactly `--max-tokens` tokens (`min_new_tokens` = `max_new_tokens`), so the
three configurations do the same work whatever the steering does to the text. The pipeline holds one CAA control
(a seeded random direction of norm `--caa` at 40% of the depth) plus one per decoder layer (seeded directions);
a configuration enables none of them (unsteered), the first (one layer) or the per-layer ones (every layer).

Rounds are interleaved (the configuration order rotates each round); each run measures wall seconds and CPU
seconds: this process (`time.process_time()`) plus its live children (psutil; the vLLM engine core is a spawned
child). Ratios are per round, steered / unsteered of the same round (paired, so load swings between rounds
cancel), and their median. The load average is printed before, per round and after: other work on the machine
skews wall, and CPU seconds count the engine's busy threads too (on a 2-core machine they came out near twice
the wall time whatever the configuration), so read them as a rough bound. "rows changed" counts the rows whose
greedy tokens differ from the unsteered run of the first round (steering did act).

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/vllm_steering_overhead.py                # 32 prompts, B=8, 3 rounds
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/vllm_steering_overhead.py --rounds 2 --prompts 16

Needs vLLM importable (`scripts/setup_vllm.sh`) and SmolLM2 installed (`steer_hydra.models.SMOLLM2_REF`).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from vllm_realistic import make_chats  # noqa: E402

from steer_hydra.controls.state import CAA  # noqa: E402
from steer_hydra.core import BackendSpec, SteeringPipeline  # noqa: E402
from steer_hydra.models import SMOLLM2_REF, resolve_model_reference  # noqa: E402

CONFIGS = ("unsteered", "caa-1-layer", "caa-all-layers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="vLLM max_num_seqs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--caa", type=float, default=4.0, help="norm of each CAA direction")
    return parser.parse_args(argv)


def caa(hidden: int, layer: int, norm: float, seed: int) -> CAA:
    direction = torch.randn(hidden, generator=torch.Generator().manual_seed(seed))
    return CAA(steering_vector=direction / direction.norm() * norm, layer_id=layer, multiplier=1.0)


def cpu_seconds() -> float:
    """CPU seconds of this process and its live children (the engine core); this process alone without psutil."""
    total = time.process_time()
    try:
        import psutil
    except ImportError:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += times.user + times.system
    return total


def run(pipeline: SteeringPipeline, chats: list, max_tokens: int) -> tuple[float, float, list[list[int]]]:
    """Wall seconds, CPU seconds and the generated rows of one greedy generate over every chat."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    outputs = pipeline.generate(
        messages=chats, return_output=True, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
    )
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    pad = pipeline.tokenizer.pad_token_id
    return wall, cpu, [[t for t in o.output_ids[0].tolist() if t != pad] for o in outputs]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoConfig

    path = resolve_model_reference(SMOLLM2_REF)
    config = AutoConfig.from_pretrained(path).get_text_config()
    layers, hidden = config.num_hidden_layers, config.hidden_size
    one = caa(hidden, int(0.4 * layers), args.caa, seed=0)
    every = [caa(hidden, layer, args.caa, seed=1 + layer) for layer in range(layers)]
    options = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0, "max_num_seqs": args.batch}
    started = time.perf_counter()
    pipeline = SteeringPipeline(path, controls=[one, *every], backend=BackendSpec("vllm", options)).steer()
    chats = [[{"role": "user", "content": p}] for p in make_chats(args.prompts)]
    enabled = {"unsteered": [], "caa-1-layer": [one], "caa-all-layers": every}
    print(
        f"command: {' '.join(sys.argv)}\nmodel {SMOLLM2_REF} float32, {layers} layers; prompts={len(chats)} "
        f"max_tokens={args.max_tokens} (every row) B={args.batch} rounds={args.rounds} caa_norm={args.caa} "
        f"one-layer CAA at layer {one.layer}; cpus={os.cpu_count()}; "
        f"engine start {time.perf_counter() - started:.0f}s; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )

    def configure(name: str) -> None:
        for control in pipeline.state_controls:
            control.enabled = any(control is c for c in enabled[name])

    results: dict[str, list[tuple[float, float, list[list[int]]]]] = {c: [] for c in CONFIGS}
    try:
        for name in CONFIGS:  # warm-up: every path once, on a few prompts
            configure(name)
            run(pipeline, chats[: args.batch], 8)
        for index in range(args.rounds):
            order = CONFIGS[index % len(CONFIGS) :] + CONFIGS[: index % len(CONFIGS)]
            for name in order:
                configure(name)
                results[name].append(run(pipeline, chats, args.max_tokens))
            line = ", ".join(f"{c} {results[c][-1][0]:.2f}s wall {results[c][-1][1]:.2f}s cpu" for c in CONFIGS)
            print(f"round {index + 1} (order {','.join(order)}; load {os.getloadavg()[0]:.2f}): {line}", flush=True)
    finally:
        pipeline.release()

    print(f"\n{'configuration':<16}{'tokens':>8}{'wall s':>9}{'cpu s':>9}{'tok/s':>8}  rows changed  (medians)")
    for name in CONFIGS:
        wall = statistics.median(r[0] for r in results[name])
        cpu = statistics.median(r[1] for r in results[name])
        tokens = statistics.median(sum(map(len, r[2])) for r in results[name])
        changed = sum(a != b for a, b in zip(results[name][0][2], results["unsteered"][0][2], strict=True))
        print(f"{name:<16}{tokens:>8.0f}{wall:>9.2f}{cpu:>9.2f}{tokens / wall:>8.1f}{changed:>5}/{len(chats)}")
    print(f"\n{'steered / unsteered':<30}{'median':>7}  per round")
    for name in CONFIGS[1:]:
        for column, label in ((0, "wall"), (1, "cpu")):
            ratios = [s[column] / u[column] for s, u in zip(results[name], results["unsteered"], strict=True)]
            per_round = " ".join(f"{r:.3f}" for r in ratios)
            print(f"{name + ' ' + label:<30}{statistics.median(ratios):>7.3f}  {per_round}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
