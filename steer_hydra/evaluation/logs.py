"""Reading a save_dir: `.eval` logs as one row per sample (`samples_frame`), failed samples, results and cells
rebuilt from the logs, and the configuration records (`config_records`, `arm_names`).

- `samples_frame`: one row per sample, scores joined to sample metadata, read from the `.eval` logs of the cells
  (so a run without metrics, e.g. `score=False`, still gives its samples);
- `task_samples`: one samples frame per (suite, task) of some cells, every scorer (what the job, the sweep and
  the study read);
- `failed_samples`: the samples whose generation or scoring failed, with their first error line;
- `results_from_logs` / `cells_from_logs`: the results and cells frames rebuilt from a `save_dir` alone, for all
  configurations or the given `config_ids` (the `success` log per task wins; superseded partial logs of an
  interrupted run are ignored);
- `task_result`: one task's result from its log header (metrics, scored and failed counts, location): the form
  run records and cell indexes hold, whether a suite has just run or a save_dir is read back;
- `config_records`: `save_dir/configs/<config_id>.json`, one record per configuration a job evaluated there (its
  arm name and canonical controls); `arm_names` maps config_id to arm.

Columns follow `frames.RUN_ID_COLUMNS`. Inspect is imported lazily (only when logs are read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd

from steer_hydra.core.files import read_json
from steer_hydra.core.identity import derive_trial_seed
from steer_hydra.evaluation.frames import (
    CELL_COLUMNS,
    RUN_ID_COLUMNS,
    SAMPLE_ID_COLUMNS,
    SCORE_LETTERS,
    _select,
    cells_frame,
    results_frame,
)

CONFIGS_DIR = "configs"  # save_dir/configs/<config_id>.json: the configuration records


# ---------------------------------------------------------------------------------------------- samples
def _read_eval_log(path: str) -> Any:
    """Read one `.eval` log with its samples (the tests replace this)."""
    from inspect_ai.log import read_eval_log

    return read_eval_log(path)


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
    `metadata_keys` (None when a sample lacks one), then the score columns (`"scorer"` or `"scorer/dictkey"`;
    `scores=None` takes every scorer the samples hold, in first-seen order, and none for an unscored run), then
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
        log = _read_eval_log(path)
        for sample in getattr(log, "samples", None) or []:
            metadata = getattr(sample, "metadata", None) or {}
            row: dict[str, Any] = {c: getattr(cell, c) for c in RUN_ID_COLUMNS}
            row.update(suite=cell.suite, task=cell.task, sample_id=sample.id)
            for key in metadata_keys:
                row[key] = metadata.get(key)
            for key in scores if scores is not None else list(getattr(sample, "scores", None) or {}):
                found.setdefault(key)
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
    """One row per sample whose generation or scoring failed in the cells' logs: `SAMPLE_ID_COLUMNS` and `error`
    (the first line of Inspect's error message)."""
    rows = []
    cells = cells[list(CELL_COLUMNS)].drop_duplicates(["config_id", "seed", "trial_id", "suite", "task"])
    for cell in cells.itertuples():
        log = _read_eval_log(resolve_log_path(cell.log, log_root))
        for sample in getattr(log, "samples", None) or []:
            error = getattr(sample, "error", None)
            if error is not None:
                message = str(getattr(error, "message", error)).strip().splitlines()
                ids = [getattr(cell, c) for c in RUN_ID_COLUMNS]
                rows.append((*ids, cell.suite, cell.task, sample.id, (message or [""])[0]))
    return pd.DataFrame(rows, columns=[*SAMPLE_ID_COLUMNS, "error"])


def _sample_score_or_none(sample: Any, key: str, log: str) -> Any:
    """`_sample_score`, with None where a failed sample has no score for `key`."""
    if getattr(sample, "error", None) is not None and key.partition("/")[0] not in (
        getattr(sample, "scores", None) or {}
    ):
        return None
    return _sample_score(sample, key, log)


# ---------------------------------------------------------------------------------------------- logs on disk
def _finished_logs(log_dir: Path) -> dict[str, tuple[str, Any]]:
    """`{task: (path, header)}` of the newest finished log per task in one directory: status `success`, or `error`
    from failed samples only (`is_partial`: the rest were scored)."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    chosen: dict[str, tuple[str, Any]] = {}
    for info in list_eval_logs(str(log_dir), recursive=False):
        header = read_eval_log(info, header_only=True)
        if header.status != "success" and not is_partial(header):
            continue
        task = header.eval.task
        previous = chosen.get(task)
        if previous is None or str(header.eval.created) > str(previous[1].eval.created):
            chosen[task] = (info.name, header)
    return chosen


def _records_from_logs(
    save_dir: Path, names: Mapping[str, str] | None, seed: int | None, config_ids: Iterable[str] | None
) -> dict[str, list[dict[str, Any]]]:
    root = save_dir / "inspect_logs"
    names = arm_names(save_dir) if names is None else names
    wanted = None if config_ids is None else set(config_ids)
    records: dict[str, list[dict[str, Any]]] = {}
    for config_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if wanted is not None and config_dir.name not in wanted:
            continue
        for trial_dir in sorted(p for p in config_dir.iterdir() if p.is_dir() and p.name.startswith("trial_")):
            trial = int(trial_dir.name.removeprefix("trial_"))
            suites: dict[str, dict[str, Any]] = {}
            for suite_dir in sorted(p for p in trial_dir.iterdir() if p.is_dir()):
                tasks: dict[str, Any] = {}
                for log_dir in [suite_dir, *sorted(p for p in suite_dir.iterdir() if p.is_dir())]:
                    for task, (location, header) in _finished_logs(log_dir).items():
                        tasks[task] = task_result(header, location, save_dir)
                if tasks:
                    suites[suite_dir.name] = tasks
            if suites:
                name = names.get(config_dir.name, config_dir.name)
                records.setdefault(name, []).append(
                    {
                        "config_id": config_dir.name,
                        "trial_id": trial,
                        "seed": seed,
                        "trial_seed": None if seed is None else derive_trial_seed(seed, config_dir.name, trial),
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
) -> pd.DataFrame:
    """The results frame rebuilt from `save_dir/inspect_logs/<config_id>/trial_<t>/<suite>/` alone.

    Per (config, trial, suite) cell and task, the newest finished log is read (status `success`, or `error` from
    failed samples only); logs left by an interrupted run (status `started`) and superseded logs are ignored.
    `names` maps config_id to the arm (default: `arm_names(save_dir)`, else the config_id); `seed` is the seed the
    save_dir was run with (its trial seeds are derived from it; None: unseeded); `config_ids` keeps only those
    configurations (default: every one in the save_dir). Log locations are relative to `save_dir`.
    """
    return results_frame(_records_from_logs(Path(save_dir), names, seed, config_ids))


def cells_from_logs(
    save_dir: str | Path,
    names: Mapping[str, str] | None = None,
    *,
    seed: int | None = None,
    config_ids: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The cells frame (`cells_frame`) rebuilt from a save_dir's logs, with the arguments of `results_from_logs`."""
    return cells_frame(_records_from_logs(Path(save_dir), names, seed, config_ids))


def config_records(save_dir: str | Path) -> dict[str, dict[str, Any]]:
    """`{config_id: record}` of `save_dir/configs/*.json` (`arm`, `arm_name`, `config_id`, `controls`)."""
    folder = Path(save_dir) / CONFIGS_DIR
    records = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_json(path)
        records[record["config_id"]] = record
    return records


def arm_names(save_dir: str | Path) -> dict[str, str]:
    """`{config_id: arm}` of every configuration recorded in `save_dir` (`config_records`)."""
    return {config_id: record["arm"] for config_id, record in config_records(save_dir).items()}


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
    """Samples of a log that ended without a score (total minus completed)."""
    results = getattr(log, "results", None)
    if results is None:
        return 0
    return max(0, int(results.total_samples or 0) - int(results.completed_samples or 0))


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
