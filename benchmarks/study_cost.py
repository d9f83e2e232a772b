"""How a concept study's cost grows with its concepts: wall time, requests generated and requests answered from the
save_dir, model loads, the tokens generated, and how far the wall time is above the time the model needs for those
tokens alone, for the quick preset at several concept counts, each in a fresh output folder.

    .venv/bin/python benchmarks/study_cost.py                          # SmolLM2, 1, 3, 8 and 24 concepts
    .venv/bin/python benchmarks/study_cost.py --counts 1 3             # SmolLM2, about 13 minutes on 2 cores
    .venv/bin/python benchmarks/study_cost.py --model tiny --counts 1 3    # seconds, for trying it out
    .venv/bin/python benchmarks/study_cost.py --extra residency=false      # every job loads its own model
    .venv-vllm/bin/python benchmarks/study_cost.py --counts 1 --extra backend=vllm \
        'hydra.sweeper.arms=[baseline,prompt_concept,caa_concept,caa_concept_random,caa_concept_negated]' \
        'hydra.sweeper.attention_methods=[]'     # on vLLM (PASTA runs on Hugging Face only); loads = engine boots

The concepts are the 8 built-in ones, then synthetic ones (a built-in concept renamed, its pairs marked with the
concept's number so each fits its own vector). Each study runs `python -m steer_hydra --multirun
experiment=concept_steering_quick` as a new process (offline, no W&B). Generated requests are the entries of the
save_dir's generation store (each deterministic request generated once); shared requests are the samples whose
output the logs mark `generation: shared`; model loads are the jobs whose provenance says `model_residency: loaded`.
Adding a concept should cost its concept-dependent arms' generations and little else.

Tokens are summed over the generation store's entries (each request generated once): `prompt tok` prefilled,
`new tok` generated. `cells s` is the time during which an Inspect evaluation of the study ran (the union of its
logs' start-to-end intervals); the rest of the wall time is per-job work (composing, files, W&B) and the report.
`floor s` is what the model alone needs for those tokens: after the studies, plain greedy `generate` of the model (no
steering, no Inspect) is timed here on full batches of the preset's batch ceiling with prompts and outputs of the
store's mean lengths, and the study's requests are costed at that rate (prefill included). `wall/floor` is how far the
study is above that floor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = ["weddings", "joy", "french", "pirate", "money", "dragons", "sadness", "shakespearean"]
CONCEPT_DATA = ROOT / "steer_hydra" / "tasks" / "concept_data"


def concepts(count: int, folder: Path) -> list[str]:
    """The first `count` concepts: built-in names, then synthetic concept files written into `folder`."""
    chosen = BUILTIN[:count]
    for number in range(count - len(chosen)):
        base = BUILTIN[number % len(BUILTIN)]
        data = yaml.safe_load((CONCEPT_DATA / f"{base}.yaml").read_text())
        data["name"] = f"{base}_{number}"
        for pair in data.get("pairs", []):
            pair["positive"] = f"{pair['positive']} ({number})"
        path = folder / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        chosen.append(str(path))
    return chosen


def shared_samples(save_dir: Path) -> int:
    """Samples whose output the logs mark as answered from the save_dir's generations."""
    from inspect_ai.log import read_eval_log

    total = 0
    for path in save_dir.rglob("*.eval"):
        log = read_eval_log(str(path))
        total += sum(1 for s in log.samples or [] if (s.output.metadata or {}).get("generation") == "shared")
    return total


def store_tokens(save_dir: Path) -> tuple[int, int, int]:
    """(requests, prompt tokens, new tokens) over the save_dir's generation store: every request generated once."""
    requests = prompt = new = 0
    for path in (save_dir / "generations").rglob("*.json"):
        usage = json.loads(path.read_text())["output"].get("usage") or {}
        requests += 1
        prompt += usage.get("input_tokens") or 0
        new += usage.get("output_tokens") or 0
    return requests, prompt, new


def cell_seconds(save_dir: Path) -> float:
    """Seconds during which an Inspect evaluation of the study ran: the union of its logs' start-to-end intervals
    (a suite run with `suite.max_tasks` above 1 runs its tasks side by side: their intervals overlap, counted once)."""
    from datetime import datetime

    from inspect_ai.log import read_eval_log

    spans = []
    for path in save_dir.rglob("*.eval"):
        stats = read_eval_log(str(path), header_only=True).stats
        if stats.started_at and stats.completed_at:
            spans.append((datetime.fromisoformat(stats.started_at), datetime.fromisoformat(stats.completed_at)))
    total, reach = 0.0, None
    for start, end in sorted(spans):
        start = max(start, reach) if reach is not None else start  # the part before `reach` is counted already
        if end > start:
            total += (end - start).total_seconds()
            reach = end
    return total


def batch_seconds(model: str, batch: int, prompt_len: int, new_len: int, rounds: int = 2) -> float:
    """Median seconds of one plain greedy `generate` of `batch` rows (`prompt_len` prompt tokens, exactly `new_len`
    new ones) on `model`'s checkpoint, as the model group loads it (dtype, attention)."""
    import statistics

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from steer_hydra.models.references import resolve_model_reference

    group = OmegaConf.to_container(OmegaConf.load(ROOT / "steer_hydra" / "conf" / "model" / f"{model}.yaml"))
    kwargs = dict(group.get("hf_model_kwargs") or {})
    dtype = getattr(torch, kwargs.pop("dtype", "float32"))
    path = resolve_model_reference(group["model_name_or_path"])
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    lm.eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, lm.config.vocab_size, (batch, max(prompt_len, 1)), generator=generator)
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        with torch.no_grad():
            lm.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_len, min_new_tokens=new_len,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run(count: int, model: str, extra: list[str], workdir: Path) -> dict:
    folder = workdir / f"concepts_{count}"
    folder.mkdir(parents=True)
    listed = concepts(count, folder)
    out = workdir / f"outputs_{count}"
    command = [
        sys.executable, "-m", "steer_hydra", "--multirun", "experiment=concept_steering_quick",
        f"model={model}", f"concepts=[{','.join(listed)}]", f"output_root={out}", "logger=none", "progress=false",
        *extra,
    ]  # fmt: skip
    began = time.perf_counter()
    proc = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{count} concept(s) failed:\n{proc.stderr[-3000:]}")
    (save_dir,) = [p for p in (out / "concept_steering_quick").glob("*/seed_*") if p.is_dir()]
    records = [json.loads(p.read_text()) for p in out.rglob("job_record.json")]
    loads = sum(1 for r in records if r["provenance"].get("model_residency") == "loaded")
    generated, prompt_tokens, new_tokens = store_tokens(save_dir)
    return {
        "concepts": count,
        "jobs": len(records),
        "wall_s": round(wall, 1),
        "cells_s": round(cell_seconds(save_dir), 1),
        "generated": generated,
        "shared": shared_samples(save_dir),
        "model_loads": loads,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
    }


def floor_seconds(rows: list[dict], model: str, batch: int) -> None:
    """Add each row's `floor_s`: its requests costed at the plain-generate rate of full batches of `batch`."""
    requests = sum(r["generated"] for r in rows)
    prompt_len = round(sum(r["prompt_tokens"] for r in rows) / max(requests, 1))
    new_len = round(sum(r["new_tokens"] for r in rows) / max(requests, 1))
    seconds = batch_seconds(model, batch, prompt_len, new_len)
    print(
        f"plain greedy generate on {model}: {batch} rows of {prompt_len} prompt + {new_len} new tokens in "
        f"{seconds:.2f} s ({batch * new_len / seconds:.0f} new tok/s)"
    )
    for row in rows:
        row["floor_s"] = round(row["generated"] / batch * seconds, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a model group option (default smollm2)")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 3, 8, 24])
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every study (e.g. residency=false)")
    parser.add_argument("--keep", type=Path, help="keep the studies' outputs in this new folder (default: deleted)")
    parser.add_argument("--batch", type=int, default=72, help="the floor's batch: the preset's provider.max_batch_size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="study-cost-") as scratch:
        workdir = args.keep or Path(scratch)
        rows = [run(count, args.model, args.extra, workdir) for count in args.counts]
    floor_seconds(rows, args.model, args.batch)
    header = ["concepts", "jobs", "wall s", "cells s", "generated", "shared", "loads", "prompt tok", "new tok"]
    print(" ".join(f"{h:>10}" for h in [*header, "floor s", "wall/floor"]))
    for row in rows:
        values = [row[k] for k in ("concepts", "jobs", "wall_s", "cells_s", "generated", "shared", "model_loads")]
        values += [row["prompt_tokens"], row["new_tokens"], row["floor_s"], f"{row['wall_s'] / row['floor_s']:.1f}x"]
        print(" ".join(f"{v:>10}" for v in values))


if __name__ == "__main__":
    main()
