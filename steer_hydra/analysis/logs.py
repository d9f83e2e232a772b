"""Reading a save_dir: `.eval` logs as one row per sample (`samples_frame`), failed samples, results and cells
rebuilt from the logs, and the configuration records (`config_records`, `arm_names`).

- `samples_frame`: one row per sample, scores joined to sample metadata, read from the `.eval` logs of the cells
  (so a run without metrics, e.g. `score=False`, still gives its samples); a dict-valued score (e.g. a model
  judge's ratings) gives one column per key, named by the key as Inspect names its results (`scorer/key` when
  the key is also a scorer's name); NaN, Inspect's value of an unscored key, stays NaN;
- `task_samples`: one samples frame per (suite, task) of some cells, every scorer (what the job, the sweep and
  the study read);
- `failed_samples`: the samples whose generation or scoring failed, with their first error line;
- `results_from_logs` / `cells_from_logs` (both from `logged_records`): the results and cells frames rebuilt from a
  `save_dir` alone (walked through `store.SaveDir`, the owner of its layout), for all configurations and suites or
  the given `config_ids` and `suites`, whose logs alone are read (the `success` log per task wins; superseded
  partial logs of an interrupted run are ignored);
- `task_result`: one task's result from its log header (metrics, scored and failed counts, location): the form
  run records and cell indexes hold, whether a suite has just run or a save_dir is read back;
- damaged logs: `readable_logs` / `read_log_header` read log headers; an unreadable log (truncated, not a zip, no
  header) is skipped with one warning naming it. Only the evaluation side, holding the cell's lock, moves it aside
  (`move=True`) to `<name>.unreadable`, which Inspect does not list, before Inspect reads the cell's directory, so
  the cell is evaluated again; readers (reports, frames) never move a file another job may be about to write;
- complete logs (`log_complete`): status `success` (or `error` from failed samples only) and not `invalidated`; a
  log with invalidated samples is never read as a cell's result (Inspect's `eval_set` evaluates them again);
- left-out samples (`LEFT_OUT_KEY`): samples a suite could not hand to Inspect (text that is not valid UTF-8) are
  recorded in the header metadata of the task's log and counted as failed, like samples whose generation failed.
- `config_records`: one record per configuration a job evaluated in the save_dir (its arm name and canonical
  controls); `arm_names` maps config_id to arm.

Columns follow `frames.RUN_ID_COLUMNS`. Inspect is imported lazily (only when logs are read).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd

from steer_hydra.analysis.frames import (
    CELL_COLUMNS,
    RUN_ID_COLUMNS,
    SAMPLE_ID_COLUMNS,
    SCORE_LETTERS,
    _select,
    cells_frame,
    results_frame,
)
from steer_hydra.core.identity import derive_trial_seed
from steer_hydra.store import SaveDir

logger = logging.getLogger(__name__)

UNREADABLE_SUFFIX = ".unreadable"  # an unreadable log renamed `<name>.eval.unreadable`: Inspect no longer lists it
LEFT_OUT_KEY = "left_out_samples"  # log header metadata: {task: [{"id": sample id, "error": why}]}
EVALUATED_AGAIN = "its cell is evaluated again."
LEFT_OUT_OF_RESULTS = "its results are left out until its cell is evaluated again (re-run the command that made it)."
# what reading a damaged log raises (Inspect's zip reader: ValueError "EOCD not found"; a zip without header.json:
# KeyError; bad JSON or fields: ValueError); OSError (permissions, I/O) is not damage and propagates
_DAMAGE_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, zipfile.BadZipFile, EOFError, zlib.error)


# ---------------------------------------------------------------------------------------------- samples
_LOG_CACHE_SIZE = 16  # whole logs kept: a suite's tasks for two configurations with room to spare
_log_cache: OrderedDict[tuple[str, int, int, int], Any] = OrderedDict()
_log_cache_lock = threading.Lock()


def _read_eval_log(path: str) -> Any:
    """Read one `.eval` log with its samples (the tests replace this).

    A local log is read once per version of its file and kept (the last `_LOG_CACHE_SIZE`, per process): every job
    of a suite compares against the baseline's logs, and a comparison reads each log for its samples and again for
    its failures. The version is the file's (path, inode, size, modification time), so a log written again is read
    again. Callers only read what it returns."""
    from inspect_ai.log import read_eval_log

    version = _file_version(path)
    if version is None:
        return read_eval_log(path)
    with _log_cache_lock:
        if version in _log_cache:
            _log_cache.move_to_end(version)
            return _log_cache[version]
    log = read_eval_log(path)
    with _log_cache_lock:
        _log_cache[version] = log
        while len(_log_cache) > _LOG_CACHE_SIZE:
            _log_cache.popitem(last=False)
    return log


def _file_version(location: str) -> tuple[str, int, int, int] | None:
    """`(path, inode, size, mtime_ns)` of a local log file; None for a remote location or a file not there."""
    path = _local(location)
    try:
        stat = os.stat(path)
    except OSError:  # remote (s3://...), or gone: read as before
        return None
    return (os.path.abspath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


def clear_log_cache() -> None:
    """Forget every log `_read_eval_log` kept (the tests call it between tests)."""
    with _log_cache_lock:
        _log_cache.clear()


def resolve_log_path(log: str, log_root: str | Path | None) -> str:
    """A relative log location resolved under `log_root`; absolute paths and URIs unchanged."""
    if not log:
        raise ValueError("A results row has no log location; was the run completed?")
    if urlparse(log).scheme not in ("", "file") and not re.match(r"^[A-Za-z]:[\\/]", log):
        return log
    path = Path(log)
    if path.is_absolute() or log_root is None:
        return str(path)
    return str(Path(log_root) / path)


def _score_value(value: Any) -> Any:
    """Numbers, bools and the letters C/I/P/N through `value_to_float`; other values raw."""
    if isinstance(value, (bool, int, float)) or (isinstance(value, str) and value in SCORE_LETTERS):
        from inspect_ai.scorer import value_to_float

        return value_to_float()(value)
    return value


def _sample_score(sample: Any, key: str, log: str) -> Any:
    scores = getattr(sample, "scores", None) or {}
    if key in scores:
        return _score_value(scores[key].value)
    if "/" not in key:  # a key of a dict-valued score, named as Inspect names its results
        for score in scores.values():
            if isinstance(score.value, Mapping) and key in score.value:
                return _score_value(score.value[key])
    scorer, sep, dict_key = key.partition("/")
    if scorer not in scores:
        raise KeyError(f"Scorer {scorer!r} not found in {log} (sample {sample.id}); scorers: {sorted(scores)}.")
    value = scores[scorer].value
    if not sep:
        return _score_value(value)
    if not isinstance(value, Mapping) or dict_key not in value:
        raise KeyError(
            f"Score key {dict_key!r} is absent from scorer {scorer!r} in {log} (sample {sample.id}); "
            f"its value is {value!r}."
        )
    return _score_value(value[dict_key])


def _score_columns(sample: Any) -> dict[str, Any]:
    """Every score of a sample as `{column: value}`: a scorer's value under its name, each key of a dict-valued
    score under the key (`scorer/key` when another scorer has that name)."""
    scores = getattr(sample, "scores", None) or {}
    out: dict[str, Any] = {}
    for name, score in scores.items():
        if isinstance(score.value, Mapping):
            for key, value in score.value.items():
                out[f"{name}/{key}" if key in scores else str(key)] = _score_value(value)
        else:
            out[name] = _score_value(score.value)
    return out


def _input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "\n".join(str(getattr(m, "text", m)) for m in value or [])


def _sort_samples(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    def key(series: pd.Series) -> pd.Series:
        if series.name == "sample_id" and series.map(type).nunique() > 1:
            return series.astype(str)
        return series

    return frame.sort_values(list(by), kind="stable", key=key).reset_index(drop=True)


def _column_values(values: list[Any]) -> pd.Series:
    """Floats become a float column; anything else (None, lists, dicts, strings) is kept raw in an object column."""
    if values and all(isinstance(v, float) for v in values):
        return pd.Series(values, dtype=float)
    return pd.Series(values, dtype=object)


def samples_frame(
    results: pd.DataFrame,
    log_root: str | Path | None,
    *,
    scores: Sequence[str] | str | None,
    metadata_keys: Sequence[str] = (),
    suite: str | None = None,
    task: str | None = None,
    include_text: bool = False,
) -> pd.DataFrame:
    """One row per sample of the selected (suite, task), for every configuration and trial, read from the logs.

    `results` is a results frame or a cells frame (`cells_frame`, `cells_from_logs`): only its cells and their log
    locations are used. Columns: `SAMPLE_ID_COLUMNS` (`arm, config_id, trial_id, seed, trial_seed, suite, task,
    sample_id`), then
    `metadata_keys` (None when a sample lacks one), then the score columns (`"scorer"`, a dict-valued score's key,
    or `"scorer/dictkey"`; `scores=None` takes every score the samples hold, in first-seen order, each key of a
    dict-valued score a column of its own (`_score_columns`), and none for an unscored run), then
    `input` and `completion` with `include_text=True`. A sample that failed (its `error` is set) has None scores.
    Relative log locations resolve under `log_root`.
    """
    if scores is not None:
        scores = [scores] if isinstance(scores, str) else list(scores)
        if not scores:
            raise ValueError("samples_frame needs at least one score key, e.g. scores=['includes'] (or scores=None).")
    selected = _select(results, suite, task)
    cells = selected[list(CELL_COLUMNS)].drop_duplicates(["arm", "config_id", "seed", "trial_id", "suite", "task"])
    rows = []
    found: dict[str, None] = {}
    for cell in cells.itertuples(index=False):
        path = resolve_log_path(cell.log, log_root)
        log = _read_or_skip(_read_eval_log, path, LEFT_OUT_OF_RESULTS)
        for sample in getattr(log, "samples", None) or []:
            metadata = getattr(sample, "metadata", None) or {}
            row: dict[str, Any] = {c: getattr(cell, c) for c in RUN_ID_COLUMNS}
            row.update(suite=cell.suite, task=cell.task, sample_id=sample.id)
            for key in metadata_keys:
                row[key] = metadata.get(key)
            if scores is None:
                for key, value in _score_columns(sample).items():
                    found.setdefault(key)
                    row[key] = value
            for key in scores or ():
                row[key] = _sample_score_or_none(sample, key, path)
            if include_text:
                output = getattr(sample, "output", None)
                row["input"] = _input_text(sample.input)
                row["completion"] = getattr(output, "completion", None)
            rows.append(row)
    score_columns = scores if scores is not None else list(found)
    columns = [*SAMPLE_ID_COLUMNS, *metadata_keys, *score_columns] + (["input", "completion"] if include_text else [])
    data = {c: pd.Series([row[c] for row in rows]) for c in SAMPLE_ID_COLUMNS}
    data.update({c: _column_values([row.get(c) for row in rows]) for c in columns[len(SAMPLE_ID_COLUMNS) :]})
    frame = pd.DataFrame(data, columns=columns)
    return _sort_samples(frame, ["arm", "config_id", "seed", "trial_id", "sample_id"])


def task_samples(cells: pd.DataFrame, log_root: str | Path | None, *, include_text: bool = True) -> list[pd.DataFrame]:
    """One `samples_frame` per (suite, task) of `cells` (a cells or results frame), every scorer its logs hold."""
    keys = cells[["suite", "task"]].drop_duplicates().itertuples(index=False)
    return [
        samples_frame(cells, log_root, scores=None, suite=k.suite, task=k.task, include_text=include_text) for k in keys
    ]


def failed_samples(cells: pd.DataFrame, log_root: str | Path | None) -> pd.DataFrame:
    """One row per sample whose generation or scoring failed in the cells' logs, or that was left out of the run
    (`left_out_samples`): `SAMPLE_ID_COLUMNS` and `error` (the first line of the error message)."""
    rows = []
    cells = cells[list(CELL_COLUMNS)].drop_duplicates(["config_id", "seed", "trial_id", "suite", "task"])
    for cell in cells.itertuples():
        path = resolve_log_path(cell.log, log_root)
        log = _read_or_skip(_read_eval_log, path, LEFT_OUT_OF_RESULTS)
        ids = [getattr(cell, c) for c in RUN_ID_COLUMNS]
        for sample in getattr(log, "samples", None) or []:
            error = getattr(sample, "error", None)
            if error is not None:
                rows.append((*ids, cell.suite, cell.task, sample.id, _first_line(getattr(error, "message", error))))
        for entry in left_out_samples(log):
            rows.append((*ids, cell.suite, cell.task, entry.get("id"), _first_line(entry.get("error", ""))))
    return pd.DataFrame(rows, columns=[*SAMPLE_ID_COLUMNS, "error"])


def _sample_score_or_none(sample: Any, key: str, log: str) -> Any:
    """`_sample_score`, with None where a failed sample has no score for `key`."""
    if getattr(sample, "error", None) is not None and key.partition("/")[0] not in (
        getattr(sample, "scores", None) or {}
    ):
        return None
    return _sample_score(sample, key, log)


def _first_line(message: Any) -> str:
    lines = str(message).strip().splitlines()
    return lines[0] if lines else ""


# ---------------------------------------------------------------------------------------------- damaged logs
def _read_or_skip(read: Callable[[str], Any], location: str, then: str, *, move: bool = False) -> Any | None:
    """`read(location)`, or None when the log at `location` is gone (another process moved it) or unreadable: then
    skipped with one warning (`then` says what follows for the cell), or moved aside when `move` (`move_aside`)."""
    try:
        return read(location)
    except FileNotFoundError:
        return None
    except _DAMAGE_ERRORS as error:
        if move:
            move_aside(location, error, then)
        else:
            logger.warning("Unreadable Inspect log %s (%s) is skipped; %s", _local(location), _reason(error), then)
        return None


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {_first_line(error) or 'no message'}"


def move_aside(location: str, error: BaseException, then: str) -> Path | None:
    """Rename the unreadable log at `location` to `<name>.unreadable` (`.unreadable.2`, ... if taken), where
    Inspect does not list it, with one warning naming the log, the error and `then`; the new path, or None when it
    could not be moved (it is then only skipped, and the warning says so)."""
    reason = _reason(error)
    path = Path(_local(location))
    if urlparse(location).scheme not in ("", "file") and not re.match(r"^[A-Za-z]:[\\/]", location):
        logger.warning(
            "Unreadable Inspect log %s (%s) is skipped; only local logs are moved aside. Fix: move or delete it, "
            "then re-run.",
            location,
            reason,
        )
        return None
    target = path.with_name(path.name + UNREADABLE_SUFFIX)
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}{UNREADABLE_SUFFIX}.{number}")
    try:
        path.rename(target)
    except FileNotFoundError:
        return None  # another reader moved it first (and warned)
    except OSError as exc:
        logger.warning(
            "Unreadable Inspect log %s (%s) is skipped; it could not be moved aside (%s). Fix: move or delete it, "
            "then re-run.",
            path,
            reason,
            exc,
        )
        return None
    logger.warning(
        "Unreadable Inspect log %s (%s): moved aside to %s; %s Delete that file once you no longer need it.",
        path,
        reason,
        target.name,
        then,
    )
    return target


def _local(location: str) -> str:
    """A `file:` URI as a path (what messages show); other locations unchanged."""
    parsed = urlparse(location)
    return url2pathname(parsed.path) if parsed.scheme == "file" else location


def read_log_header(location: str | Path, *, then: str = EVALUATED_AGAIN, move: bool = False) -> Any | None:
    """The header of one log; None when the log is gone or unreadable (skipped with a warning, or moved aside when
    `move`: only under the cell's lock)."""
    from inspect_ai.log import read_eval_log

    return _read_or_skip(lambda path: read_eval_log(path, header_only=True), str(location), then, move=move)


def readable_logs(
    log_dir: str | Path, *, recursive: bool = True, then: str = EVALUATED_AGAIN, move: bool = False
) -> list[tuple[str, Any]]:
    """`(location, header)` of every readable log Inspect lists in `log_dir` (newest first); each unreadable one is
    skipped with a warning, or moved aside when `move` (`move_aside`; only under the cell's lock), so that
    `eval_set` then finds only readable logs there."""
    from inspect_ai.log import list_eval_logs

    if not Path(log_dir).is_dir():
        return []
    found = []
    for info in list_eval_logs(str(log_dir), recursive=recursive):
        header = read_log_header(info.name, then=then, move=move)
        if header is not None:
            found.append((info.name, header))
    return found


def log_complete(header: Any) -> bool:
    """A log that can stand as its task's result: status `success`, or `error` from failed samples only
    (`is_partial`), and no invalidated samples (Inspect's `eval_set` evaluates those again)."""
    if getattr(header, "invalidated", False):
        return False
    return getattr(header, "status", None) == "success" or is_partial(header)


# ---------------------------------------------------------------------------------------------- logs on disk
def _finished_logs(log_dir: Path) -> dict[str, tuple[str, Any]]:
    """`{task: (path, header)}` of the newest finished log per task in one directory: status `success`, or `error`
    from failed samples only (`is_partial`: the rest were scored). A task whose newest finished log holds
    invalidated samples has no result (an older log is superseded, not a fallback); unreadable logs are skipped
    (`readable_logs`)."""
    chosen: dict[str, tuple[str, Any]] = {}
    for location, header in readable_logs(log_dir, recursive=False, then=LEFT_OUT_OF_RESULTS):
        if header.status != "success" and not is_partial(header):
            continue
        task = header.eval.task
        previous = chosen.get(task)
        if previous is None or str(header.eval.created) > str(previous[1].eval.created):
            chosen[task] = (location, header)
    for task, (location, header) in list(chosen.items()):
        if not log_complete(header):
            logger.warning(
                "Inspect log %s holds invalidated samples, so it is not read as its cell's result. Fix: re-run "
                "the command that made it; Inspect evaluates the invalidated samples again.",
                _local(location),
            )
            del chosen[task]
    return chosen


def logged_records(
    save_dir: str | Path,
    names: Mapping[str, str] | None = None,
    *,
    seed: int | None = None,
    config_ids: Iterable[str] | None = None,
    suites: Iterable[str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """`{arm: [record, ...]}` (the form `SteeringEval.run()` returns) rebuilt from a save_dir's logs, with the
    arguments of `results_from_logs`; `results_frame` and `cells_frame` flatten it (a reader needing both reads the
    logs once)."""
    store = SaveDir(save_dir)
    names = store.arm_names() if names is None else names
    by_run: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for logged in store.logged_cells(config_ids, suites):
        tasks: dict[str, Any] = {}
        suite_dir = logged.log_dir
        for log_dir in [suite_dir, *sorted(p for p in suite_dir.iterdir() if p.is_dir())]:
            for task, (location, header) in _finished_logs(log_dir).items():
                tasks[task] = task_result(header, location, store.root)
        if tasks:
            by_run.setdefault((logged.cell.config_id, logged.cell.trial_id), {})[logged.cell.suite] = tasks
    records: dict[str, list[dict[str, Any]]] = {}
    for (config_id, trial), suites in by_run.items():
        records.setdefault(names.get(config_id, config_id), []).append(
            {
                "config_id": config_id,
                "trial_id": trial,
                "seed": seed,
                "trial_seed": None if seed is None else derive_trial_seed(seed, config_id, trial),
                "suites": suites,
            }
        )
    return records


def results_from_logs(
    save_dir: str | Path,
    names: Mapping[str, str] | None = None,
    *,
    seed: int | None = None,
    config_ids: Iterable[str] | None = None,
    suites: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The results frame rebuilt from `save_dir/inspect_logs/<config_id>/trial_<t>/<suite>/` alone.

    Per (config, trial, suite) cell and task, the newest finished log is read (status `success`, or `error` from
    failed samples only); logs left by an interrupted run (status `started`) and superseded logs are ignored.
    `names` maps config_id to the arm (default: `arm_names(save_dir)`, else the config_id); `seed` is the seed the
    save_dir was run with (its trial seeds are derived from it; None: unseeded); `config_ids` keeps only those
    configurations and `suites` only those suites (default: every one in the save_dir; only the kept cells' logs are
    read). Log locations are relative to `save_dir`.
    """
    return results_frame(logged_records(save_dir, names, seed=seed, config_ids=config_ids, suites=suites))


def cells_from_logs(
    save_dir: str | Path,
    names: Mapping[str, str] | None = None,
    *,
    seed: int | None = None,
    config_ids: Iterable[str] | None = None,
    suites: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The cells frame (`cells_frame`) rebuilt from a save_dir's logs, with the arguments of `results_from_logs`."""
    return cells_frame(logged_records(save_dir, names, seed=seed, config_ids=config_ids, suites=suites))


def config_records(save_dir: str | Path) -> dict[str, dict[str, Any]]:
    """`{config_id: record}` of the save_dir's configuration records (`arm`, `arm_name`, `config_id`, `controls`)."""
    return SaveDir(save_dir).config_records()


def arm_names(save_dir: str | Path) -> dict[str, str]:
    """`{config_id: arm}` of every configuration recorded in `save_dir` (`config_records`)."""
    return SaveDir(save_dir).arm_names()


def task_result(log: Any, location: str | None, root: str | Path) -> dict[str, Any]:
    """One task's result from its log (or log header): `{"metrics": {"scorer/metric": value}, "n": completed,
    "failed": failed, "log": location relative to root}`, the form run records and cell indexes hold."""
    results = getattr(log, "results", None)
    metrics = {}
    for score in getattr(results, "scores", None) or []:
        for name, metric in (score.metrics or {}).items():
            metrics[f"{score.name}/{name}"] = metric.value
    return {
        "metrics": metrics,
        "n": int(results.completed_samples) if results is not None else 0,
        "failed": failed_count(log),
        "log": normalize_location(location, root),
    }


def is_partial(log: Any) -> bool:
    """A log that ended `error` only because some samples failed: the task ran to the end and scored the rest."""
    results = getattr(log, "results", None)
    return (
        getattr(log, "status", None) == "error"
        and getattr(log, "error", None) is None
        and results is not None
        and int(results.completed_samples or 0) > 0
    )


def failed_count(log: Any) -> int:
    """Samples of a log's task that ended without a score: total minus completed, plus the samples left out of the
    run (`left_out_samples`)."""
    results = getattr(log, "results", None)
    left_out = len(left_out_samples(log))
    if results is None:
        return left_out
    return max(0, int(results.total_samples or 0) - int(results.completed_samples or 0)) + left_out


def left_out_samples(log: Any) -> list[dict[str, Any]]:
    """`[{"id": sample id, "error": why}]` of the samples of a log's task that its suite left out of the run (text
    that is not valid UTF-8), as recorded in the log header's metadata under `LEFT_OUT_KEY`."""
    spec = getattr(log, "eval", None)
    metadata = getattr(spec, "metadata", None) or {}
    recorded = metadata.get(LEFT_OUT_KEY) if isinstance(metadata, Mapping) else None
    entries = recorded.get(str(getattr(spec, "task", ""))) if isinstance(recorded, Mapping) else None
    return [dict(entry) for entry in entries or [] if isinstance(entry, Mapping)]


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
