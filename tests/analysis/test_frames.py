"""Results frames (results(), runs_frame, summarize_runs, params columns) and log reading (samples_frame,
failed_samples, results and cells rebuilt from a save_dir, the configuration records). Paired deltas are
test_stats.py's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import steer_hydra.analysis.logs as logs_module
from steer_hydra.analysis.frames import (
    CELL_COLUMNS,
    RESULT_COLUMNS,
    RUN_ID_COLUMNS,
    cells_frame,
    results_frame,
    runs_frame,
    summarize_runs,
)
from steer_hydra.analysis.logs import (
    LEFT_OUT_KEY,
    arm_names,
    cells_from_logs,
    config_records,
    failed_count,
    failed_samples,
    left_out_samples,
    log_complete,
    results_from_logs,
    samples_frame,
    task_result,
)
from steer_hydra.core.identity import derive_trial_seed
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.models import TINY_REF
from steer_hydra.store import Cell, SaveDir


def _record(config_id, trial, trial_seed, metrics, *, seed=7, suite="cap", task="t/one", log=None, params=None):
    """A run record as `SteeringEval.run()` gives it: `seed` is the launch seed, `trial_seed` the derived one."""
    log = log or f"inspect_logs/{config_id}/trial_{trial}/{suite}/{task.replace('/', '_')}.eval"
    return {
        "config_id": config_id,
        "trial_id": trial,
        "seed": seed,
        "trial_seed": trial_seed,
        "params": params or {},
        "suites": {suite: {task: {"metrics": metrics, "n": 3, "log": log}}},
        "provenance": {},
    }


RESULTS = {
    "baseline": [
        _record("baseline", 0, 11, {"includes/accuracy": 0.5, "includes/stderr": 0.2}),
        _record("baseline", 1, 12, {"includes/accuracy": 0.7, "includes/stderr": 0.1}),
    ],
    "pasta": [
        _record("abc", 0, 21, {"includes/accuracy": 0.9, "includes/stderr": 0.05}),
        _record("abc", 1, 22, {"includes/accuracy": 0.8, "includes/stderr": 0.15}),
    ],
}


# ------------------------------------------------------------------------------------------ 113-114 results
def test_results_frame_has_one_row_per_metric_key():
    frame = results_frame(RESULTS)
    assert tuple(frame.columns) == RESULT_COLUMNS
    assert len(frame) == 8
    assert RESULT_COLUMNS[:5] == RUN_ID_COLUMNS == ("arm", "config_id", "trial_id", "seed", "trial_seed")
    row = frame[(frame.arm == "pasta") & (frame.trial_id == 1) & (frame.metric == "accuracy")].iloc[0]
    assert (row.scorer, row.value, row.n, row.config_id) == ("includes", 0.8, 3, "abc")
    assert (row.seed, row.trial_seed) == (7, 22)
    assert row.log == "inspect_logs/abc/trial_1/cap/t_one.eval"


def test_keys_split_at_the_first_slash():
    frame = results_frame({"a": [_record("a", 0, None, {"s/m/x": 1.0, "bare": 2.0})]})
    assert frame[["scorer", "metric"]].values.tolist() == [["s", "m/x"], ["", "bare"]]


def test_results_before_run_raise():
    ev = SteeringEval({"baseline": []}, TINY_REF, [SimpleNamespace(name="s", generate_overrides={})])
    with pytest.raises(RuntimeError, match=r"run\(\)"):
        ev.results()
    with pytest.raises(RuntimeError, match=r"run\(\)"):
        ev.samples_frame(["includes"])


# ------------------------------------------------------------------------------------------ 115-117 runs_frame
def test_runs_frame_input_checks():
    two_tasks = results_frame(
        {"a": [_record("a", 0, 1, {"s/accuracy": 1.0}), _record("a", 0, 1, {"s/accuracy": 1.0}, task="t/two")]}
    )
    with pytest.raises(ValueError, match="at least one"):
        runs_frame(results_frame(RESULTS), [])
    with pytest.raises(ValueError, match="No rows match"):
        runs_frame(results_frame(RESULTS), ["accuracy"], suite="nope")
    with pytest.raises(ValueError, match=r"several tasks \['t/one', 't/two'\]"):
        runs_frame(two_tasks, ["accuracy"])
    assert len(runs_frame(two_tasks, ["accuracy"], task="t/two")) == 1


def test_runs_frame_metric_keys():
    frame = results_frame(RESULTS)
    with pytest.raises(KeyError, match="not found.*includes/accuracy"):
        runs_frame(frame, ["f1"])
    shared = results_frame({"a": [_record("a", 0, 1, {"x/accuracy": 1.0, "y/accuracy": 0.0})]})
    with pytest.raises(KeyError, match="ambiguous"):
        runs_frame(shared, ["accuracy"])
    assert runs_frame(shared, ["y/accuracy"])["y/accuracy"].tolist() == [0.0]
    duplicated = pd.concat([frame, frame.iloc[:1]])
    with pytest.raises(ValueError, match="several rows"):
        runs_frame(duplicated, ["accuracy"])


def test_runs_frame_shape_and_order():
    frame = runs_frame(results_frame(RESULTS), ["accuracy", "includes/stderr"])
    assert list(frame.columns) == ["arm", "config_id", "trial_id", "seed", "trial_seed", "accuracy", "includes/stderr"]
    assert frame[["arm", "trial_id", "seed", "trial_seed"]].values.tolist() == [
        ["baseline", 0, 7, 11],
        ["baseline", 1, 7, 12],
        ["pasta", 0, 7, 21],
        ["pasta", 1, 7, 22],
    ]
    assert frame["accuracy"].tolist() == [0.5, 0.7, 0.9, 0.8]
    assert frame["includes/stderr"].tolist() == [0.2, 0.1, 0.05, 0.15]


def test_runs_frame_outer_joins_metrics():
    frame = results_frame({"a": [_record("a", 0, 1, {"s/x": 1.0, "s/y": 2.0}), _record("a", 1, 2, {"s/x": 3.0})]})
    out = runs_frame(frame, ["x", "y"])
    assert out["x"].tolist() == [1.0, 3.0]
    assert out["y"].iloc[0] == 2.0 and math.isnan(out["y"].iloc[1])


# ------------------------------------------------------------------------------------------ 118, 125 params
@pytest.fixture
def finished_eval(monkeypatch, tmp_path):
    """A SteeringEval whose run produced records for a baseline and a two-point sweep."""
    ev = SteeringEval(
        {"baseline": []}, TINY_REF, [SimpleNamespace(name="cap", generate_overrides={})], save_dir=tmp_path
    )
    ev._results = {
        "baseline": [_record("baseline", 0, 1, {"s/accuracy": 0.5})],
        "sweep": [
            _record("p1", 0, 2, {"s/accuracy": 0.6}, params={"pasta": {"alpha": 0.1, "heads": [1, 2]}}),
            _record("p2", 0, 3, {"s/accuracy": 0.7}, params={"pasta": {"alpha": 2, "heads": [3]}}),
        ],
    }
    ev._log_root = tmp_path
    ev._params_by_config = {
        "baseline": {},
        "p1": ev._results["sweep"][0]["params"],
        "p2": ev._results["sweep"][1]["params"],
    }
    return ev


def test_runs_frame_params_columns(finished_eval):
    frame = finished_eval.runs_frame(["accuracy"], params={"alpha": ("pasta", "alpha"), "heads": ("pasta", "heads")})
    assert math.isnan(frame["alpha"].iloc[0])
    assert frame["alpha"].tolist()[1:] == [0.1, 2.0]
    assert pd.api.types.is_float_dtype(frame["alpha"])
    assert frame["heads"].dtype == object and frame["heads"].iloc[1] == [1, 2]


def test_samples_frame_attaches_params(finished_eval, monkeypatch):
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: _fake_log([_sample(1, {"s": "C"})]))
    frame = finished_eval.samples_frame(["s"], params={"alpha": ("pasta", "alpha")})
    assert frame["alpha"].tolist()[1:] == [0.1, 2.0]
    assert frame["s"].tolist() == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------------------------------ 119 summarize
def test_summarize_runs():
    runs = pd.DataFrame(
        {
            "arm": ["a", "a", "a", "b"],
            "config_id": ["x", "x", "x", "y"],
            "acc": [0.2, 0.4, 0.9, 0.5],
            "f1": [1.0, 1.0, 1.0, 0.0],
            "alpha": [0.1, 0.1, 0.1, 0.3],
        }
    )
    summary = summarize_runs(runs, ["acc", "f1"], param_cols=("alpha", "absent"))
    assert list(summary.columns[:2]) == ["arm", "config_id"] and summary["config_id"].tolist() == ["x", "y"]
    a = summary[summary.arm == "a"].iloc[0]
    b = summary[summary.arm == "b"].iloc[0]
    std = float(np.std([0.2, 0.4, 0.9], ddof=1))
    assert a.acc_mean == pytest.approx(0.5) and a.acc_std == pytest.approx(std)
    assert a.acc_sem == pytest.approx(std / math.sqrt(3)) and a.n_trials == 3 and a.alpha == 0.1
    assert (b.acc_std, b.acc_sem, b.n_trials) == (0.0, 0.0, 1)
    assert "absent" not in summary.columns
    with pytest.raises(ValueError, match="at least one"):
        summarize_runs(runs, [])


def test_summarize_runs_keeps_missing_group_keys():
    runs = pd.DataFrame({"arm": ["a", "a"], "config_id": [None, None], "acc": [1.0, 0.0]})
    summary = summarize_runs(runs, ["acc"])
    assert len(summary) == 1 and summary.acc_mean.iloc[0] == 0.5


# ------------------------------------------------------------------------------------------ 120-124 samples
def _sample(sample_id, scores, metadata=None, text="q", completion="a"):
    return SimpleNamespace(
        id=sample_id,
        scores={k: SimpleNamespace(value=v) for k, v in scores.items()},
        metadata=metadata or {},
        input=text,
        output=SimpleNamespace(completion=completion),
    )


def _fake_log(samples):
    return SimpleNamespace(samples=samples)


def test_samples_frame_input_checks_and_path_resolution(monkeypatch):
    read = []
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: read.append(path) or _fake_log([]))
    frame = results_frame(RESULTS)
    with pytest.raises(ValueError, match="at least one"):
        samples_frame(frame, "/logs", scores=[])
    with pytest.raises(ValueError, match="No rows match"):
        samples_frame(frame, "/logs", scores=["includes"], task="zzz")
    samples_frame(frame, "/logs", scores=["includes"])
    assert "/logs/inspect_logs/baseline/trial_0/cap/t_one.eval" in read
    absolute = results_frame({"a": [_record("a", 0, 1, {"s/m": 1}, log="/abs/x.eval")]})
    samples_frame(absolute, "/logs", scores=["s"])
    assert read[-1] == "/abs/x.eval"


def test_samples_frame_rows_columns_and_values(monkeypatch):
    logs = {
        "baseline": _fake_log(
            [
                _sample(2, {"inc": "I", "dict": {"a": 0.5, "b": "x"}}, {"kind": "k2"}, text="q2", completion="c2"),
                _sample(1, {"inc": "C", "dict": {"a": True, "b": [1]}}, {"kind": "k1"}, text="q1", completion="c1"),
            ]
        ),
        "abc": _fake_log([_sample(1, {"inc": 1, "dict": {"a": None, "b": "P"}})]),
    }
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: logs[path.split("/")[3]])
    frame = results_frame({"baseline": RESULTS["baseline"][:1], "pasta": RESULTS["pasta"][:1]})
    out = samples_frame(
        frame, "/r", scores=["inc", "dict/a", "dict/b"], metadata_keys=["kind", "missing"], include_text=True
    )
    assert list(out.columns) == [
        "arm",
        "config_id",
        "trial_id",
        "seed",
        "trial_seed",
        "suite",
        "task",
        "sample_id",
        "kind",
        "missing",
        "inc",
        "dict/a",
        "dict/b",
        "input",
        "completion",
    ]
    assert out[["arm", "sample_id"]].values.tolist() == [["baseline", 1], ["baseline", 2], ["pasta", 1]]
    assert out["inc"].tolist() == [1.0, 0.0, 1.0]
    assert out["dict/a"].tolist()[:2] == [1.0, 0.5] and out["dict/a"].iloc[2] is None
    assert out["dict/b"].tolist() == [[1], "x", 0.5]  # lists and other strings raw; P through value_to_float
    assert out["kind"].tolist()[:2] == ["k1", "k2"] and out["missing"].tolist() == [None, None, None]
    assert out["input"].tolist()[:2] == ["q1", "q2"] and out["completion"].tolist()[:2] == ["c1", "c2"]
    assert out["trial_seed"].tolist() == [11, 11, 21] and out["seed"].tolist() == [7, 7, 7]


def test_samples_come_from_the_cells_so_a_run_without_metrics_gives_its_samples(monkeypatch):
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: _fake_log([_sample(1, {}), _sample(2, {})]))
    unscored = {"a": [_record("a", 0, 5, {})]}  # score=False: the task reported no metrics
    assert results_frame(unscored).empty
    out = samples_frame(cells_frame(unscored), "/r", scores=None)
    assert out["sample_id"].tolist() == [1, 2] and out.columns[-1] == "sample_id"  # no score columns
    assert out["arm"].tolist() == ["a", "a"] and out["trial_seed"].tolist() == [5, 5]


def test_scores_none_takes_every_scorer_and_a_failed_sample_scores_none(monkeypatch):
    failed = SimpleNamespace(**{**vars(_sample(3, {})), "error": SimpleNamespace(message="boom")})
    log = _fake_log([_sample(1, {"x": 1.0}), _sample(2, {"x": 0.0, "y": "C"}), failed])
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: log)
    cells = cells_frame({"a": RESULTS["baseline"][:1]})
    out = samples_frame(cells, "/r", scores=None)
    assert list(out.columns[-2:]) == ["x", "y"]
    assert out["x"].tolist()[:2] == [1.0, 0.0] and out["y"].tolist() == [None, 1.0, None]
    assert samples_frame(cells, "/r", scores=["x"])["x"].tolist()[2] is None  # failed: no score, no KeyError


def test_failed_samples_are_listed_with_their_error(monkeypatch):
    failed = SimpleNamespace(**{**vars(_sample(3, {})), "error": SimpleNamespace(message="ValueError: fragile\ntrace")})
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: _fake_log([_sample(1, {"x": 1.0}), failed]))
    out = failed_samples(cells_frame({"a": RESULTS["baseline"][:1]}), "/r")
    assert out[["arm", "config_id", "trial_id", "sample_id", "error"]].values.tolist() == [
        ["a", "baseline", 0, 3, "ValueError: fragile"]
    ]
    assert (out["seed"].iloc[0], out["trial_seed"].iloc[0]) == (7, 11)


def test_samples_left_out_of_a_run_count_as_failed_and_are_listed_with_their_error(monkeypatch):
    left_out = {"t/one": [{"id": "bad", "error": "input holds text that is not valid UTF-8, ...\nmore"}]}
    spec = SimpleNamespace(task="t/one", metadata={LEFT_OUT_KEY: {**left_out, "t/two": [{"id": 9, "error": "x"}]}})
    results = SimpleNamespace(scores=[], completed_samples=2, total_samples=3)
    log = SimpleNamespace(**vars(_fake_log([_sample(1, {"x": 1.0})])), eval=spec, results=results, status="error")
    assert left_out_samples(log) == left_out["t/one"]  # the log's own task only
    assert failed_count(log) == 2 and task_result(log, "l.eval", "/r")["failed"] == 2  # 1 errored + 1 left out
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: log)
    out = failed_samples(cells_frame({"a": RESULTS["baseline"][:1]}), "/r")
    assert out[["sample_id", "error"]].values.tolist() == [["bad", "input holds text that is not valid UTF-8, ..."]]
    assert left_out_samples(SimpleNamespace(eval=SimpleNamespace(task="t", metadata=None))) == []


def test_a_log_is_complete_when_finished_and_not_invalidated():
    results = SimpleNamespace(completed_samples=2)
    assert log_complete(SimpleNamespace(status="success", invalidated=False))
    assert log_complete(SimpleNamespace(status="error", error=None, results=results, invalidated=False))  # partial
    assert not log_complete(SimpleNamespace(status="success", invalidated=True))
    assert not log_complete(SimpleNamespace(status="started", invalidated=False))


def test_unscored_inspect_run_gives_its_samples_without_score_columns(tmp_path):
    from steer_hydra.core import ModelSource
    from steer_hydra.core.sweeps import PipelineFactory
    from steer_hydra.evaluation.suite import InspectSuite

    suite = InspectSuite(
        name="s", tasks=("steer_hydra/short_answer",), limit=2, generate_overrides={"max_tokens": 4, "temperature": 0}
    )
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    with factory.steered([]) as pipeline:
        out = suite.run(pipeline, log_dir=tmp_path / "cell", score=False)
    factory.release()
    (task,) = out
    record = {
        "config_id": "baseline",
        "trial_id": 0,
        "seed": None,
        "trial_seed": None,
        "suites": {"s": {task: out[task]}},
    }
    assert results_frame({"baseline": [record]}).empty  # no metrics at all
    samples = samples_frame(cells_frame({"baseline": [record]}), tmp_path / "cell", scores=None, include_text=True)
    assert len(samples) == 2 and list(samples.columns[-3:]) == ["sample_id", "input", "completion"]


def test_samples_frame_score_key_errors(monkeypatch):
    monkeypatch.setattr(
        logs_module, "_read_eval_log", lambda path: _fake_log([_sample(1, {"d": {"a": 1.0}, "n": 0.5})])
    )
    frame = results_frame({"a": RESULTS["baseline"][:1]})
    with pytest.raises(KeyError, match="'nope'"):
        samples_frame(frame, "/r", scores=["nope"])
    with pytest.raises(KeyError, match="absent"):
        samples_frame(frame, "/r", scores=["d/zz"])
    with pytest.raises(KeyError, match="absent"):
        samples_frame(frame, "/r", scores=["n/zz"])


# ------------------------------------------------------------------------------------------ several seeds
def _two_seeds():
    """The same configuration and trial run from two launch seeds (two save_dirs, absolute log locations)."""
    return {
        "a": [
            _record("a", 0, 101, {"s/accuracy": 0.25}, seed=1, log="/one/a.eval"),
            _record("a", 0, 202, {"s/accuracy": 0.75}, seed=2, log="/two/a.eval"),
        ]
    }


def test_runs_of_several_seeds_are_separate_rows_and_pool_as_trials():
    runs = runs_frame(results_frame(_two_seeds()), ["accuracy"])
    assert runs[["seed", "trial_id", "trial_seed", "accuracy"]].values.tolist() == [
        [1, 0, 101, 0.25],
        [2, 0, 202, 0.75],
    ]
    summary = summarize_runs(runs, ["accuracy"])
    assert (summary.accuracy_mean.iloc[0], summary.n_trials.iloc[0]) == (0.5, 2)
    duplicated = results_frame({"a": [_two_seeds()["a"][0]] * 2})
    with pytest.raises(ValueError, match="several rows"):
        runs_frame(duplicated, ["accuracy"])


def test_samples_and_failures_of_several_seeds_are_all_read(monkeypatch):
    failed = SimpleNamespace(**{**vars(_sample(2, {})), "error": SimpleNamespace(message="boom")})
    logs = {
        "/one/a.eval": _fake_log([_sample(1, {"s": 0.0}), failed]),
        "/two/a.eval": _fake_log([_sample(1, {"s": 1.0})]),
    }
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: logs[path])
    cells = cells_frame(_two_seeds())
    out = samples_frame(cells, "/r", scores=["s"])
    assert out[["seed", "trial_seed", "sample_id"]].values.tolist() == [[1, 101, 1], [1, 101, 2], [2, 202, 1]]
    assert out["s"].tolist() == [0.0, None, 1.0]
    assert failed_samples(cells, "/r")[["seed", "sample_id", "error"]].values.tolist() == [[1, 2, "boom"]]
    failed_too = {**logs, "/two/a.eval": _fake_log([failed])}
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: failed_too[path])
    assert failed_samples(cells, "/r")[["seed", "trial_seed"]].values.tolist() == [[1, 101], [2, 202]]


# ------------------------------------------------------------------------------------------ a save_dir's logs
@pytest.fixture(scope="module")
def save_dir(tmp_path_factory):
    """A save_dir with real Inspect logs (mockllm) for two configurations, the second with two trials, and the
    configuration record of the second."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import includes

    def answer(*args):  # with its usage, so mockllm counts no tokens (that would download a tokenizer)
        output = ModelOutput.from_content(model="mockllm", content="the answer is mockllm")
        output.usage = ModelUsage(input_tokens=1, output_tokens=4, total_tokens=5)
        return output

    save = tmp_path_factory.mktemp("save")
    task = Task(dataset=[Sample(input="q", target="mockllm", id="x")], scorer=includes(), name="t")
    for config_id, trial in (("baseline", 0), ("abc123def456", 0), ("abc123def456", 1)):
        log_dir = SaveDir(save).log_dir(Cell(config_id, trial, "cap"))
        model = get_model("mockllm/model", custom_outputs=answer)
        (log,) = inspect_eval(task, model=model, log_dir=str(log_dir), display="none")
        assert log.status == "success", log.error
    record = {"config_id": "abc123def456", "arm": "pasta", "arm_name": "pasta", "controls": []}
    SaveDir(save).write_config_record(record)
    return save


def test_config_records_and_arm_names(save_dir, tmp_path):
    assert config_records(save_dir) == {
        "abc123def456": {"config_id": "abc123def456", "arm": "pasta", "arm_name": "pasta", "controls": []}
    }
    assert arm_names(save_dir) == {"abc123def456": "pasta"}
    assert arm_names(tmp_path) == {} and config_records(tmp_path) == {}


def test_results_from_logs_name_arms_and_derive_trial_seeds(save_dir):
    frame = results_from_logs(save_dir, seed=5)
    assert tuple(frame.columns) == RESULT_COLUMNS
    accuracy = frame[frame.metric == "accuracy"]
    columns = ["arm", "config_id", "trial_id", "seed", "suite", "task", "scorer", "value", "n"]
    assert accuracy[columns].values.tolist() == [
        ["pasta", "abc123def456", 0, 5, "cap", "t", "includes", 1.0, 1],
        ["pasta", "abc123def456", 1, 5, "cap", "t", "includes", 1.0, 1],
        ["baseline", "baseline", 0, 5, "cap", "t", "includes", 1.0, 1],  # no record: the config_id names the arm
    ]
    assert accuracy["trial_seed"].tolist() == [
        derive_trial_seed(5, "abc123def456", 0),
        derive_trial_seed(5, "abc123def456", 1),
        derive_trial_seed(5, "baseline", 0),
    ]
    logs = accuracy["log"].tolist()
    assert logs[1].startswith("inspect_logs/abc123def456/trial_1/cap/") and logs[1].endswith(".eval")
    unseeded = results_from_logs(save_dir, {"baseline": "ref"}, config_ids=["baseline"])
    assert unseeded[["arm", "seed", "trial_seed"]].drop_duplicates().values.tolist() == [["ref", None, None]]


def test_cells_from_logs_give_the_samples(save_dir):
    cells = cells_from_logs(save_dir, seed=5, config_ids=["abc123def456"])
    assert tuple(cells.columns) == CELL_COLUMNS
    assert cells[["arm", "trial_id", "seed", "suite", "task"]].values.tolist() == [
        ["pasta", 0, 5, "cap", "t"],
        ["pasta", 1, 5, "cap", "t"],
    ]
    samples = samples_frame(cells, save_dir, scores=None, include_text=True)
    assert samples[["arm", "trial_id", "trial_seed", "sample_id", "includes"]].values.tolist() == [
        ["pasta", 0, derive_trial_seed(5, "abc123def456", 0), "x", 1.0],
        ["pasta", 1, derive_trial_seed(5, "abc123def456", 1), "x", 1.0],
    ]
    assert samples["completion"].str.contains("mockllm").all()
