"""Greedy completions of the built-in tasks on SmolLM2-135M-Instruct: static batching vs slot refill, per sample.

The provider's default batching ("auto") refills a finished row's slot where the pipeline allows it. Under greedy
decoding that must change no completion: this runs each built-in task through `inspect_ai.eval` twice on one loaded
pipeline (`batching="static"`, then `"refill"`, the same batch ceiling and `max_connections`) and compares the
completions sample by sample. It prints, per task, the samples compared and how many are identical, and the first
differing sample (static and refill text) when one differs. Exit status 1 when any completion differs.

    .venv/bin/python benchmarks/batching_identity.py                       # every built-in task, 40 samples each
    .venv/bin/python benchmarks/batching_identity.py --limit 8 --tasks steer_hydra/mcqa
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from inspect_ai import eval as inspect_eval

from steer_hydra.core import SteeringPipeline
from steer_hydra.evaluation import ProviderOptions, as_inspect_model
from steer_hydra.models import SMOLLM2_REF

TASKS = (
    "steer_hydra/short_answer",
    "steer_hydra/arithmetic",
    "steer_hydra/mcqa",
    "steer_hydra/instruction_following",
    "steer_hydra/concept_steering",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task names")
    parser.add_argument("--limit", type=int, default=40, help="samples per task")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="the batch ceiling (max_batch_size)")
    parser.add_argument("--model", default=SMOLLM2_REF)
    return parser.parse_args(argv)


def completions(pipeline: SteeringPipeline, task: str, batching: str, args: argparse.Namespace) -> dict:
    """`{sample id: completion}` of one greedy eval of `task` with `batching`."""
    model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=args.batch, batching=batching))
    try:
        with tempfile.TemporaryDirectory() as log_dir:
            (log,) = inspect_eval(
                task,
                model=model,
                limit=args.limit,
                display="none",
                log_dir=log_dir,
                temperature=0,
                max_tokens=args.max_tokens,
                max_connections=model.api.max_connections(),
            )
            if log.status != "success":
                raise RuntimeError(f"{task} with batching={batching}: the eval ended {log.status}")
            assert model.api.batching == batching
            return {s.id: s.output.completion for s in log.samples}
    finally:
        model.api.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pipeline = SteeringPipeline(args.model).steer()
    print(f"model {args.model}, batch ceiling {args.batch}, max_tokens {args.max_tokens}, greedy")
    print(f"{'task':<36} {'samples':>7} {'identical':>9} {'static s':>8} {'refill s':>8}")
    differing = 0
    for task in args.tasks.split(","):
        runs, seconds = {}, {}
        for batching in ("static", "refill"):
            began = time.perf_counter()
            runs[batching] = completions(pipeline, task, batching, args)
            seconds[batching] = time.perf_counter() - began
        static, refill = runs["static"], runs["refill"]
        same = [i for i in static if refill.get(i) == static[i]]
        print(f"{task:<36} {len(static):>7} {len(same):>9} {seconds['static']:>8.1f} {seconds['refill']:>8.1f}")
        diff = [i for i in static if refill.get(i) != static[i]]
        if diff:
            differing += len(diff)
            first = diff[0]
            print(f"  first difference, sample {first!r}:")
            print(f"    static: {static[first]!r}\n    refill: {refill[first]!r}")
    pipeline.release()
    print("all greedy completions identical" if not differing else f"{differing} completion(s) differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
