"""The live samples bar: fed by Inspect's hooks while open, reaching its total, silent when closed."""

from __future__ import annotations

from types import SimpleNamespace

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.scorer import match

from steer_hydra.evaluation import progress as progress_module
from steer_hydra.evaluation.progress import SampleProgress, planned_samples, sample_progress


def _spec(samples, limit=None, sample_id=None, epochs=None):
    config = SimpleNamespace(limit=limit, sample_id=sample_id, epochs=epochs)
    return SimpleNamespace(dataset=SimpleNamespace(samples=samples), config=config)


def test_planned_samples_follows_limit_sample_ids_and_epochs():
    assert planned_samples(_spec(10)) == 10
    assert planned_samples(_spec(10, limit=4)) == 4
    assert planned_samples(_spec(3, limit=4)) == 3
    assert planned_samples(_spec(10, limit=(2, 5))) == 3
    assert planned_samples(_spec(10, sample_id=["a", "b"])) == 2
    assert planned_samples(_spec(10, limit=4, epochs=2)) == 8


def test_a_task_end_counts_the_samples_resumed_from_an_earlier_log():
    bar = SimpleNamespace(total=0, n=0, set_postfix_str=lambda *a, **k: None, refresh=lambda: None)
    bar.update = lambda k: setattr(bar, "n", bar.n + k)
    progress = SampleProgress(bar)
    progress.task_started("e1", "steer_hydra/mcqa", 4)
    progress.sample_ended("e1")
    assert (bar.n, bar.total) == (1, 4)
    progress.task_ended("e1")  # three samples came from the log: the bar still reaches its total
    assert (bar.n, bar.total) == (4, 4)


def test_the_bar_counts_the_samples_inspect_runs(tmp_path):
    task = Task(dataset=[Sample(input=f"q{i}", target="x") for i in range(5)], scorer=match())
    with sample_progress(enabled=True, desc="samples") as progress:
        bar = progress.bar
        eval(task, model="mockllm/model", limit=3, display="none", log_dir=str(tmp_path))
    assert (bar.n, bar.total) == (3, 3)
    assert progress_module._current is None
    with sample_progress(enabled=False) as off:
        assert off is None and not progress_module.SampleProgressHooks().enabled()
