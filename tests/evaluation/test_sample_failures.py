"""A bad sample fails alone: real Inspect runs on the tiny model with a scorer that raises on one sample."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import Score, accuracy, scorer, stderr
from inspect_ai.solver import generate

from steer_hydra.evaluation.suite import InspectSuite

pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")


def fragile_task(calls: list, fail_times: dict) -> Task:
    """Seven samples; sample `id` raises in scoring while `fail_times[id]` > 0 (counted down per call)."""

    @scorer(metrics=[accuracy(), stderr()])
    def fragile():
        async def score(state, target):
            calls.append(state.sample_id)
            if fail_times.get(state.sample_id, 0) > 0:
                fail_times[state.sample_id] -= 1
                raise ValueError(f"fragile scorer broke on {state.sample_id}")
            return Score(value=1.0)

        return score

    samples = [Sample(id=i, input=f"question {i}", target="x") for i in range(1, 8)]
    return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=fragile(), name="fragile")


def run(suite: InspectSuite, pipeline, log_dir: Path, calls: list, fail_times: dict):
    task = fragile_task(calls, fail_times)
    return InspectSuite(**{**suite_fields(suite), "tasks": (task,)}).run(
        pipeline, log_dir=log_dir, generate_defaults={"temperature": 0, "max_tokens": 4}
    )


def suite_fields(suite: InspectSuite) -> dict:
    return {name: getattr(suite, name) for name in suite.__dataclass_fields__}


def test_one_raising_sample_leaves_the_others_scored_and_a_rerun_retries_only_it(make_pipeline, tmp_path, caplog):
    pipeline = make_pipeline()
    suite = InspectSuite(name="s", tasks=("placeholder",), retry_attempts=0, retry_on_error=0)
    calls: list = []
    out = run(suite, pipeline, tmp_path, calls, {3: 99})
    assert out["fragile"]["n"] == 6 and out["fragile"]["failed"] == 1
    assert out["fragile"]["metrics"]["fragile/accuracy"] == pytest.approx(1.0)
    assert sorted(calls) == [1, 2, 3, 4, 5, 6, 7]  # no retry configured: each sample scored once
    assert "task fragile: 1 of 7 sample(s) failed after retries: sample 3: ValueError" in caplog.text
    assert "fragile scorer broke on 3" in caplog.text and "retry_immediate" not in caplog.text

    calls.clear()
    again = run(suite, pipeline, tmp_path, calls, {})  # the cause is fixed: the re-run retries sample 3 alone
    assert calls == [3]
    assert again["fragile"]["n"] == 7 and again["fragile"]["failed"] == 0


def test_retries_are_bounded_and_reuse_the_samples_that_succeeded(make_pipeline, tmp_path):
    pipeline = make_pipeline()
    calls: list = []
    suite = InspectSuite(name="s", tasks=("placeholder",), retry_attempts=1, retry_on_error=1)
    out = run(suite, pipeline, tmp_path, calls, {3: 99})
    assert out["fragile"]["failed"] == 1
    # (1 + retry_attempts) task attempts x (1 + retry_on_error) tries of sample 3; every other sample once
    assert calls.count(3) == 4 and sorted(c for c in calls if c != 3) == [1, 2, 4, 5, 6, 7]

    calls.clear()
    transient = run(suite, pipeline, tmp_path / "transient", calls, {5: 1})  # fails once, then succeeds at once
    assert transient["fragile"]["failed"] == 0 and transient["fragile"]["n"] == 7
    assert calls.count(5) == 2 and len(calls) == 8


def test_a_task_whose_samples_all_fail_raises_naming_the_sample_and_error(make_pipeline, tmp_path):
    pipeline = make_pipeline()
    suite = InspectSuite(name="s", tasks=("placeholder",), retry_attempts=0, retry_on_error=0)
    with pytest.raises(RuntimeError, match=r"fragile: 7 of 7 sample\(s\) failed after retries: sample 1: ValueError"):
        run(suite, pipeline, tmp_path, [], {i: 1 for i in range(1, 8)})


def test_max_tokens_past_the_loaded_models_context_is_refused(make_pipeline, tmp_path):
    pipeline = make_pipeline()
    context = pipeline.model.config.max_position_embeddings
    suite = InspectSuite(name="s", tasks=("placeholder",), generate_overrides={"max_tokens": context})
    with pytest.raises(ValueError, match=rf"max_tokens={context} is not below the model's context window"):
        run(suite, pipeline, tmp_path, [], {})
