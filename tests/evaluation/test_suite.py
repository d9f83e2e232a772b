"""InspectSuite: validation, eval_set arguments, failure reporting, result flattening, location normalization."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import steer_hydra.evaluation.provider as provider_module
from steer_hydra.analysis.logs import normalize_location
from steer_hydra.evaluation.suite import InspectSuite, flatten_logs


def _log(
    task, location, *, status="success", metrics=None, n=3, total=None, scorer="includes", error=None, invalidated=False
):
    metrics = metrics or {"accuracy": 0.5, "stderr": 0.1}
    results = SimpleNamespace(
        scores=[SimpleNamespace(name=scorer, metrics={k: SimpleNamespace(value=v) for k, v in metrics.items()})],
        completed_samples=n,
        total_samples=n if total is None else total,
    )
    return SimpleNamespace(
        status=status,
        eval=SimpleNamespace(task=task),
        results=results,
        location=location,
        error=error,
        invalidated=invalidated,
    )


@pytest.fixture
def fake_inspect(monkeypatch):
    """Replace `as_inspect_model` and `eval_set`; record their calls; logs succeed unless told otherwise."""
    import inspect_ai

    state = SimpleNamespace(models=[], calls=[], status={}, closed=0)

    class Api:
        def max_connections(self):
            return 4

        def close(self):
            state.closed += 1

    def as_inspect_model(pipeline, *, options=None, trial_seed=None, model_name="steering-pipeline", generations=None):
        model = SimpleNamespace(api=Api(), name=f"steer_hydra/{model_name}")
        state.models.append(
            {"pipeline": pipeline, "options": options, "trial_seed": trial_seed, "model_name": model_name}
        )
        return model

    def eval_set(tasks, log_dir, **kwargs):
        state.calls.append({"tasks": list(tasks), "log_dir": log_dir, **kwargs})
        logs = []
        for task in tasks:
            name = task if isinstance(task, str) else task.name
            status = state.status.get(name, "success")
            error = None if status == "success" else SimpleNamespace(message=f"RuntimeError: {name} broke\ntrace")
            logs.append(_log(name, str(Path(log_dir) / f"{name.replace('/', '_')}.eval"), status=status, error=error))
        return all(log.status == "success" for log in logs), logs

    monkeypatch.setattr(provider_module, "as_inspect_model", as_inspect_model)
    monkeypatch.setattr(inspect_ai, "eval_set", eval_set)
    return state


# ------------------------------------------------------------------------------------------ 87 validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "", "tasks": ("a",)}, "name"),
        ({"name": "s", "tasks": ()}, "tasks is empty"),
        ({"name": "s", "tasks": ("a",), "limit": 0}, "limit"),
        ({"name": "s", "tasks": ("a",), "sample_ids": {"b": (1,)}}, r"unknown task\(s\) \['b'\]"),
        ({"name": "s", "tasks": ("a",), "max_tasks": 0}, "max_tasks must be an int >= 1"),
    ],
)
def test_invalid_suites_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InspectSuite(**kwargs)


def test_a_single_task_string_becomes_a_tuple():
    assert InspectSuite(name="s", tasks="a/b").tasks == ("a/b",)


# ------------------------------------------------------------------------------------------ 88-91 eval_set call
def test_run_builds_one_model_and_calls_eval_set_once(fake_inspect, tmp_path):
    suite = InspectSuite(
        name="cap", tasks=("t/one", "t/two"), limit=5, task_args={"k": 1}, generate_overrides={"max_tokens": 64}
    )
    pipeline, options = object(), object()
    out = suite.run(
        pipeline,
        log_dir=tmp_path,
        options=options,
        trial_seed=11,
        model_name="abc123",
        generate_defaults={"temperature": 0, "max_tokens": 16},
    )
    assert fake_inspect.models == [{"pipeline": pipeline, "options": options, "trial_seed": 11, "model_name": "abc123"}]
    assert len(fake_inspect.calls) == 1
    call = fake_inspect.calls[0]
    assert call["tasks"] == ["t/one", "t/two"]
    assert call["log_dir"] == str(tmp_path)
    assert call["limit"] == 5
    assert call["temperature"] == 0 and call["max_tokens"] == 64  # the suite's override wins
    assert call["task_args"] == {"k": 1}
    assert (call["epochs"], call["max_tasks"], call["display"], call["score"]) == (1, 1, "none", True)
    # a bad sample fails alone: retried at once, then the task runs on and is retried for its failed samples only
    assert (call["fail_on_error"], call["continue_on_fail"]) == (True, True)
    assert (call["retry_attempts"], call["retry_on_error"], call["retry_immediate"]) == (1, 1, True)
    assert call["max_connections"] == 4  # the provider's max_connections(), passed explicitly
    assert "model_roles" not in call
    assert call["model"].name == "steer_hydra/abc123"
    assert fake_inspect.closed == 1
    assert set(out) == {"t/one", "t/two"}


def test_score_display_model_roles_and_retry_are_forwarded(fake_inspect, tmp_path):
    suite = InspectSuite(name="s", tasks=("t/a",), retry_attempts=0)
    suite.run(object(), log_dir=tmp_path, display="plain", score=False, model_roles={"grader": "openai/gpt-4o"})
    call = fake_inspect.calls[0]
    assert call["score"] is False and call["display"] == "plain" and call["retry_attempts"] == 0
    assert call["model_roles"] == {"grader": "openai/gpt-4o"}
    assert call["limit"] is None


def test_max_tasks_is_forwarded_and_is_not_what_the_suite_evaluates(fake_inspect, tmp_path):
    together = InspectSuite(name="s", tasks=("t/a", "t/b"), max_tasks=2)
    together.run(object(), log_dir=tmp_path)
    assert fake_inspect.calls[0]["max_tasks"] == 2
    assert together.identity() == InspectSuite(name="s", tasks=("t/a", "t/b")).identity()  # logs stay comparable


def test_an_explicit_max_connections_wins(fake_inspect, tmp_path):
    InspectSuite(name="s", tasks=("t/a",)).run(object(), log_dir=tmp_path, generate_defaults={"max_connections": 1})
    assert fake_inspect.calls[0]["max_connections"] == 1


def test_response_cache_is_refused(fake_inspect, tmp_path):
    with pytest.raises(ValueError, match="cache"):
        InspectSuite(name="s", tasks=("t/a",), generate_overrides={"cache": True}).run(object(), log_dir=tmp_path)
    assert fake_inspect.calls == []


# ------------------------------------------------------------------------------------------ 92 sample_ids
def test_sample_ids_run_one_eval_set_per_task_in_its_own_dir(fake_inspect, tmp_path):
    suite = InspectSuite(name="s", tasks=("ns/one", "ns/two"), limit=7, sample_ids={"ns/two": (3, "x")})
    out = suite.run(object(), log_dir=tmp_path)
    first, second = fake_inspect.calls
    assert first["tasks"] == ["ns/one"] and first["log_dir"] == str(tmp_path / "ns_one") and first["limit"] == 7
    assert second["tasks"] == ["ns/two"] and second["log_dir"] == str(tmp_path / "ns_two")
    assert second["sample_id"] == [3, "x"] and "limit" not in second
    assert out["ns/two"]["log"] == "ns_two/ns_two.eval"


# ------------------------------------------------------------------------------------------ 93 failure
def test_a_failed_eval_set_raises_naming_tasks_and_logs(fake_inspect, tmp_path):
    fake_inspect.status = {"t/b": "error", "t/a": "error"}
    suite = InspectSuite(name="s", tasks=("t/c", "t/b", "t/a"))
    with pytest.raises(RuntimeError, match=r"eval_set failed \(logs under ") as info:
        suite.run(object(), log_dir=tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "task t/b failed: RuntimeError: t/b broke;" in message
    assert "task t/a failed: RuntimeError: t/a broke" in message
    assert "trace" not in message and "t/c" not in message
    assert fake_inspect.closed == 1  # the model is closed even on failure


def test_a_failure_without_logs_says_unknown(monkeypatch, fake_inspect, tmp_path):
    import inspect_ai

    monkeypatch.setattr(inspect_ai, "eval_set", lambda tasks, log_dir, **kw: (False, []))
    with pytest.raises(RuntimeError, match=r"no log was written"):
        InspectSuite(name="s", tasks=("t/a",)).run(object(), log_dir=tmp_path)


def test_an_invalidated_log_behind_a_failed_eval_set_raises_naming_it(monkeypatch, fake_inspect, tmp_path):
    import inspect_ai

    good = _log("t/a", str(tmp_path / "a.eval"))
    invalid = _log("t/b", str(tmp_path / "b.eval"), invalidated=True)  # status success, samples invalidated
    monkeypatch.setattr(inspect_ai, "eval_set", lambda tasks, log_dir, **kw: (False, [good, invalid]))
    with pytest.raises(RuntimeError, match="eval_set failed") as info:
        InspectSuite(name="s", tasks=("t/a", "t/b")).run(object(), log_dir=tmp_path)
    assert f"Inspect marks its log {tmp_path / 'b.eval'} invalidated" in str(info.value)
    assert "t/a" not in str(info.value)


def test_a_failure_that_no_log_shows_is_not_a_result(monkeypatch, fake_inspect, tmp_path):
    import inspect_ai

    good = _log("t/a", str(tmp_path / "a.eval"))
    monkeypatch.setattr(inspect_ai, "eval_set", lambda tasks, log_dir, **kw: (False, [good]))
    with pytest.raises(RuntimeError, match=r"reported a failure that no log shows: t/a \("):
        InspectSuite(name="s", tasks=("t/a",)).run(object(), log_dir=tmp_path)


def test_a_cancelled_log_is_an_interrupt_naming_the_tasks_and_where_the_samples_are(fake_inspect, tmp_path):
    from steer_hydra.evaluation.suite import EvaluationInterrupted

    fake_inspect.status = {"t/b": "cancelled"}
    with pytest.raises(EvaluationInterrupted) as info:
        InspectSuite(name="s", tasks=("t/a", "t/b")).run(object(), log_dir=tmp_path)
    assert isinstance(info.value, KeyboardInterrupt)  # passes every `except Exception` as Ctrl-C does
    assert "task(s) t/b did not finish" in str(info.value) and str(tmp_path) in str(info.value)
    assert fake_inspect.closed == 1


def test_a_successful_eval_set_missing_a_task_is_never_a_result(monkeypatch, fake_inspect, tmp_path):
    """Inspect's eval_set answers Ctrl-C by returning success with the logs of the tasks that finished, leaving the
    cancelled task's log on disk and the tasks it did not reach without one."""
    import inspect_ai

    import steer_hydra.evaluation.suite as suite_module
    from steer_hydra.evaluation.suite import EvaluationInterrupted

    first = _log("t/a", str(tmp_path / "a.eval"))
    monkeypatch.setattr(inspect_ai, "eval_set", lambda tasks, log_dir, **kw: (True, [first]))
    suite = InspectSuite(name="s", tasks=("t/a", "t/b", "t/c"))
    monkeypatch.setattr(suite_module, "_cancelled_on_disk", lambda log_dir: ["t/b"])
    with pytest.raises(EvaluationInterrupted, match=r"task\(s\) t/b, t/c did not finish"):
        suite.run(object(), log_dir=tmp_path)
    monkeypatch.setattr(suite_module, "_cancelled_on_disk", lambda log_dir: [])
    with pytest.raises(RuntimeError, match=r"returned no log for task\(s\) t/b, t/c"):
        suite.run(object(), log_dir=tmp_path)


def test_an_interrupt_inspect_passes_on_is_the_same_named_interrupt(monkeypatch, fake_inspect, tmp_path):
    """Ctrl-C can also reach us as Inspect's own KeyboardInterrupt (not a cancelled log): the same one line."""
    import inspect_ai

    import steer_hydra.evaluation.suite as suite_module
    from steer_hydra.evaluation.suite import EvaluationInterrupted

    def interrupted(tasks, log_dir, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_ai, "eval_set", interrupted)
    monkeypatch.setattr(suite_module, "_cancelled_on_disk", lambda log_dir: ["t/b"])
    with pytest.raises(EvaluationInterrupted, match=r"task\(s\) t/b did not finish; the samples that did are kept"):
        InspectSuite(name="s", tasks=("t/a", "t/b")).run(object(), log_dir=tmp_path)
    monkeypatch.setattr(suite_module, "_cancelled_on_disk", lambda log_dir: [])
    with pytest.raises(EvaluationInterrupted, match=r"task\(s\) t/a, t/b did not finish"):
        InspectSuite(name="s", tasks=("t/a", "t/b")).run(object(), log_dir=tmp_path)


# ------------------------------------------------------------------------------------------ 94-95 flattening
def test_flattening_keys_metrics_by_scorer_and_keeps_stderr(tmp_path):
    logs = [
        _log("t/a", str(tmp_path / "a.eval"), metrics={"accuracy": 1.0, "stderr": 0.0}, n=4),
        SimpleNamespace(status="success", eval=SimpleNamespace(task="t/b"), results=None, location="b.eval"),
    ]
    out = flatten_logs(logs, tmp_path)
    assert out["t/a"] == {
        "metrics": {"includes/accuracy": 1.0, "includes/stderr": 0.0},
        "n": 4,
        "failed": 0,
        "log": "a.eval",
    }
    assert out["t/b"] == {"metrics": {}, "n": 0, "failed": 0, "log": "b.eval"}


def test_location_normalization(tmp_path):
    assert normalize_location((tmp_path / "x" / "a.eval").as_uri(), tmp_path) == "x/a.eval"
    assert normalize_location(str(tmp_path / "a.eval"), tmp_path) == "a.eval"
    assert normalize_location("s3://bucket/logs/a.eval", tmp_path) == "s3://bucket/logs/a.eval"
    assert normalize_location("rel/a.eval", tmp_path) == "rel/a.eval"
    assert normalize_location("/elsewhere/a.eval", tmp_path) == "/elsewhere/a.eval"


# ------------------------------------------------------------------------------------------ 96 real Task object
def test_a_task_object_runs_end_to_end_on_the_tiny_model(make_pipeline, tmp_path):
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    task = Task(
        dataset=MemoryDataset([Sample(input=f"say {w}", target=w) for w in ("red", "blue", "green")]),
        solver=[generate()],
        scorer=includes(),
        name="tiny_includes",
    )
    suite = InspectSuite(name="tiny", tasks=(task,), generate_overrides={"temperature": 0, "max_tokens": 4})
    out = suite.run(make_pipeline(), log_dir=tmp_path)
    result = out["tiny_includes"]
    assert set(result["metrics"]) == {"includes/accuracy", "includes/stderr"}
    assert result["n"] == 3
    assert (tmp_path / result["log"]).exists()


def test_tasks_side_by_side_give_the_samples_of_tasks_one_after_another(make_pipeline, tmp_path):
    """Greedy, the tasks' requests sharing the provider's batches changes no completion."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.log import read_eval_log
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    from steer_hydra.evaluation.options import ProviderOptions

    def task(name: str, words: tuple[str, ...]) -> Task:
        samples = [Sample(input=f"{name}: say {w}", target=w, id=w) for w in words]
        return Task(dataset=MemoryDataset(samples), solver=[generate()], scorer=includes(), name=name)

    def completions(max_tasks: int) -> dict[tuple[str, str], str]:
        tasks = (task("colors", ("red", "blue", "green", "black")), task("animals", ("cat", "dog", "owl")))
        suite = InspectSuite(name="two", tasks=tasks, max_tasks=max_tasks, generate_overrides={"max_tokens": 6})
        out = suite.run(make_pipeline(), log_dir=tmp_path / str(max_tasks), options=ProviderOptions(max_batch_size=8))
        logs = [read_eval_log(str(tmp_path / str(max_tasks) / r["log"])) for r in out.values()]
        return {(log.eval.task, str(s.id)): s.output.completion for log in logs for s in log.samples}

    alone = completions(1)
    assert len(alone) == 7 and completions(2) == alone


# ------------------------------------------------------------------------------------------ registry names resolved
def test_a_registry_task_the_suite_resolves_keeps_its_identity_so_a_cell_begun_from_its_name_resumes(
    make_pipeline, tmp_path, monkeypatch
):
    from inspect_ai import eval_set

    from steer_hydra.core.pipeline import SteeringPipeline
    from steer_hydra.evaluation.provider import as_inspect_model

    pipeline = make_pipeline()
    settings = {"temperature": 0, "max_tokens": 2, "max_connections": 4}
    # the cell as Inspect runs it from the name (what the suite passed before it resolved names itself)
    ok, _ = eval_set(
        ["steer_hydra/mcqa"], log_dir=str(tmp_path), model=as_inspect_model(pipeline), task_args={"scorer": "choice"},
        limit=2, display="none", max_tasks=1, epochs=1, retry_attempts=1, retry_on_error=1, retry_immediate=True,
        fail_on_error=True, continue_on_fail=True, **settings,
    )  # fmt: skip
    assert ok
    calls = []
    monkeypatch.setattr(SteeringPipeline, "generate", lambda *a, **k: calls.append(1))
    suite = InspectSuite(name="s", tasks=("steer_hydra/mcqa",), limit=2, task_args={"scorer": "choice"})
    out = suite.run(pipeline, log_dir=tmp_path, generate_defaults=settings)
    assert calls == [] and out["steer_hydra/mcqa"]["n"] == 2 and "choice/accuracy" in out["steer_hydra/mcqa"]["metrics"]
