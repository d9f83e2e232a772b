"""Reading a save_dir by suite: a job's comparison reads the logs of its own suite only, however many suites its
configuration and the baseline hold (a study's baseline holds one per concept), and reads them once."""

from __future__ import annotations

import dataclasses
from collections import Counter

import inspect_ai.log
import pytest

from steer_hydra.analysis.compare import CellSelection, compare
from steer_hydra.analysis.logs import results_from_logs
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.core import ModelSource
from steer_hydra.core.identity import BASELINE_CONFIG_ID
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.models import TINY_REF
from steer_hydra.tasks import smoke_suite

SUITES = ("smoke", "other", "third")


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory):
    """The baseline and one prompt on three suites (the smoke tasks, two samples each) in one save_dir."""
    save = tmp_path_factory.mktemp("by_suite")
    suite = smoke_suite(limit=2, max_tokens=2)
    evaluation = SteeringEval(
        {"baseline": [], "brief": [SystemPrompt(text="Answer briefly.")]},
        ModelSource(TINY_REF, device_map=None),
        [dataclasses.replace(suite, name=name) for name in SUITES],
        seed=0,
        save_dir=save,
        progress=False,
    )
    results = evaluation.run()
    return save, {arm: records[0]["config_id"] for arm, records in results.items()}


@pytest.fixture
def reads(monkeypatch):
    """`{suite: number of log reads}` (headers and whole logs) while the test runs."""
    counted: Counter[str] = Counter()
    original = inspect_ai.log.read_eval_log

    def counting(location, *args, **kwargs):
        suite = next((s for s in SUITES if f"/{s}/" in str(location)), "?")
        counted[suite] += 1
        return original(location, *args, **kwargs)

    monkeypatch.setattr(inspect_ai.log, "read_eval_log", counting)
    return counted


def test_results_of_some_suites_read_only_their_logs(save_dir, reads):
    save, _ = save_dir
    every = results_from_logs(save)
    assert set(every["suite"]) == set(SUITES) and reads["other"] > 0
    reads.clear()
    some = results_from_logs(save, suites=["smoke"])
    assert set(reads) == {"smoke"}  # no header of another suite's log was read
    expected = every[every["suite"] == "smoke"].reset_index(drop=True)
    assert (
        some.sort_values(list(some.columns))
        .reset_index(drop=True)
        .equals(expected.sort_values(list(expected.columns)).reset_index(drop=True))
    )


def test_a_jobs_comparison_reads_its_suites_logs_once(save_dir, reads):
    save, ids = save_dir
    selection = CellSelection(
        save_dirs={0: save},
        config_ids=[ids["brief"]],
        baseline_config_id=ids["baseline"],
        suite="other",
        model="tiny",
    )
    assert ids["baseline"] == BASELINE_CONFIG_ID
    comparison = compare(selection)
    assert set(reads) == {"other"}
    logs = len(list((save / "inspect_logs").glob("*/trial_0/other/*.eval")))
    assert logs == 2 * 3  # two configurations, three tasks
    assert reads["other"] == 2 * logs  # each log's header once (results and cells) and the whole log once (samples)
    assert set(comparison.results["suite"]) == {"other"} and len(comparison.deltas) > 0


def test_a_log_is_read_whole_once_per_version_of_its_file(save_dir, monkeypatch):
    """The jobs of a suite all compare against the baseline's logs: a log already read whole is not read again
    (the second comparison reads no log whole), until its file is written again."""
    import os

    save, ids = save_dir
    whole: list[str] = []
    original = inspect_ai.log.read_eval_log

    def counting(location, *args, **kwargs):
        if not kwargs.get("header_only"):
            whole.append(str(location))
        return original(location, *args, **kwargs)

    monkeypatch.setattr(inspect_ai.log, "read_eval_log", counting)
    selection = CellSelection(
        save_dirs={0: save}, config_ids=[ids["brief"]], baseline_config_id=ids["baseline"], suite="third", model="tiny"
    )
    first = compare(selection)
    logs = sorted(str(p) for p in (save / "inspect_logs").glob("*/trial_0/third/*.eval"))
    assert sorted(whole) == logs  # each of the suite's logs once, whole
    again = compare(selection)
    assert sorted(whole) == logs and again.deltas.equals(first.deltas)

    rewritten = logs[0]
    stat = os.stat(rewritten)
    os.utime(rewritten, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # the file written again
    compare(selection)
    assert sorted(whole) == sorted([*logs, rewritten])
