"""Run a throughput benchmark of `benchmarks/` on a real-size random Llama on a chosen device and dtype.

Both benchmarks (`provider_throughput`: provider vs raw vs Inspect `hf/` at a fixed output length;
`realistic_throughput`: static vs refill on long-tailed lengths) take --checkpoint/--device/--dtype themselves;
this driver saves a `--shape` Llama (built on --device in --dtype) once to --cache and passes its path.
Everything after `--` goes to the benchmark.

    python benchmarks/gpu/on_device.py --shape llama-3.2-1b --benchmark provider_throughput -- --batch 32
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(BENCHMARKS))

import torch  # noqa: E402
from kit import SHAPES, build_shaped_model, describe, dtype_of, dump_modules_at_exit, log, sync  # noqa: E402

dump_modules_at_exit()


def save_checkpoint(shape: str, device: str, dtype: torch.dtype, cache: Path) -> Path:
    """Build the shaped model once and save it (with the tiny tokenizer) to `cache`; reuse it afterwards."""
    if (cache / "config.json").exists():
        log(f"reusing checkpoint {cache}")
        return cache
    t = time.perf_counter()
    model, tokenizer = build_shaped_model(shape, device, dtype)
    sync(device)
    log(f"built {describe(model)} in {time.perf_counter() - t:.1f}s")
    staging = cache.with_name(cache.name + f".tmp{os.getpid()}")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, cache)
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    log(f"saved to {cache} in {time.perf_counter() - t:.1f}s total")
    return cache


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cache", default="/tmp/steer-gpu-checkpoint", help="checkpoint folder prefix")
    parser.add_argument(
        "--benchmark", default="provider_throughput", choices=("provider_throughput", "realistic_throughput")
    )
    args, rest = parser.parse_known_args()
    rest = [a for a in rest if a != "--"]
    device, dtype = args.device, dtype_of(args.dtype)
    cache = Path(f"{args.cache}-{args.shape}-{args.dtype}")
    log(f"importing benchmarks/{args.benchmark}.py (Inspect, steer_hydra)")
    bench = load_benchmark(args.benchmark)
    if device.startswith("cuda"):
        log(f"GPU: {torch.cuda.get_device_name(0)}")
    t = time.perf_counter()
    checkpoint = save_checkpoint(args.shape, device, dtype, cache)
    threads = "0" if device.startswith("cuda") else "1"  # several CPU threads spin-wait on a shared CPU
    argv = ["--checkpoint", str(checkpoint), "--device", device, "--dtype", args.dtype, "--threads", threads, *rest]
    log(f"benchmark args: {' '.join(argv)} (shape {args.shape})")
    rc = bench.main(argv)
    if device.startswith("cuda"):
        log(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    log(f"{args.benchmark} done in {time.perf_counter() - t:.1f}s (rc={rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
