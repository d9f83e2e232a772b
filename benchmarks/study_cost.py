"""How a concept study's cost grows with its concepts: wall time, requests generated and requests answered from the
save_dir, and model loads, for the quick preset at several concept counts, each in a fresh output folder.

    .venv/bin/python benchmarks/study_cost.py                          # SmolLM2, 1, 3, 8 and 24 concepts
    .venv/bin/python benchmarks/study_cost.py --model tiny --counts 1 3    # seconds, for trying it out
    .venv/bin/python benchmarks/study_cost.py --extra residency=false      # every job loads its own model

The concepts are the 8 built-in ones, then synthetic ones (a built-in concept renamed, its pairs marked with the
concept's number so each fits its own vector). Each study runs `python -m steer_hydra --multirun
experiment=concept_steering_quick` as a new process (offline, no W&B). Generated requests are the entries of the
save_dir's generation store (each deterministic request generated once); shared requests are the samples whose
output the logs mark `generation: shared`; model loads are the jobs whose provenance says `model_residency: loaded`.
Adding a concept should cost its concept-dependent arms' generations and little else.
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
    generated = len(list((save_dir / "generations").rglob("*.json")))
    return {
        "concepts": count,
        "jobs": len(records),
        "wall_s": round(wall, 1),
        "generated": generated,
        "shared": shared_samples(save_dir),
        "model_loads": loads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a model group option (default smollm2)")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 3, 8, 24])
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every study (e.g. residency=false)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="study-cost-") as workdir:
        rows = [run(count, args.model, args.extra, Path(workdir)) for count in args.counts]
    print(f"{'concepts':>8} {'jobs':>5} {'wall s':>8} {'generated':>10} {'shared':>7} {'loads':>6}")
    for row in rows:
        print(
            f"{row['concepts']:>8} {row['jobs']:>5} {row['wall_s']:>8} {row['generated']:>10} {row['shared']:>7} "
            f"{row['model_loads']:>6}"
        )


if __name__ == "__main__":
    main()
