"""Damage never crashes a run: invalidated logs are evaluated again, unreadable logs are moved aside (evaluation and
reading side), and a sample whose text is not valid UTF-8 fails alone, named, with the other samples scored."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.log import ProvenanceData, invalidate_samples, read_eval_log, write_eval_log
from inspect_ai.scorer import includes
from inspect_ai.solver import generate

from steer_hydra.analysis.frames import cells_frame
from steer_hydra.analysis.logs import (
    UNREADABLE_SUFFIX,
    cells_from_logs,
    failed_samples,
    results_from_logs,
    samples_frame,
)
from steer_hydra.core import ModelSource
from steer_hydra.evaluation.provider import SteeringPipelineModelAPI
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.evaluation.suite import InspectSuite
from steer_hydra.models import TINY_REF

pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

GARBAGE = "2026-01-01T00-00-00-00-00_short-answer_0000000000000000000000.eval"  # a name Inspect lists
BAD_TEXT = b"caf\xe9".decode("utf-8", "surrogateescape")  # bytes that are not UTF-8, decoded leniently


def _eval(save_dir: Path) -> SteeringEval:
    suite = InspectSuite(name="s", tasks=("steer_hydra/short_answer",), limit=2, generate_overrides={"max_tokens": 4})
    return SteeringEval(
        {"baseline": []},
        ModelSource(TINY_REF, device_map=None),
        [suite],
        save_dir=save_dir,
        progress=False,
        seed=3,
        generate_defaults={"temperature": 0},
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A save_dir whose one cell (baseline, trial 0, suite s: 2 samples of short_answer) is complete and indexed."""
    save = tmp_path_factory.mktemp("finished")
    _eval(save).run()
    assert (save / "cells" / "baseline" / "trial_0" / "s.json").is_file()
    return save


@pytest.fixture
def save(finished, tmp_path) -> Path:
    """A private copy of the finished save_dir (a test may damage it)."""
    return Path(shutil.copytree(finished, tmp_path / "save"))


@pytest.fixture
def generated(monkeypatch) -> list[str]:
    """The last message of every request Inspect makes of the provider (a reused cell makes none)."""
    calls: list[str] = []
    original = SteeringPipelineModelAPI._generate

    async def counting(self, input, *args, **kwargs):
        calls.append(input[-1].text)
        return await original(self, input, *args, **kwargs)

    monkeypatch.setattr(SteeringPipelineModelAPI, "_generate", counting)
    return calls


def _cell_dir(save: Path) -> Path:
    return save / "inspect_logs" / "baseline" / "trial_0" / "s"


def _cell_log(save: Path) -> Path:
    (log,) = sorted(_cell_dir(save).glob("*.eval"))
    return log


def _n(records: dict) -> int:
    return records["baseline"][0]["suites"]["s"]["steer_hydra/short_answer"]["n"]


# ------------------------------------------------------------------------------------------ invalidated logs
def _invalidate_first_sample(save: Path) -> str:
    """Invalidate the first sample of the cell's log (as `inspect_ai.log.invalidate_samples` users do); its input."""
    path = _cell_log(save)
    log = read_eval_log(str(path))
    write_eval_log(invalidate_samples(log, [log.samples[0].uuid], ProvenanceData(author="t", reason="bad")), str(path))
    return log.samples[0].input


def test_an_invalidated_log_is_not_read_as_its_cells_result(save, caplog):
    _invalidate_first_sample(save)
    with caplog.at_level(logging.WARNING):
        assert results_from_logs(save).empty and cells_from_logs(save).empty
    assert f"Inspect log {_cell_log(save)} holds invalidated samples" in caplog.text


def test_an_invalidated_indexed_log_is_not_reused_and_its_cell_is_evaluated_again(save, generated):
    invalidated = _invalidate_first_sample(save)
    records = _eval(save).run()
    assert not records["baseline"][0]["provenance"]["reused"]  # a model was loaded: the cell was evaluated again
    assert generated == [invalidated]  # only the invalidated sample; Inspect reused the other
    assert _n(records) == 2
    header = read_eval_log(str(_cell_log(save)), header_only=True)
    assert header.status == "success" and not header.invalidated
    assert results_from_logs(save)["n"].unique().tolist() == [2]
    generated.clear()
    assert _eval(save).run()["baseline"][0]["provenance"]["reused"] and generated == []  # complete again: reused


# ------------------------------------------------------------------------------------------ unreadable logs
def test_a_garbage_log_in_a_cell_is_moved_aside_with_a_warning_and_the_run_completes(tmp_path, caplog):
    save = tmp_path / "save"
    _cell_dir(save).mkdir(parents=True)
    (_cell_dir(save) / GARBAGE).write_bytes(b"not a zip")  # e.g. left by a copy that was cut short
    with caplog.at_level(logging.WARNING):
        records = _eval(save).run()
    assert _n(records) == 2
    garbage = _cell_dir(save) / GARBAGE
    assert not garbage.exists() and (_cell_dir(save) / (GARBAGE + UNREADABLE_SUFFIX)).read_bytes() == b"not a zip"
    [line] = [r.getMessage() for r in caplog.records if "Unreadable Inspect log" in r.getMessage()]
    assert str(garbage) in line and "EOCD not found" in line and GARBAGE + UNREADABLE_SUFFIX in line
    assert "its cell is evaluated again" in line


def test_a_truncated_indexed_log_is_moved_aside_and_its_cell_evaluated_again(save, generated, caplog):
    path = _cell_log(save)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        records = _eval(save).run()
    assert not records["baseline"][0]["provenance"]["reused"] and len(generated) == 2 and _n(records) == 2
    assert Path(str(path) + UNREADABLE_SUFFIX).is_file()
    assert f"Unreadable Inspect log {path} (ValueError: EOCD not found)" in caplog.text


def test_the_suite_moves_an_unreadable_log_aside_before_inspect_reads_the_dir(make_pipeline, tmp_path, caplog):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / GARBAGE).write_bytes(b"")  # eval_set lists the directory recursively
    task = Task(dataset=MemoryDataset([Sample(id=1, input="q", target="x")]), solver=generate(), scorer=includes())
    out = InspectSuite(name="s", tasks=(task,)).run(
        make_pipeline(), log_dir=tmp_path, generate_defaults={"max_tokens": 2}
    )
    assert next(iter(out.values()))["n"] == 1
    assert (tmp_path / "sub" / (GARBAGE + UNREADABLE_SUFFIX)).is_file()
    assert f"Unreadable Inspect log {tmp_path / 'sub' / GARBAGE}" in caplog.text


def test_the_readers_of_a_save_dir_skip_a_garbage_log_with_a_warning_and_leave_it_in_place(save, caplog):
    """Readers run outside the cell lock, so they never move a log (another job may be evaluating that cell)."""
    before = results_from_logs(save)
    cells = cells_from_logs(save)
    garbage = _cell_dir(save) / GARBAGE
    garbage.write_bytes(b"PK\x03\x04 cut short")
    with caplog.at_level(logging.WARNING):
        assert results_from_logs(save).equals(before)
    assert f"Unreadable Inspect log {garbage} (ValueError: EOCD not found) is skipped" in caplog.text
    assert "its results are left out until its cell is evaluated again" in caplog.text
    assert cells_from_logs(save).equals(cells) and garbage.is_file()

    garbage.unlink()
    path = _cell_log(save)  # the log a cells frame names is damaged after it was read
    path.write_bytes(b"")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert samples_frame(cells, save, scores=None).empty
        assert failed_samples(cells, save).empty
    assert caplog.text.count(f"Unreadable Inspect log {path}") == 2  # each reader says so
    assert path.is_file() and not Path(str(path) + UNREADABLE_SUFFIX).exists()
    assert results_from_logs(save).empty


# ------------------------------------------------------------------------------------------ text that is not UTF-8
def _task(*bad: Sample) -> Task:
    samples = [Sample(id=i, input=f"question {i}", target="x") for i in (1, 2, 3)]
    return Task(
        dataset=MemoryDataset([*samples[:1], *bad, *samples[1:]]), solver=generate(), scorer=includes(), name="t"
    )


def test_a_sample_whose_text_is_not_utf8_fails_alone_named_and_the_others_are_scored(make_pipeline, tmp_path, caplog):
    task = _task(
        Sample(id="bad", input=BAD_TEXT, target="x"),
        Sample(id="meta", input="q", target="x", metadata={"k": [BAD_TEXT]}),
    )
    suite = InspectSuite(name="s", tasks=(task,), retry_attempts=0)
    with caplog.at_level(logging.WARNING):
        out = suite.run(make_pipeline(), log_dir=tmp_path, generate_defaults={"temperature": 0, "max_tokens": 2})
    assert out["t"]["n"] == 3 and out["t"]["failed"] == 2 and "includes/accuracy" in out["t"]["metrics"]
    [line] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert line.startswith("task t: 2 sample(s) left out of the run and counted as failed: sample 'bad': input ")
    assert "sample 'meta': metadata['k'][0] holds text that is not valid UTF-8" in line
    assert "'\\udce9' at character 3" in line and "errors='replace'" in line

    cells = cells_frame({"arm": [{"config_id": "c", "trial_id": 0, "suites": {"s": out}}]})
    failures = failed_samples(cells, tmp_path)
    assert failures[["sample_id"]].values.ravel().tolist() == ["bad", "meta"]
    assert failures["error"].str.contains("not valid UTF-8, which Inspect cannot log").all()
    assert sorted(samples_frame(cells, tmp_path, scores=None)["sample_id"]) == [1, 2, 3]

    again = suite.run(make_pipeline(), log_dir=tmp_path, generate_defaults={"temperature": 0, "max_tokens": 2})
    assert again["t"]["n"] == 3 and again["t"]["failed"] == 2  # resumed: the same samples are left out again


def test_a_selected_sample_id_with_bad_text_fails_alone_and_one_with_none_raises(make_pipeline, tmp_path):
    task = _task(Sample(id="bad", input="q", target=BAD_TEXT))
    suite = InspectSuite(name="s", tasks=(task,), sample_ids={"t": (1, "bad", 3)})
    out = suite.run(make_pipeline(), log_dir=tmp_path, generate_defaults={"max_tokens": 2})
    assert out["t"]["n"] == 2 and out["t"]["failed"] == 1

    only_bad = InspectSuite(name="s", tasks=(_task(Sample(id="bad", input=BAD_TEXT)),), sample_ids={"t": ("bad",)})
    with pytest.raises(RuntimeError, match=r"Task t: every selected sample .* sample 'bad': input holds text"):
        only_bad.run(make_pipeline(), log_dir=tmp_path / "only", generate_defaults={"max_tokens": 2})


def test_a_job_counts_the_left_out_sample_and_its_save_dir_lists_it(tmp_path):
    samples = [Sample(input="q1", target="x"), Sample(input=BAD_TEXT, target="x"), Sample(input="q3", target="x")]
    task = Task(dataset=MemoryDataset(samples), solver=generate(), scorer=includes(), name="t")
    suite = InspectSuite(name="s", tasks=(task,), limit=3)
    records = SteeringEval({"baseline": []}, ModelSource(TINY_REF, device_map=None), [suite], save_dir=tmp_path,
                           progress=False, generate_defaults={"max_tokens": 2}).run()  # fmt: skip
    result = records["baseline"][0]["suites"]["s"]["t"]
    assert (result["n"], result["failed"]) == (2, 1)
    assert not (tmp_path / "cells" / "baseline" / "trial_0" / "s.json").exists()  # unindexed: a re-run retries it
    assert results_from_logs(tmp_path)[["n", "failed"]].drop_duplicates().values.tolist() == [[2, 1]]
    cells = cells_from_logs(tmp_path)
    assert failed_samples(cells, tmp_path)["sample_id"].tolist() == [2]  # no id: named by position, as Inspect would
    assert sorted(samples_frame(cells, tmp_path, scores=None)["sample_id"]) == [1, 3]  # the others keep theirs
