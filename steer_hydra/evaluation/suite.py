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
  otherwise the task's results count its failed samples (`failed`) and the suite warns naming them;
- a sample Inspect could not write to its log (text that is not valid UTF-8 in its input, target, choices or
  metadata, e.g. bytes decoded with `errors="surrogateescape"`) fails alone: it is left out of the run with one
  warning per task naming it and the fix, recorded in the log header (`logs.LEFT_OUT_KEY`) and counted as failed;
  the other samples run and are scored. Registry and file tasks are resolved here (as `eval_set` would) so their
  samples can be checked; their task identity, and so resume, is unchanged;
- an unreadable log in a cell's directory (truncated, not a zip) is moved aside (`logs.readable_logs`) before
  `eval_set` reads the directory, so the cell is evaluated again instead of every run failing on it;
- an interrupted evaluation is never a result: Inspect answers a Ctrl-C (SIGINT) by cancelling the running task,
  writing its finished samples to a log of status `cancelled` and returning from `eval_set` as if the tasks it did
  not reach did not exist. A task without a returned log, or a cancelled log, raises `EvaluationInterrupted` (a
  `KeyboardInterrupt`, so nothing downstream takes the partial run for a finished one) naming the tasks that did
  not finish and the log directory, where the finished samples wait for the re-run;
- a number that should not be reported is not returned: when `eval_set` reports failure, every log that is not
  `success` (short of failed samples only) and every log Inspect marks invalidated raises, naming the log;
- extra scorers (`run(scorers={task: [...]})`, e.g. a model judge beside a task's rule scorers) are appended to the
  named tasks' own scorers; the models they call come through `model_roles`, which Inspect counts in a task's
  identity (scorers it does not).
"""

from __future__ import annotations

import contextvars
import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from steer_hydra.analysis.logs import LEFT_OUT_KEY, is_partial, readable_logs, task_result

logger = logging.getLogger(__name__)

RESPONSE_CACHE_KEYS = ("cache", "cache_prompt")
# How the suite runs (failures retried, tasks side by side), not what it evaluates: not in its identity. Each field's
# least value.
EXECUTION_FIELDS = {"retry_attempts": 0, "retry_on_error": 0, "max_tasks": 1}


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
        max_tasks: tasks evaluated side by side (1: one after another). Side by side, their requests share the
            provider's batches, which pays where a decode step costs about the same for few rows as for many (a
            GPU), not on a CPU. Not part of the suite's identity: greedy outputs are those of one task at a time,
            up to the floating-point order of a batch's padding.
    """

    name: str
    tasks: tuple[Any, ...]
    limit: int | None = None
    sample_ids: Mapping[str, tuple[Any, ...]] | None = None
    task_args: Mapping[str, Any] = field(default_factory=dict)
    generate_overrides: Mapping[str, Any] = field(default_factory=dict)
    retry_attempts: int = 1
    retry_on_error: int = 1
    max_tasks: int = 1

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
        for key, least in EXECUTION_FIELDS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"InspectSuite {self.name!r}: {key} must be an int >= {least}; got {value!r}. Fix: suite.{key}="
                    f"{max(least, 1)} (or another int >= {least})."
                )

    def identity(self, content_digests: Mapping[str, Callable[[Any], str]] | None = None) -> dict[str, Any]:
        """What of the suite makes its logs comparable (`store.comparable`): every field but how it runs (the retry
        policy, `max_tasks`), plus `<arg>_content` for each task arg given a digest function (a concept file's path
        says nothing of its content: an edited file is another one)."""
        identity = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in EXECUTION_FIELDS}
        for arg, digest in (content_digests or {}).items():
            if self.task_args.get(arg) is not None:
                identity[f"{arg}_content"] = digest(self.task_args[arg])
        return identity

    def run(
        self,
        pipeline: Any,
        *,
        log_dir: str | Path,
        options: Any = None,
        trial_seed: int | None = None,
        model_name: str = "steering-pipeline",
        generate_defaults: Mapping[str, Any] | None = None,
        generations: Any = None,
        display: str = "none",
        score: bool = True,
        model_roles: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scorers: Mapping[str, Sequence[Any]] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Evaluate every task against the steered `pipeline`; logs go to `log_dir` (resumable).

        Returns `{task: {"metrics": {"scorer/metric": value}, "n": completed samples, "failed": samples without a
        score, "log": location}}`, where the location is relative to `log_dir` for local logs. `tags` and
        `metadata` go into every log's header (`inspect view` shows them; they are not part of task identity).
        `trial_seed` is the seed of sampling requests that set none (the runner passes the trial seed).
        `model_roles` binds Inspect model roles (e.g. `{"judge": "openai/gpt-4o-mini"}`); `scorers` maps a task name
        of this suite to Inspect scorers appended to that task's own. `generations` (a `store.GenerationStore`)
        answers requests this configuration's trial already generated (another concept's suite) without generating.
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
        extra = {name: list(found) for name, found in (scorers or {}).items() if found}
        unknown = sorted(set(extra) - {task_name(task) for task in self.tasks})
        if unknown:
            raise ValueError(
                f"InspectSuite {self.name!r}: scorers name task(s) {unknown} that the suite does not run; its tasks "
                f"are {[task_name(task) for task in self.tasks]}."
            )
        model = as_inspect_model(
            pipeline, options=options, trial_seed=trial_seed, model_name=model_name, generations=generations
        )
        settings.setdefault("max_connections", model.api.max_connections())
        common: dict[str, Any] = {
            "model": model,
            "task_args": dict(self.task_args),
            "epochs": 1,
            "max_tasks": self.max_tasks,
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
                logs.extend(self._eval_set(eval_set, list(self.tasks), log_dir, {"limit": self.limit, **common}, extra))
            else:
                for task in self.tasks:
                    name = task_name(task)
                    sub_dir = log_dir / name.replace("/", "_")
                    if name in self.sample_ids:
                        kwargs = {"sample_id": list(self.sample_ids[name]), **common}
                    else:
                        kwargs = {"limit": self.limit, **common}
                    logs.extend(self._eval_set(eval_set, [task], sub_dir, kwargs, extra))
        finally:
            close = getattr(getattr(model, "api", None), "close", None)
            if callable(close):
                close()  # Inspect never closes a model it was handed
        return flatten_logs(logs, log_dir)

    def _eval_set(
        self,
        eval_set: Any,
        tasks: list[Any],
        log_dir: Path,
        kwargs: dict[str, Any],
        scorers: Mapping[str, Sequence[Any]] | None = None,
    ) -> list[Any]:
        log_dir.mkdir(parents=True, exist_ok=True)
        readable_logs(log_dir, move=True)  # an unreadable log would fail eval_set's listing: moved aside, warned
        tasks, kwargs = _leave_out_unwritable_samples(tasks, kwargs)
        if scorers:
            tasks, kwargs = _with_scorers(tasks, kwargs, scorers)
        # in a copy of this context: what Inspect binds for the run (its model roles: a judge) ends with it, so a
        # later evaluation or scorer in this process never sees another run's judge
        try:
            success, logs = contextvars.copy_context().run(eval_set, tasks, log_dir=str(log_dir), **kwargs)
        except EvaluationInterrupted:
            raise
        except KeyboardInterrupt:  # an interrupt Inspect passed on instead of returning a cancelled log
            names = [task_name(task) for task in tasks]
            cancelled = [task for task in _cancelled_on_disk(log_dir) if task in names]
            raise _interrupted(cancelled or names, log_dir) from None
        _check_finished(tasks, logs, log_dir, success)
        if success:
            return list(logs)
        broken = [log for log in logs if _not_reportable(log)]
        if broken or not logs or not any(is_partial(log) for log in logs):
            details = "; ".join(_failure_summary(log) for log in broken) or (
                "no log was written"
                if not logs
                else "eval_set reported a failure that no log shows: "
                + ", ".join(f"{_log_task(log)} ({getattr(log, 'location', None)})" for log in logs)
            )
            raise RuntimeError(
                f"Inspect eval_set failed (logs under {log_dir}): {details}. Fix the cause (inspect view --log-dir "
                f"{log_dir} shows each error); re-running the same command resumes from the logs."
            )
        for log in logs:
            if is_partial(log):
                logger.warning("%s", _failure_summary(log))
        return list(logs)


class EvaluationInterrupted(KeyboardInterrupt):
    """An evaluation stopped by an interrupt (Ctrl-C) before every task finished: the message names the tasks that
    did not finish and the log directory that keeps the finished samples. A `KeyboardInterrupt`, so it passes
    every `except Exception` and ends the program as an interrupt does."""


def _log_task(log: Any) -> str:
    return str(getattr(getattr(log, "eval", None), "task", "unknown"))


def _not_reportable(log: Any) -> bool:
    """A log whose numbers are not a result: not `success` (short of failed samples only), or invalidated."""
    if getattr(log, "invalidated", False):
        return True
    return getattr(log, "status", None) != "success" and not is_partial(log)


def _check_finished(tasks: Sequence[Any], logs: Sequence[Any], log_dir: Path, success: bool) -> None:
    """Raise `EvaluationInterrupted` when `eval_set` came back without finishing every task because it was
    interrupted (a cancelled log, returned or left in `log_dir`); RuntimeError when a task has no log otherwise
    (a failure without any log is left to the failure report)."""
    names = [task_name(task) for task in tasks]
    returned = {_log_task(log) for log in logs}
    short = len(logs) < len(names) and (success or bool(logs))
    missing = [name for name in names if name not in returned] if short else []
    cancelled = [_log_task(log) for log in logs if getattr(log, "status", None) == "cancelled"]
    if not missing and not cancelled:
        return
    cancelled += [task for task in _cancelled_on_disk(log_dir) if task not in cancelled]
    unfinished = list(dict.fromkeys([*cancelled, *missing]))
    if cancelled:
        raise _interrupted(unfinished, log_dir)
    raise RuntimeError(
        f"Inspect eval_set returned no log for task(s) {', '.join(missing)} (logs under {log_dir}), so the run is "
        "incomplete and no result is reported. Fix: re-run the same command; it resumes from the logs."
    )


def _interrupted(unfinished: Sequence[str], log_dir: Path) -> EvaluationInterrupted:
    return EvaluationInterrupted(
        f"Interrupted: task(s) {', '.join(unfinished)} did not finish; the samples that did are kept in the "
        f"logs under {log_dir}. Re-running the same command evaluates only the rest."
    )


def _cancelled_on_disk(log_dir: Path) -> list[str]:
    """The tasks of the logs in `log_dir` whose header says `cancelled` (best effort: [] when unreadable)."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    found = []
    try:
        infos = list_eval_logs(str(log_dir), recursive=False)
    except Exception:  # noqa: BLE001 - an unreadable directory says nothing of an interrupt
        return []
    for info in infos:
        try:
            header = read_eval_log(info.name, header_only=True)
        except Exception:  # noqa: BLE001 - an unreadable log is moved aside by the next run
            continue
        if header.status == "cancelled":
            found.append(_log_task(header))
    return found


def _leave_out_unwritable_samples(tasks: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The tasks and `eval_set` arguments with every selected sample whose text is not valid UTF-8 left out.

    Registry and file tasks are resolved with `task_args` (then passed as Task objects, which `eval_set` resolves
    to the same task identity). A task with such samples runs a copy of itself on its selected samples less those
    (ids given to samples that had none, as Inspect would number them); the left-out samples are named in one
    warning per task and recorded in the logs' header metadata under `LEFT_OUT_KEY`. A task left with no sample
    raises naming them.
    """
    resolved = _resolved_tasks(tasks, kwargs.get("task_args") or {})
    if resolved is None:
        return tasks, kwargs
    kwargs = {key: value for key, value in kwargs.items() if key != "task_args"}  # applied while resolving
    left_out: dict[str, list[dict[str, Any]]] = {}
    screened = []
    for task in resolved:
        kept, bad = _screen_samples(task, kwargs.get("limit"), kwargs.get("sample_id"))
        if not bad:
            screened.append(task)
            continue
        name = str(task.name)
        listed = ", ".join(f"sample {entry['id']!r}: {entry['error']}" for entry in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        if not kept:
            raise RuntimeError(
                f"Task {name}: every selected sample holds text that is not valid UTF-8, so none can run: {listed}"
                f"{more}."
            )
        logger.warning(
            "task %s: %d sample(s) left out of the run and counted as failed: %s%s. Re-running after the fix "
            "evaluates them.",
            name,
            len(bad),
            listed,
            more,
        )
        left_out[name] = bad
        clone = copy.copy(task)
        clone.dataset = _memory_dataset(task.dataset, kept)
        screened.append(clone)
        if isinstance(kwargs.get("sample_id"), list):
            dropped = {str(entry["id"]) for entry in bad}
            kwargs["sample_id"] = [i for i in kwargs["sample_id"] if str(i) not in dropped]
    if left_out:
        kwargs["metadata"] = {**dict(kwargs.get("metadata") or {}), LEFT_OUT_KEY: left_out}
    return screened, kwargs


def _with_scorers(
    tasks: list[Any], kwargs: dict[str, Any], scorers: Mapping[str, Sequence[Any]]
) -> tuple[list[Any], dict[str, Any]]:
    """The tasks (resolved to Task objects, as `eval_set` would resolve them) with `scorers[name]` appended to the
    scorers of each task named there; `task_args` leaves `kwargs` once applied while resolving."""
    if not any(task_name(task) in scorers for task in tasks):
        return tasks, kwargs
    resolved = _resolved_tasks(tasks, kwargs.get("task_args") or {})
    if resolved is None:
        raise ValueError(
            f"Extra scorers for {sorted(scorers)} need the suite's tasks as Inspect tasks, and {tasks} could not be "
            "loaded here (a task function or a sample source). Fix: name registry tasks or file references."
        )
    kwargs = {key: value for key, value in kwargs.items() if key != "task_args"}
    out = []
    for task in resolved:
        added = list(scorers.get(str(task.name), ()))
        if added:
            task = copy.copy(task)
            task.scorer = [*(task.scorer or []), *added]
        out.append(task)
    return out, kwargs


def _resolved_tasks(tasks: list[Any], task_args: Mapping[str, Any]) -> list[Any] | None:
    """Task objects for `tasks` (names and file references loaded as `eval_set` loads them), or None when a task
    cannot be checked (a task function or a sample source): those run unchecked."""
    from inspect_ai import Task

    if not all(isinstance(task, (str, Task)) for task in tasks):
        return None
    if all(isinstance(task, Task) for task in tasks):
        resolved = list(tasks)
    else:
        try:
            from inspect_ai._eval.loader import load_tasks  # what eval_set itself calls on task names
        except ImportError:  # another Inspect layout: run the names unchecked
            return None
        resolved = []
        for task in tasks:
            try:
                loaded = [task] if isinstance(task, Task) else load_tasks([task], dict(task_args))
            except Exception:  # noqa: BLE001 - eval_set loads it again and reports the error as it always did
                return None
            if not loaded:  # an unknown name: eval_set reports it
                return None
            resolved.extend(loaded)
    if any(getattr(task, "sample_source", None) is not None for task in resolved):
        return None
    return resolved


def _screen_samples(task: Any, limit: int | None, sample_id: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """`(kept samples, [{"id", "error"}] of left-out ones)` among the samples `limit` or `sample_id` selects; both
    empty lists when every selected sample is fine (the task then runs unchanged)."""
    dataset = task.dataset
    if sample_id is not None:
        wanted = {str(i) for i in (sample_id if isinstance(sample_id, list) else [sample_id])}
        selected = [(i, s) for i, s in enumerate(dataset) if s.id is not None and str(s.id) in wanted]
    else:
        selected = list(enumerate(dataset[:limit] if limit is not None else dataset))
    kept, bad = [], []
    for position, sample in selected:
        number = position + 1  # the id Inspect gives a sample without one
        problem = _unwritable_text(sample)
        if problem is None:
            kept.append(sample if sample.id is not None else sample.model_copy(update={"id": number}))
        else:
            bad.append({"id": _writable(sample.id if sample.id is not None else number), "error": problem})
    return (kept, bad) if bad else ([], [])


def _unwritable_text(sample: Any) -> str | None:
    """Why a sample cannot be written to a log (`input holds text that is not valid UTF-8: ...`), or None."""
    for name in ("id", "input", "target", "choices", "metadata"):
        found = _first_unencodable(getattr(sample, name, None), name)
        if found is not None:
            where, text, position = found
            return (  # repr escapes the offending character
                f"{where} holds text that is not valid UTF-8, which Inspect cannot log: {text[position]!r} at "
                f"character {position} of {text[max(0, position - 20) : position + 20]!r} (an undecodable byte or "
                "half of a surrogate pair). Fix: decode the dataset with errors='replace' (or fix its encoding)"
            )
    return None


def _first_unencodable(value: Any, where: str) -> tuple[str, str, int] | None:
    """`(where, text, index)` of the first string in `value` (nested lists, dicts, messages) with a character
    that UTF-8 cannot encode (a lone surrogate), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return where, value, error.start
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _first_unencodable(key, f"{where} key") or _first_unencodable(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _first_unencodable(item, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    dump = getattr(value, "model_dump", None)  # chat messages and their content parts
    return _first_unencodable(dump(), where) if callable(dump) else None


def _writable(value: Any) -> Any:
    """A string with unencodable characters escaped (`\\udce9`); other values unchanged."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(value, str) else value


def _memory_dataset(dataset: Any, samples: list[Any]) -> Any:
    """`samples` as a dataset that keeps `dataset`'s name, location and shuffled flag (what the log records)."""
    from inspect_ai.dataset import MemoryDataset

    return MemoryDataset(
        samples,
        name=getattr(dataset, "name", None),
        location=getattr(dataset, "location", None),
        shuffled=bool(getattr(dataset, "shuffled", False)),
    )


def _failure_summary(log: Any, shown: int = 3) -> str:
    """`task: N of M sample(s) failed: id 3: ValueError: ...` (or the task's own error when it failed whole)."""
    task = _log_task(log)
    error = getattr(log, "error", None)
    if error is not None:
        return f"task {task} failed: {_first_line(getattr(error, 'message', error))}"
    if getattr(log, "invalidated", False):
        return (
            f"task {task}: Inspect marks its log {getattr(log, 'location', None)} invalidated (samples were "
            "invalidated after it was written), so its numbers are not reported"
        )
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
