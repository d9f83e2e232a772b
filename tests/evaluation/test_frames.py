"""Results frames (results(), runs_frame, summarize_runs, params columns), log reading (samples_frame,
failed_samples) and paired deltas."""

from __future__ import annotations

import math
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import steer_hydra.evaluation.logs as logs_module
from steer_hydra.evaluation.deltas import paired_deltas
from steer_hydra.evaluation.frames import RESULT_COLUMNS, cells_frame, results_frame, runs_frame, summarize_runs
from steer_hydra.evaluation.logs import failed_samples, samples_frame
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.models import TINY_REF


def _record(config_id, trial, seed, metrics, *, suite="cap", task="t/one", log=None, params=None):
    log = log or f"inspect_logs/{config_id}/trial_{trial}/{suite}/{task.replace('/', '_')}.eval"
    return {
        "trial_id": trial,
        "seed": seed,
        "config_id": config_id,
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
    row = frame[(frame.config == "pasta") & (frame.trial == 1) & (frame.metric == "accuracy")].iloc[0]
    assert (row.scorer, row.value, row.seed, row.n, row.config_id) == ("includes", 0.8, 22, 3, "abc")


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
    assert list(frame.columns) == ["pipeline", "config_id", "trial_id", "seed", "accuracy", "includes/stderr"]
    assert frame[["pipeline", "trial_id"]].values.tolist() == [
        ["baseline", 0],
        ["baseline", 1],
        ["pasta", 0],
        ["pasta", 1],
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
            "pipeline": ["a", "a", "a", "b"],
            "config_id": ["x", "x", "x", "y"],
            "acc": [0.2, 0.4, 0.9, 0.5],
            "f1": [1.0, 1.0, 1.0, 0.0],
            "alpha": [0.1, 0.1, 0.1, 0.3],
        }
    )
    summary = summarize_runs(runs, ["acc", "f1"], param_cols=("alpha", "absent"))
    a = summary[summary.pipeline == "a"].iloc[0]
    b = summary[summary.pipeline == "b"].iloc[0]
    std = float(np.std([0.2, 0.4, 0.9], ddof=1))
    assert a.acc_mean == pytest.approx(0.5) and a.acc_std == pytest.approx(std)
    assert a.acc_sem == pytest.approx(std / math.sqrt(3)) and a.n_trials == 3 and a.alpha == 0.1
    assert (b.acc_std, b.acc_sem, b.n_trials) == (0.0, 0.0, 1)
    assert "absent" not in summary.columns
    with pytest.raises(ValueError, match="at least one"):
        summarize_runs(runs, [])


def test_summarize_runs_keeps_missing_group_keys():
    runs = pd.DataFrame({"pipeline": ["a", "a"], "config_id": [None, None], "acc": [1.0, 0.0]})
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
        "pipeline",
        "config_id",
        "trial_id",
        "seed",
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
    assert out[["pipeline", "sample_id"]].values.tolist() == [["baseline", 1], ["baseline", 2], ["pasta", 1]]
    assert out["inc"].tolist() == [1.0, 0.0, 1.0]
    assert out["dict/a"].tolist()[:2] == [1.0, 0.5] and out["dict/a"].iloc[2] is None
    assert out["dict/b"].tolist() == [[1], "x", 0.5]  # lists and other strings raw; P through value_to_float
    assert out["kind"].tolist()[:2] == ["k1", "k2"] and out["missing"].tolist() == [None, None, None]
    assert out["input"].tolist()[:2] == ["q1", "q2"] and out["completion"].tolist()[:2] == ["c1", "c2"]
    assert out["seed"].tolist() == [11, 11, 21]


def test_samples_come_from_the_cells_so_a_run_without_metrics_gives_its_samples(monkeypatch):
    monkeypatch.setattr(logs_module, "_read_eval_log", lambda path: _fake_log([_sample(1, {}), _sample(2, {})]))
    unscored = {"a": [_record("a", 0, 5, {})]}  # score=False: the task reported no metrics
    assert results_frame(unscored).empty
    out = samples_frame(cells_frame(unscored), "/r", scores=None)
    assert out["sample_id"].tolist() == [1, 2] and out.columns[-1] == "sample_id"  # no score columns
    assert out["pipeline"].tolist() == ["a", "a"] and out["seed"].tolist() == [5, 5]


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
    assert out[["config", "sample_id", "error"]].values.tolist() == [["a", 3, "ValueError: fragile"]]


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
    record = {"config_id": "baseline", "trial_id": 0, "seed": None, "suites": {"s": {task: {**out[task]}}}}
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


# ------------------------------------------------------------------------------------------ paired deltas
def _samples(rows):
    return pd.DataFrame(rows, columns=["pipeline", "config_id", "trial_id", "suite", "task", "sample_id", "score"])


def _arm(pipeline, config_id, scores, trial=0, task="t"):
    return [(pipeline, config_id, trial, "s", task, i, v) for i, v in enumerate(scores)]


def test_paired_deltas_by_hand_normal_interval():
    samples = _samples(_arm("baseline", "baseline", [1, 0, 1, 0]) + _arm("arm", "a1", [1, 1, 1, 0]))
    out = paired_deltas(samples, "score", method="normal")
    row = out.iloc[0]
    # differences 0, 1, 0, 0: mean 0.25, sd 0.5, se 0.25
    z = NormalDist().inv_cdf(0.975)
    assert (row.pipeline, row.config_id, row.suite, row.task, row.metric, row.n) == ("arm", "a1", "s", "t", "score", 4)
    assert (row.baseline_mean, row.arm_mean, row.delta, row.se) == pytest.approx((0.5, 0.75, 0.25, 0.25))
    assert (row.ci_low, row.ci_high) == pytest.approx((0.25 - z * 0.25, 0.25 + z * 0.25))


def test_paired_deltas_by_hand_bootstrap_interval():
    # two pairs with differences 0 and 1: resampled means are 0, 0.5, 1 with probability 1/4, 1/2, 1/4,
    # so the 95% percentile interval is [0, 1]; a constant difference gives a degenerate interval
    samples = _samples(_arm("baseline", "baseline", [0, 0]) + _arm("arm", "a1", [0, 1]) + _arm("flat", "f1", [1, 1]))
    out = paired_deltas(samples, "score", seed=7).set_index("pipeline")
    assert (out.loc["arm", "delta"], out.loc["arm", "ci_low"], out.loc["arm", "ci_high"]) == (0.5, 0.0, 1.0)
    assert (out.loc["flat", "delta"], out.loc["flat", "ci_low"], out.loc["flat", "ci_high"]) == (1.0, 1.0, 1.0)
    assert (out["method"] == "bootstrap").all()


def test_bootstrap_is_seeded_and_independent_of_other_arms():
    rng = np.random.default_rng(0)
    base = rng.random(30).round(2).tolist()
    arm = (np.array(base) + rng.normal(0.1, 0.2, 30)).round(2).tolist()
    one = _samples(_arm("baseline", "baseline", base) + _arm("arm", "a1", arm))
    two = _samples(_arm("baseline", "baseline", base) + _arm("arm", "a1", arm) + _arm("zz", "z", base[::-1]))
    first = paired_deltas(one, "score", seed=3).iloc[0]
    again = paired_deltas(two, "score", seed=3).set_index("pipeline").loc["arm"]
    assert (first.ci_low, first.ci_high) == (again.ci_low, again.ci_high)
    other = paired_deltas(one, "score", seed=4).iloc[0]
    assert (first.ci_low, first.ci_high) != (other.ci_low, other.ci_high)
    assert first.ci_low < first.delta < first.ci_high


def test_trials_are_averaged_per_sample_before_pairing():
    samples = _samples(
        _arm("baseline", "baseline", [1, 0, 0])
        + _arm("baseline", "baseline", [1, 0, 1], trial=1)
        + _arm("arm", "a1", [1, 1, 1])
        + _arm("arm", "a1", [0, 1, 1], trial=1)
    )
    row = paired_deltas(samples, "score", method="normal").iloc[0]
    # per-sample means: baseline 1, 0, .5; arm .5, 1, 1; differences -.5, 1, .5
    assert row.n == 3 and (row.n_trials, row.n_trials_baseline) == (2, 2)
    assert row.delta == pytest.approx(1 / 3)
    assert row.se == pytest.approx(np.std([-0.5, 1, 0.5], ddof=1) / math.sqrt(3))


def test_only_samples_both_arms_hold_are_paired_per_task():
    samples = _samples(
        _arm("baseline", "baseline", [1, 0, 1, 1])
        + _arm("arm", "a1", [0, 0, 1])  # lacks sample 3
        + _arm("baseline", "baseline", [0, 0], task="u")
        + _arm("arm", "a1", [1, 1], task="u")
    )
    out = paired_deltas(samples, "score").set_index("task")
    assert out.loc["t", "n"] == 3 and out.loc["t", "delta"] == pytest.approx(-1 / 3)
    assert out.loc["u", "n"] == 2 and out.loc["u", "delta"] == 1.0


def test_paired_deltas_with_one_pair_has_no_interval_and_letters_are_scores():
    samples = _samples(_arm("baseline", "baseline", ["I"]) + _arm("arm", "a1", ["C"]))
    row = paired_deltas(samples, "score").iloc[0]
    assert row.delta == 1.0 and row.n == 1 and math.isnan(row.ci_low) and math.isnan(row.ci_high)


def test_paired_deltas_errors():
    samples = _samples(_arm("baseline", "baseline", [1]) + _arm("arm", "a1", [0]))
    with pytest.raises(ValueError, match="matches no pipeline"):
        paired_deltas(samples, "score", baseline="ref")
    with pytest.raises(ValueError, match="method"):
        paired_deltas(samples, "score", method="t")
    with pytest.raises(KeyError, match="missing"):
        paired_deltas(samples, "nope")
    bad = _samples(_arm("baseline", "baseline", [[1]]) + _arm("arm", "a1", [0]))
    with pytest.raises(TypeError, match="non-numeric"):
        paired_deltas(bad, "score")
    two_bases = _samples(_arm("baseline", "b1", [1]) + _arm("baseline", "b2", [1]) + _arm("arm", "a1", [0]))
    with pytest.raises(ValueError, match="several configurations"):
        paired_deltas(two_bases, "score")
