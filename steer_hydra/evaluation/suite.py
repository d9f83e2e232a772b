"""`InspectSuite`: a named set of Inspect tasks run against one steered pipeline through `inspect_ai.eval_set`.

Invariants:
- one Inspect model per `run()` (`as_inspect_model`), so a suite never reuses another configuration's model;
- `max_connections` is passed to `eval_set` explicitly (the provider's `max_connections()`, whose rule the
  provider module states, unless the caller gives one): Inspect's adaptive concurrency ignores it otherwise;
- `eval_set` gives task retry and log-based resume: a re-run into the same `log_dir` completes only the missing
  samples. Give every (configuration, trial, suite) cell its own `log_dir` (a different task identity in the same
  directory is refused by Inspect);
- a bad sample fails alone: a sample whose generation or scoring raises is retried `retry_on_error` times at once,
  then its task runs to the end (`continue_on_fail`), the other samples are scored and the log ends with status
  `error`. `eval_set` retries such a task `retry_attempts` times, re-running only its failed samples (the others are
  reused from the log), and so does a later re-run into the same `log_dir`. A task whose samples all failed, or that
  failed as a whole, raises naming the task, the first failed samples with their errors, and the log directory;
  otherwise the task's results count its failed samples (`failed`) and the suite warns naming them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steer_hydra.evaluation.logs import is_partial, task_result

logger = logging.getLogger(__name__)

RESPONSE_CACHE_KEYS = ("cache", "cache_prompt")
RETRY_FIELDS = ("retry_attempts", "retry_on_error")  # how failures are retried, not what is evaluated


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
        retry_attempts: `eval_set` task retries; each re-runs only the task's failed samples.
        retry_on_error: immediate retries of a failed sample within one attempt.
    """

    name: str
    tasks: tuple[Any, ...]
    limit: int | None = None
    sample_ids: Mapping[str, tuple[Any, ...]] | None = None
    task_args: Mapping[str, Any] = field(default_factory=dict)
    generate_overrides: Mapping[str, Any] = field(default_factory=dict)
    retry_attempts: int = 1
    retry_on_error: int = 1

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
        for key in RETRY_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"InspectSuite {self.name!r}: {key} must be an int >= 0; got {value!r}.")

    def run(
        self,
        pipeline: Any,
        *,
        log_dir: str | Path,
        options: Any = None,
        trial_seed: int | None = None,
        model_name: str = "steering-pipeline",
        generate_defaults: Mapping[str, Any] | None = None,
        display: str = "none",
        score: bool = True,
        model_roles: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Evaluate every task against the steered `pipeline`; logs go to `log_dir` (resumable).

        Returns `{task: {"metrics": {"scorer/metric": value}, "n": completed samples, "failed": samples without a
        score, "log": location}}`, where the location is relative to `log_dir` for local logs. `tags` and
        `metadata` go into every log's header (`inspect view` shows them; they are not part of task identity).
        `trial_seed` is the seed of sampling requests that set none (the runner passes the trial seed).
        """
        from inspect_ai import eval_set

        from steer_hydra.evaluation.provider import as_inspect_model

        settings = {**dict(generate_defaults or {}), **self.generate_overrides}
        cached = [k for k in RESPONSE_CACHE_KEYS if settings.get(k)]
        if cached:
            raise ValueError(
                f"InspectSuite {self.name!r}: {cached} is set, but Inspect's response cache key ignores which "
                "steering configuration produced a response, so arms would read each other's outputs. "
                "Remove it from generate_defaults/generate_overrides."
            )
        _check_max_tokens(pipeline, settings.get("max_tokens", getattr(options, "default_max_tokens", None)))
        model = as_inspect_model(pipeline, options=options, trial_seed=trial_seed, model_name=model_name)
        settings.setdefault("max_connections", model.api.max_connections())
        common: dict[str, Any] = {
            "model": model,
            "task_args": dict(self.task_args),
            "epochs": 1,
            "max_tasks": 1,
            "display": display,
            "retry_attempts": self.retry_attempts,
            "retry_on_error": self.retry_on_error,
            "retry_immediate": self.retry_attempts > 0,  # Inspect warns that immediate retry is moot at 0
            "fail_on_error": True,
            "continue_on_fail": True,
            "score": score,
            **settings,
        }
        if model_roles:
            common["model_roles"] = dict(model_roles)
        if tags:  # what `inspect view` shows beside the model name (not part of Inspect's task identity)
            common["tags"] = [str(tag) for tag in tags]
        if metadata:
            common["metadata"] = dict(metadata)
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
        if success:
            return list(logs)
        broken = [log for log in logs if getattr(log, "status", None) != "success" and not is_partial(log)]
        if broken or not logs:
            details = "; ".join(_failure_summary(log) for log in broken) or "no log was written"
            raise RuntimeError(
                f"Inspect eval_set failed (logs under {log_dir}): {details}. Fix the cause (inspect view --log-dir "
                f"{log_dir} shows each error); re-running the same command resumes from the logs."
            )
        for log in logs:
            if is_partial(log):
                logger.warning("%s", _failure_summary(log))
        return list(logs)


def _failure_summary(log: Any, shown: int = 3) -> str:
    """`task: N of M sample(s) failed: id 3: ValueError: ...` (or the task's own error when it failed whole)."""
    task = str(getattr(getattr(log, "eval", None), "task", "unknown"))
    error = getattr(log, "error", None)
    if error is not None:
        return f"task {task} failed: {_first_line(getattr(error, 'message', error))}"
    outcomes = _sample_outcomes(log)
    failures = [(sample_id, error) for sample_id, error in outcomes if error]
    if not failures:
        return f"task {task} ended with status {getattr(log, 'status', None)!r}"
    listed = ", ".join(f"sample {sample_id}: {message}" for sample_id, message in failures[:shown])
    more = f" (and {len(failures) - shown} more)" if len(failures) > shown else ""
    return f"task {task}: {len(failures)} of {len(outcomes)} sample(s) failed after retries: {listed}{more}"


def _sample_outcomes(log: Any) -> list[tuple[Any, str]]:
    """`(sample id, first line of its error or "")` of every sample in the log file."""
    location = getattr(log, "location", None)
    if not location:
        return []
    from inspect_ai.log import read_eval_log_sample_summaries

    try:
        summaries = read_eval_log_sample_summaries(location)
    except Exception:  # noqa: BLE001 - the summary is best effort; the log stays for inspect view
        return []
    return [(s.id, _first_line(s.error) if s.error else "") for s in summaries]


def _first_line(message: Any) -> str:
    lines = str(message).strip().splitlines()
    return lines[0] if lines else ""


def _check_max_tokens(pipeline: Any, max_tokens: Any) -> None:
    """Refuse a `max_tokens` at or past the loaded model's context window (known only once it is loaded)."""
    context = getattr(getattr(pipeline, "model", None), "config", None)
    context = getattr(context, "max_position_embeddings", None)
    if isinstance(context, int) and isinstance(max_tokens, int) and max_tokens >= context:
        raise ValueError(
            f"max_tokens={max_tokens} is not below the model's context window of {context} tokens "
            "(max_position_embeddings). Fix: lower generate_defaults.max_tokens or suite.generate_overrides.max_tokens "
            f"(or provider.default_max_tokens) below {context}."
        )


def flatten_logs(logs: Sequence[Any], log_dir: str | Path) -> dict[str, dict[str, Any]]:
    """`{log.eval.task: task_result(log)}` of a suite run's logs, locations relative to `log_dir`."""
    return {log.eval.task: task_result(log, getattr(log, "location", None), log_dir) for log in logs}
