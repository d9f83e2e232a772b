"""`InspectSuite`: a named set of Inspect tasks run against one steered pipeline through `inspect_ai.eval_set`.

Invariants:
- one Inspect model per `run()` (`as_inspect_model`), so a suite never reuses another configuration's model;
- `max_connections` is passed to `eval_set` explicitly (the provider's batch ceiling unless the caller gives one):
  Inspect's adaptive concurrency ignores the provider's own `max_connections()` otherwise;
- `eval_set` gives task retry and log-based resume: a re-run into the same `log_dir` completes only the missing
  samples. Give every (configuration, trial, suite) cell its own `log_dir` (a different task identity in the same
  directory is refused by Inspect);
- a failed `eval_set` raises naming the failed tasks and the log directory; no partial results are returned.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

logger = logging.getLogger(__name__)

BUILTIN_TASK_PREFIX = "steer_hydra/"
RESPONSE_CACHE_KEYS = ("cache", "cache_prompt")


def task_name(task: Any) -> str:
    """The name of a task entry: the string itself, or a Task object's `name`."""
    return task if isinstance(task, str) else str(getattr(task, "name", None) or type(task).__name__)


@dataclass(frozen=True, slots=True)
class InspectSuite:
    """A named set of Inspect tasks evaluated together.

    Args:
        name: the suite's name (a log sub-directory and a column of the results frame).
        tasks: registry names (`inspect_evals/gsm8k`, `steer_hydra/short_answer`), file references
            (`path/task.py@name`) or `inspect_ai.Task` objects.
        limit: evaluate the first `limit` samples of each task (the same samples for every arm and trial).
        sample_ids: `{task: ids}` to evaluate exactly those samples of the listed tasks (others use `limit`).
        task_args: forwarded to every task.
        generate_overrides: generation settings (and other `eval_set` options) that win over the runner's
            `generate_defaults`, e.g. `{"max_tokens": 64}`.
        retry_attempts: `eval_set` task retries.
    """

    name: str
    tasks: tuple[Any, ...]
    limit: int | None = None
    sample_ids: Mapping[str, tuple[Any, ...]] | None = None
    task_args: Mapping[str, Any] = field(default_factory=dict)
    generate_overrides: Mapping[str, Any] = field(default_factory=dict)
    retry_attempts: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"InspectSuite.name must be a non-empty string; got {self.name!r}.")
        tasks = (self.tasks,) if isinstance(self.tasks, str) or not isinstance(self.tasks, Sequence) else self.tasks
        tasks = tuple(tasks)
        if not tasks:
            raise ValueError(f"InspectSuite {self.name!r}: tasks is empty; list at least one task.")
        object.__setattr__(self, "tasks", tasks)
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)):
            raise TypeError(f"InspectSuite {self.name!r}: limit must be an int or None; got {self.limit!r}.")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"InspectSuite {self.name!r}: limit must be >= 1 (or None for all); got {self.limit}.")
        if self.sample_ids is not None:
            names = [task_name(t) for t in tasks]
            unknown = sorted(str(k) for k in self.sample_ids if k not in names)
            if unknown:
                raise ValueError(
                    f"InspectSuite {self.name!r}: sample_ids names unknown task(s) {unknown}; keys must be among "
                    f"the suite's tasks {names}."
                )
            ids = {}
            for key, values in self.sample_ids.items():
                values = (values,) if isinstance(values, (str, int)) else tuple(values)
                if not values:
                    raise ValueError(f"InspectSuite {self.name!r}: sample_ids[{key!r}] is empty.")
                ids[key] = values
            object.__setattr__(self, "sample_ids", ids)
        object.__setattr__(self, "task_args", dict(self.task_args))
        object.__setattr__(self, "generate_overrides", dict(self.generate_overrides))
        if self.retry_attempts < 0:
            raise ValueError(f"InspectSuite {self.name!r}: retry_attempts must be >= 0; got {self.retry_attempts}.")

    def task_names(self) -> list[str]:
        return [task_name(t) for t in self.tasks]

    def run(
        self,
        pipeline: Any,
        *,
        log_dir: str | Path,
        options: Any = None,
        base_seed: int | None = None,
        model_name: str = "steering-pipeline",
        generate_defaults: Mapping[str, Any] | None = None,
        display: str = "none",
        score: bool = True,
        model_roles: Mapping[str, Any] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Evaluate every task against the steered `pipeline`; logs go to `log_dir` (resumable).

        Returns `{task: {"metrics": {"scorer/metric": value}, "n": completed samples, "log": location}}`, where
        the location is relative to `log_dir` for local logs.
        """
        from inspect_ai import eval_set

        from steer_hydra.evaluation.provider import as_inspect_model

        if any(task_name(t).startswith(BUILTIN_TASK_PREFIX) for t in self.tasks):
            import steer_hydra.tasks  # noqa: F401  (registers the built-in tasks by name)

        settings = {**dict(generate_defaults or {}), **self.generate_overrides}
        cached = [k for k in RESPONSE_CACHE_KEYS if settings.get(k)]
        if cached:
            raise ValueError(
                f"InspectSuite {self.name!r}: {cached} is set, but Inspect's response cache key ignores which "
                "steering configuration produced a response, so arms would read each other's outputs. "
                "Remove it from generate_defaults/generate_overrides."
            )
        model = as_inspect_model(pipeline, options=options, base_seed=base_seed, model_name=model_name)
        settings.setdefault("max_connections", _batch_ceiling(model))
        common: dict[str, Any] = {
            "model": model,
            "task_args": dict(self.task_args),
            "epochs": 1,
            "max_tasks": 1,
            "display": display,
            "retry_attempts": self.retry_attempts,
            "score": score,
            **settings,
        }
        if model_roles:
            common["model_roles"] = dict(model_roles)
        log_dir = Path(log_dir)
        logs: list[Any] = []
        try:
            if self.sample_ids is None:
                logs.extend(self._eval_set(eval_set, list(self.tasks), log_dir, {"limit": self.limit, **common}))
            else:
                for task in self.tasks:
                    name = task_name(task)
                    sub_dir = log_dir / name.replace("/", "_")
                    if name in self.sample_ids:
                        kwargs = {"sample_id": list(self.sample_ids[name]), **common}
                    else:
                        kwargs = {"limit": self.limit, **common}
                    logs.extend(self._eval_set(eval_set, [task], sub_dir, kwargs))
        finally:
            close = getattr(getattr(model, "api", None), "close", None)
            if callable(close):
                close()  # Inspect never closes a model it was handed
        return flatten_logs(logs, log_dir)

    def _eval_set(self, eval_set: Any, tasks: list[Any], log_dir: Path, kwargs: dict[str, Any]) -> list[Any]:
        log_dir.mkdir(parents=True, exist_ok=True)
        success, logs = eval_set(tasks, log_dir=str(log_dir), **kwargs)
        if not success:
            failed = sorted(
                str(getattr(getattr(log, "eval", None), "task", "unknown"))
                for log in logs
                if getattr(log, "status", None) != "success"
            )
            raise RuntimeError(
                f"Inspect eval_set failed for task(s): {', '.join(failed) or 'unknown'} (logs under {log_dir}). "
                "Inspect the logs (inspect view) for the error; re-running resumes from them."
            )
        return list(logs)


def _batch_ceiling(model: Any) -> int:
    api = getattr(model, "api", None)
    ceiling = getattr(api, "inspect_connections", None) or getattr(api, "effective_max_batch", None)
    if ceiling is None:
        ceiling = api.max_connections() if api is not None else 1
    return max(1, int(ceiling))


def normalize_location(location: str | None, log_dir: str | Path) -> str:
    """A `file:` URI becomes a path; an absolute path becomes relative to `log_dir`; other URIs stay verbatim."""
    if not location:
        return ""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        location = url2pathname(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:
        return location
    path = Path(location)
    if path.is_absolute():
        try:
            return path.resolve().relative_to(Path(log_dir).resolve()).as_posix()
        except ValueError:
            return str(path)
    return location


def flatten_logs(logs: Sequence[Any], log_dir: str | Path) -> dict[str, dict[str, Any]]:
    """`{log.eval.task: {"metrics": {"scorer/metric": value}, "n": completed, "log": location}}`."""
    results: dict[str, dict[str, Any]] = {}
    for log in logs:
        metrics: dict[str, Any] = {}
        log_results = getattr(log, "results", None)
        for score in getattr(log_results, "scores", None) or []:
            for metric_name, metric in (score.metrics or {}).items():
                metrics[f"{score.name}/{metric_name}"] = metric.value
        results[log.eval.task] = {
            "metrics": metrics,
            "n": int(log_results.completed_samples) if log_results is not None else 0,
            "log": normalize_location(getattr(log, "location", None), log_dir),
        }
    return results


def smoke_suite(*, limit: int | None = 4, max_tokens: int = 24) -> InspectSuite:
    """The `smoke` suite: the three built-in offline tasks (short answer, multiple choice, instruction following).

    Greedy, `limit` samples per task; runs on the tiny model in seconds and means something on a real model.
    """
    from steer_hydra.tasks import SMOKE_TASKS

    return InspectSuite(
        name="smoke",
        tasks=SMOKE_TASKS,
        limit=limit,
        generate_overrides={"temperature": 0.0, "max_tokens": max_tokens},
    )
