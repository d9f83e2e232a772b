"""A job whose scorer raises on one sample: the others are scored, every file is written, a re-run retries it alone."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

TASK_FILE = """
import os
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import Score, accuracy, scorer, stderr
from inspect_ai.solver import generate


@scorer(metrics=[accuracy(), stderr()])
def fragile():
    async def score(state, target):
        with open(os.environ["FRAGILE_CALLS"], "a") as calls:
            calls.write(f"{state.sample_id}\\n")
        if state.sample_id == 3 and not Path(os.environ["FRAGILE_FIXED"]).exists():
            raise ValueError("poison sample")
        return Score(value=1.0)

    return score


@task
def fragile_task():
    samples = [Sample(id=i, input=f"question {i}", target="x") for i in range(1, 8)]
    return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=fragile())
"""


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open(newline="")))


@pytest.mark.slow
def test_a_poison_sample_fails_alone_and_a_rerun_retries_only_it(run_app, tmp_path):
    task_file = tmp_path / "fragile.py"
    task_file.write_text(TASK_FILE)
    calls, fixed = tmp_path / "calls.txt", tmp_path / "fixed"
    env = {"FRAGILE_CALLS": str(calls), "FRAGILE_FIXED": str(fixed)}
    args = [
        "logger=none",
        "progress=false",
        f"suite.tasks=[{task_file}@fragile_task]",
        "suite.limit=null",
        "suite.retry_attempts=0",
        "suite.retry_on_error=1",
        "suite.generate_overrides.max_tokens=4",
        f"save_dir={tmp_path / 'save'}",
    ]
    first = run_app(*args, "hydra.run.dir=out1", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    console = first.stdout + first.stderr
    assert "sample 3" in console and "poison sample" in console
    out = tmp_path / "out1"
    results = _rows(out / "results.csv")
    accuracy = next(r for r in results if r["metric"] == "accuracy")
    assert (accuracy["n"], accuracy["failed"], float(accuracy["value"])) == ("6", "1", 1.0)
    failed = _rows(out / "failed_samples.csv")
    assert [(r["sample_id"], "poison sample" in r["error"]) for r in failed] == [("3", True)]
    assert len(_rows(out / "samples.csv")) == 7  # the failed sample is a row too (without a score)
    tried = calls.read_text().split()
    assert tried.count("3") == 2 and sorted(set(tried)) == [str(i) for i in range(1, 8)]  # 1 + retry_on_error

    fixed.touch()
    calls.write_text("")
    second = run_app(*args, "hydra.run.dir=out2", env=env)  # the same save_dir: only sample 3 runs again
    assert second.returncode == 0, second.stderr[-3000:]
    assert calls.read_text().split() == ["3"]
    accuracy = next(r for r in _rows(tmp_path / "out2" / "results.csv") if r["metric"] == "accuracy")
    assert (accuracy["n"], accuracy["failed"]) == ("7", "0")
    assert not (tmp_path / "out2" / "failed_samples.csv").exists()
