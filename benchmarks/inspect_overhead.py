"""Where Inspect's time per sample goes when generation is free: the work the provider has to hide.

Runs `inspect_ai.eval` through `as_inspect_model` on a stub pipeline whose `generate` returns a fixed 64-token
continuation at once, so the whole wall time is Inspect's own per-sample work (task setup, solver and scorer,
transcript events, log recording) plus the provider's request handling. Under cProfile, the time is grouped by
where it is spent (self time per module group). Both logging modes are measured in the same run.

    .venv/bin/python benchmarks/inspect_overhead.py --samples 256 --batch 8
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("INSPECT_DISPLAY", "none")
os.environ.setdefault("INSPECT_LOG_LEVEL", "error")

import torch  # noqa: E402
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_runs import make_prompts, make_task  # noqa: E402

from steer_hydra.core.output import Output  # noqa: E402
from steer_hydra.evaluation import ProviderOptions, as_inspect_model  # noqa: E402
from steer_hydra.models import TinySpec, build_tiny_tokenizer  # noqa: E402

GROUPS = (
    ("waiting (select, locks: idle, not work)", ("select", "acquire", "poll", "_thread.lock", "sleep")),
    ("realtime sample buffer (sqlite)", ("sqlite3", "log/_recorders/buffer")),
    ("log recording (inspect_ai.log)", ("inspect_ai/log/",)),
    ("copy.deepcopy (events, state)", ("copy.py",)),
    ("transcript/events (inspect_ai.event, _util)", ("inspect_ai/event", "inspect_ai/_util/")),
    ("model wrapper (inspect_ai.model)", ("inspect_ai/model/",)),
    ("task/sample runner (inspect_ai._eval)", ("inspect_ai/_eval/",)),
    ("scorer/solver (inspect_ai.scorer, .solver)", ("inspect_ai/scorer/", "inspect_ai/solver/")),
    ("pydantic (validation, serialization)", ("pydantic",)),
    ("json/zip/compression", ("json", "zipfile", "zlib", "zstandard", "compress", "gzip")),
    ("steer_hydra provider and collator", ("steer_hydra/",)),
    ("tokenizer (decode)", ("tokenizers", "transformers/")),
    ("asyncio/anyio event loop", ("asyncio", "anyio", "selectors")),
)


class InstantPipeline:
    """The pipeline surface the provider touches; every row's continuation is the same 64 ids, returned at once."""

    def __init__(self, new_tokens: int = 64) -> None:
        self.tokenizer = build_tiny_tokenizer(TinySpec())
        self.controls = []
        self.supports_batching = True
        self.is_steered = True
        self._row = torch.arange(10, 10 + new_tokens).unsqueeze(0)
        self.calls = 0

    def refill_blockers(self) -> list[str]:
        return ["a stub pipeline"]

    def generate(self, *, messages=None, text=None, runtime_kwargs=None, return_output=True, **kwargs):
        self.calls += 1
        prompts = messages if messages is not None else text
        return [Output(self._row.clone(), torch.ones(1, 4, dtype=torch.long), ["length"]) for _ in prompts]


def group_of(filename: str, function: str) -> str:
    where = f"{filename}:{function}"
    for name, needles in GROUPS:
        if any(n in where for n in needles):
            return name
    return "other"


def measure(samples: int, batch: int, lean: bool, root: Path, profiled: bool = True) -> tuple[float, dict]:
    pipeline = InstantPipeline()
    model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=batch, reasoning_tags=None))
    options = {"log_realtime": False, "log_buffer": 100} if lean else {}
    profile = cProfile.Profile()
    start = time.perf_counter()
    if profiled:
        profile.enable()
    (log,) = inspect_eval(
        make_task(make_prompts(samples)),
        model=model,
        display="none",
        log_dir=str(root / ("lean" if lean else "default")),
        temperature=0,
        max_tokens=64,
        max_connections=batch,
        **options,
    )
    profile.disable()
    wall = time.perf_counter() - start
    if log.status != "success":
        raise RuntimeError(f"eval failed: {log.error}")
    if not profiled:
        return wall, {}
    stats = pstats.Stats(profile)
    groups: dict[str, float] = defaultdict(float)
    for (filename, _line, function), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        groups[group_of(filename, function)] += tottime
    return wall, dict(groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="inspect-overhead-") as tmp:
        root = Path(tmp)
        measure(args.batch, args.batch, False, root / "warm", profiled=False)
        plain = {lean: measure(args.samples, args.batch, lean, root / f"p{lean}", False)[0] for lean in (False, True)}
        results = {lean: measure(args.samples, args.batch, lean, root / f"q{lean}") for lean in (False, True)}
    print(f"samples={args.samples} batch={args.batch} (generation is free; cProfile inflates absolute times)\n")
    names = [name for name, _ in GROUPS] + ["other"]
    print(f"{'self time per sample (ms)':<46}{'default logs':>14}{'lean logs':>12}")
    for name in names:
        values = [results[lean][1].get(name, 0.0) * 1000 / args.samples for lean in (False, True)]
        print(f"{name:<46}{values[0]:>14.2f}{values[1]:>12.2f}")
    totals = [sum(results[lean][1].values()) * 1000 / args.samples for lean in (False, True)]
    walls = [results[lean][0] * 1000 / args.samples for lean in (False, True)]
    print(f"{'total profiled':<46}{totals[0]:>14.2f}{totals[1]:>12.2f}")
    print(f"{'wall per sample (profiled run)':<46}{walls[0]:>14.2f}{walls[1]:>12.2f}")
    print(f"{'wall per batch of ' + str(args.batch):<46}{walls[0] * args.batch:>14.1f}{walls[1] * args.batch:>12.1f}")
    plain_ms = [plain[lean] * 1000 / args.samples for lean in (False, True)]
    print(f"{'wall per sample, NOT profiled':<46}{plain_ms[0]:>14.2f}{plain_ms[1]:>12.2f}")
    print(
        f"{'wall per batch of ' + str(args.batch) + ', NOT profiled':<46}"
        f"{plain_ms[0] * args.batch:>14.1f}{plain_ms[1] * args.batch:>12.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
