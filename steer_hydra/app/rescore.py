"""Judge finished concept-steering logs with a model judge without generating again, then rewrite the tables.

`python -m steer_hydra.rescore <dir> judge=<model> [limit=N] [key=value ...]` (`main`), or `rescore(dir, judge)` from
Python.

What it reads: `<dir>` is
- a sweep directory (holds `multirun.yaml`): the save_dirs its jobs (`*/job_record.json`) evaluated into, their
  configurations and the baselines they compare with;
- a job directory (holds `job_record.json`): its save_dir, its configuration and its baseline;
- a save_dir (holds `inspect_logs/`): every configuration in it.
Of those cells it takes the finished logs (`logs.cells_from_logs`: the newest finished log per cell) of the tasks
the judge scores (`tasks.judge.JUDGED_TASKS`).

How it runs, per log, under its cell's lock (the one a job evaluating that cell holds): read the log; drop the
judge's earlier scores (`concept_judge`: sample scores, results, reductions); score the samples that did not fail
with `concept_judge` through Inspect's `score_async`, the judge bound to the "judge" role and the model under test
replaced by Inspect's `none` model, which refuses to generate (nothing is generated again); restore the header's
model roles (they name what made the log, and Inspect's `eval_set` identity includes them, so a later job still
resumes it); write the log to a temporary file inside the save_dir (`SaveDir.scratch_file`) and move it over the
old one (a reader
sees the old log or the new one, never half of one). The cell's index (`save_dir/cells/...json`), when it names
that log, takes the new metrics. Judge calls go through Inspect's generate cache (see `tasks.judge`): judging an
unchanged log again makes no judge call.

Then the tables: each job directory concerned (the target itself, the sweep's jobs, or for a save_dir the jobs
under its experiment folder, `<experiment>/runs/*/` and `<experiment>/multiruns/*/*/`, that evaluated into it) gets
the results path's files rewritten (`compare.write_files`) and its job record's metrics; each sweep among them its
aggregate (`callbacks.aggregate_sweep_dir`, without W&B). W&B runs are not updated.

Agreement: per criterion (concept, instruction, fluency, harmonic), Spearman's rank correlation between the rule
score and the judge's over the judged samples (`stats.agreement`), written as `agreement.csv` beside each rewritten
set of tables (and into the save_dir for a save_dir) and returned.

Limits and progress: `limit=N` judges only the first N samples of each log that did not fail (try a judge on a
few samples first); `judge_options.max_tokens` is the judge's token budget per reply, and a judge reached over the
network gets `judge_options.attempt_timeout`, `max_retries` and `timeout` on every call. Progress is a bar on a
terminal and, in a pipe or a file, one line at most every `PROGRESS_EVERY` seconds (and at the end).

Errors name what to do, in one line and before any model loads: a directory that is none of the three, or holds no
finished log of a judged task (the message says where it looked); samples without `concept_description`; a judge
that cannot be made or reached (`app.judge.judge_problems`, bounded). The console goes through the app's redaction
(secret-named overrides, secret environment values, URL passwords), as the app's does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from steer_hydra.analysis.compare import compare, write_files
from steer_hydra.analysis.logs import cells_from_logs, resolve_log_path, task_result, task_samples
from steer_hydra.analysis.stats import AGREEMENT_COLUMNS, agreement
from steer_hydra.app.judge import JudgeOptions, judge_as_model, judge_problems
from steer_hydra.app.records import JOB_RECORD, JobRecord
from steer_hydra.app.results import summary_metrics
from steer_hydra.core.files import write_csv
from steer_hydra.store import Cell, SaveDir
from steer_hydra.tasks.judge import JUDGE_ROLE, JUDGED_TASKS, RULE_PAIRS, SCORER_NAME

logger = logging.getLogger(__name__)

MULTIRUN_FILE = "multirun.yaml"
AGREEMENT_FILE = "agreement.csv"
PROGRESS_EVERY = 10.0  # seconds between two progress lines in a pipe


class RescoreError(ValueError):
    """Nothing to rescore, or logs the judge cannot read; the message says where it looked and the fix."""


@dataclass
class Target:
    """What one rescore covers: `{save_dir: config_ids (None: all)}`, the job directories whose tables it rewrites,
    the sweep directories whose aggregates it rewrites, and where the overall agreement goes."""

    save_dirs: dict[Path, set[str] | None]
    jobs: list[Path] = field(default_factory=list)
    sweeps: list[Path] = field(default_factory=list)
    agreement_dirs: list[Path] = field(default_factory=list)


@dataclass
class RescoreResult:
    """What a rescore did: the logs it judged, the samples judged, every file it wrote, the overall agreement."""

    logs: list[Path]
    samples: int
    files: list[Path]
    agreement: pd.DataFrame


# ---------------------------------------------------------------------------------------------- targets
def _records_in(folders: Sequence[Path]) -> list[tuple[Path, JobRecord]]:
    return [(folder, JobRecord.read(folder)) for folder in folders if JobRecord.exists(folder)]


def find_target(directory: str | Path) -> Target:
    """What `directory` (a sweep directory, a job directory or a save_dir) covers; `RescoreError` when it is none."""
    directory = Path(directory).absolute()
    if (directory / MULTIRUN_FILE).is_file():
        jobs = _records_in(sorted(p.parent for p in directory.glob(f"*/{JOB_RECORD}")))
        if not jobs:
            raise RescoreError(
                f"Sweep {directory} holds no finished job ({directory}/*/{JOB_RECORD}); nothing to rescore. Fix: "
                "complete its jobs (python -m steer_hydra.aggregate names the missing ones), or pass a save_dir."
            )
        save_dirs: dict[Path, set[str] | None] = {}
        for _, record in jobs:
            ids = save_dirs.setdefault(Path(record.save_dir), set())
            assert ids is not None
            ids.update(record.config_ids)
        return Target(save_dirs, [d for d, _ in jobs], [directory], [directory / "aggregate"])
    if JobRecord.exists(directory):
        record = JobRecord.read(directory)
        return Target({Path(record.save_dir): record.config_ids}, [directory], [], [])
    if SaveDir(directory).holds_logs():
        jobs = _jobs_of_save_dir(directory)
        sweeps = sorted({job.parent for job in jobs if (job.parent / MULTIRUN_FILE).is_file()})
        return Target({directory: None}, jobs, sweeps, [directory, *(s / "aggregate" for s in sweeps)])
    raise RescoreError(
        f"{directory} is not a save_dir (no {SaveDir(directory).logs_root}), a job directory (no "
        f"{directory / JOB_RECORD}) or a sweep directory (no {directory / MULTIRUN_FILE}). Fix: pass the save_dir "
        "(<output_root>/<experiment>/<model>/seed_<seed>), the job's or the sweep's output directory."
    )


def _jobs_of_save_dir(save_dir: Path) -> list[Path]:
    """The job directories under the save_dir's experiment folder (`runs/*/`, `multiruns/*/*/`) that evaluated into
    it, in path order."""
    if len(save_dir.parents) < 2:
        return []
    experiment = save_dir.parents[1]
    folders = sorted(
        {
            p.parent
            for pattern in (f"runs/*/{JOB_RECORD}", f"multiruns/*/*/{JOB_RECORD}")
            for p in experiment.glob(pattern)
        }
    )
    return [d for d, record in _records_in(folders) if Path(record.save_dir).absolute() == save_dir]


@dataclass(frozen=True)
class JudgedLog:
    """One finished log of a judged task and the cell it belongs to."""

    save_dir: Path
    path: Path
    location: str  # as the results frame holds it (relative to the save_dir)
    config_id: str
    trial_id: int
    suite: str
    task: str

    @property
    def cell(self) -> Cell:
        return Cell(self.config_id, self.trial_id, self.suite)


def judged_logs(target: Target) -> list[JudgedLog]:
    """The finished logs of the judged tasks in the target's cells; `RescoreError` saying where it looked when there
    are none."""
    found: dict[Path, JudgedLog] = {}
    for save_dir, config_ids in target.save_dirs.items():
        cells = cells_from_logs(save_dir, config_ids=config_ids)
        for cell in cells[cells["task"].isin(JUDGED_TASKS)].itertuples(index=False):
            path = Path(resolve_log_path(cell.log, save_dir))
            found.setdefault(
                path, JudgedLog(save_dir, path, cell.log, cell.config_id, int(cell.trial_id), cell.suite, cell.task)
            )
    if not found:
        looked = "; ".join(
            f"{SaveDir(save_dir).logs_root}" + ("" if ids is None else f" (configurations {sorted(ids)})")
            for save_dir, ids in target.save_dirs.items()
        )
        raise RescoreError(
            f"No finished log of {', '.join(JUDGED_TASKS)} found; looked in {looked}. Fix: run the concept-steering "
            "suite into that save_dir first (python -m steer_hydra suite=concept_steering ...), or pass the save_dir "
            "that holds its logs."
        )
    return sorted(found.values(), key=lambda log: str(log.path))


# ---------------------------------------------------------------------------------------------- judging
def _read(path: Path) -> Any:
    from inspect_ai.log import read_eval_log

    return read_eval_log(str(path))


def _scorable(log: Any, limit: int | None = None) -> list[Any]:
    """The samples the judge scores: those that did not fail (the first `limit` of them)."""
    samples = [sample for sample in log.samples or [] if getattr(sample, "error", None) is None]
    return samples if limit is None else samples[:limit]


def check_judgeable(logs: Sequence[JudgedLog], limit: int | None = None) -> int:
    """The number of samples to judge; `RescoreError` naming the first log whose samples lack the concept's
    description (before any judge call)."""
    total = 0
    for entry in logs:
        log = _read(entry.path)
        samples = _scorable(log, limit)
        lacking = [s.id for s in samples if not str((s.metadata or {}).get("concept_description") or "").strip()]
        if lacking:
            raise RescoreError(
                f"{entry.path}: {len(lacking)} sample(s) (e.g. {lacking[:3]}) have no 'concept_description' in their "
                "metadata, which the judge is shown; the log was made by a version of the concept-steering task that "
                "did not record it. Fix: evaluate the suite again into a new save_dir (experiment_name=<new name>) "
                "and rescore that."
            )
        total += len(samples)
    return total


def _drop_judge(log: Any) -> None:
    """Remove the judge's earlier scores from a log (sample scores, results, reductions, scorer list)."""
    for sample in log.samples or []:
        if sample.scores and SCORER_NAME in sample.scores:
            sample.scores = {name: score for name, score in sample.scores.items() if name != SCORER_NAME}
    if log.results is not None:
        log.results.scores = [s for s in log.results.scores if s.scorer != SCORER_NAME]
    if log.reductions:
        log.reductions = [r for r in log.reductions if r.scorer != SCORER_NAME]
    if log.eval.scorers:
        log.eval.scorers = [s for s in log.eval.scorers if s.name.split("/")[-1] != SCORER_NAME]


async def _judge_log(
    log: Any, judge: Any, bar: Any, scorer_args: dict[str, Any] | None = None, limit: int | None = None
) -> None:
    """Append `concept_judge` scores to the log's samples that did not fail (the first `limit`; in place)."""
    from inspect_ai import score_async
    from inspect_ai.model import get_model

    from steer_hydra.tasks.judge import concept_judge

    everything, scorable = list(log.samples or []), _scorable(log, limit)
    if not scorable:
        return

    @contextlib.asynccontextmanager
    async def sample_at(index: int) -> Any:
        yield scorable[index]
        if bar is not None:
            bar.update(1)

    roles, total = log.eval.model_roles, log.results.total_samples
    log.eval.model_roles = None  # rebuilt from the header otherwise: a steer_hydra judge there has no pipeline
    log.results.total_samples = len(scorable)
    log.samples = None
    try:
        await score_async(
            log,
            [concept_judge(**(scorer_args or {}))],
            model=get_model("none"),  # the model under test: refuses to generate
            model_roles={JUDGE_ROLE: judge},
            action="append",
            display="none",
            copy=False,
            samples=sample_at,
        )
    finally:
        log.eval.model_roles, log.results.total_samples, log.samples = roles, total, everything


def _write_over(log: Any, entry: JudgedLog) -> None:
    """Write `log` to a scratch file in the save_dir and move it over `entry.path` (atomic on one filesystem)."""
    from inspect_ai.log import write_eval_log

    with SaveDir(entry.save_dir).scratch_file(entry.path.suffix) as temp:
        write_eval_log(log, str(temp))
        os.replace(temp, entry.path)


def judge_logs(
    logs: Sequence[JudgedLog],
    judge: Any,
    *,
    bar: Any = None,
    scorer_args: dict[str, Any] | None = None,
    limit: int | None = None,
) -> None:
    """Judge each log in place (see the module docstring)."""
    import anyio

    for entry in logs:
        store = SaveDir(entry.save_dir)
        with store.locked_cell(entry.cell):  # the lock a job evaluating that cell holds
            log = _read(entry.path)
            _drop_judge(log)
            anyio.run(_judge_log, log, judge, bar, scorer_args, limit)
            _write_over(log, entry)
            # the cell's index, when it names this log, takes the new metrics (a re-run then reports them)
            store.update_indexed_metrics(
                entry.cell, entry.task, entry.location, task_result(log, None, store.root)["metrics"]
            )
        logger.info("Judged %s", entry.path)


# ---------------------------------------------------------------------------------------------- tables
def agreement_table(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """`stats.agreement` of the rule scores and the judge's, per (suite, task) of the judged tasks' sample frames."""
    parts = []
    for frame in frames:
        if frame.empty or frame["task"].iloc[0] not in JUDGED_TASKS:
            continue
        table = agreement(frame, RULE_PAIRS)
        parts.append(table.assign(suite=frame["suite"].iloc[0], task=frame["task"].iloc[0]))
    columns = ["suite", "task", *AGREEMENT_COLUMNS]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def rewrite_job(job_dir: Path) -> dict[str, Path]:
    """Rewrite a job's tables from the save_dir's logs, as the job wrote them (`compare.write_files`), its job
    record's metrics and files, and its `agreement.csv`. Returns the files written."""
    record = JobRecord.read(job_dir)
    comparison = compare(record.cells())
    files = write_files(comparison, job_dir, own_config_id=record.config_id)
    own = comparison.results[comparison.results["config_id"] == record.config_id]
    files["agreement"] = job_dir / AGREEMENT_FILE
    write_csv(agreement_table(comparison.frames), files["agreement"])
    record.metrics = summary_metrics(own)
    record.files = {**record.files, **{name: str(path) for name, path in files.items()}}
    record.write(job_dir)
    return files


def rewrite_sweep(sweep_dir: Path) -> list[Path]:
    """Re-aggregate a sweep (no W&B) and write its `aggregate/agreement.csv`; the files written."""
    from omegaconf import OmegaConf

    from steer_hydra.app.callbacks import AGGREGATE_DIR, aggregate_sweep_dir

    out = aggregate_sweep_dir(sweep_dir, OmegaConf.load(sweep_dir / MULTIRUN_FILE), track=False)
    if out is None:
        return []
    path = sweep_dir / AGGREGATE_DIR / AGREEMENT_FILE
    write_csv(agreement_table(out["comparison"].frames), path)
    return [*map(Path, out["paths"].values()), path]


def _overall_agreement(logs: Sequence[JudgedLog]) -> pd.DataFrame:
    """The agreement over every judged sample of the rescore, per (suite, task)."""
    frames = []
    for save_dir in dict.fromkeys(entry.save_dir for entry in logs):
        cells = cells_from_logs(save_dir)
        cells = cells[cells["log"].isin([e.location for e in logs if e.save_dir == save_dir])]
        frames += task_samples(cells, save_dir, include_text=False)
    by_task: dict[tuple[str, str], list[pd.DataFrame]] = {}
    for frame in frames:
        if not frame.empty:
            by_task.setdefault((frame["suite"].iloc[0], frame["task"].iloc[0]), []).append(frame)
    return agreement_table([pd.concat(parts, ignore_index=True) for parts in by_task.values()])


class ProgressLines:
    """Progress for a pipe or a file: `judging: k/N sample(s) ..., ETA ...` logged at most every `every` seconds
    and when the last sample is judged (a bar's `update(n)`)."""

    def __init__(self, total: int, every: float = PROGRESS_EVERY) -> None:
        self.total, self.every, self.done = total, every, 0
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.done < self.total and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        logger.info("judging: %d/%d sample(s) in %.0fs, ETA %.0fs", self.done, self.total, elapsed, eta)

    def close(self) -> None:
        """Nothing to close (a bar's interface)."""


@contextlib.contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Any]:
    """A samples bar on a terminal, progress lines elsewhere (none when not `enabled`)."""
    from steer_hydra.app.console import is_tty

    if not enabled:
        yield None
        return
    if not is_tty():
        yield ProgressLines(total, PROGRESS_EVERY)
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="judging", unit="sample", dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


def rescore(
    directory: str | Path,
    judge: Any,
    *,
    progress: bool = False,
    options: JudgeOptions | None = None,
    limit: int | None = None,
) -> RescoreResult:
    """Judge the finished concept-steering logs `directory` covers and rewrite its tables (module docstring).

    `judge`: a `judge=` string (an Inspect model string, `steer_hydra/<model option>` or `steer_hydra/scripted`) or
    an Inspect `Model`. `progress`: a samples bar on a terminal, progress lines in a pipe. `options`: the judge's
    token budget and call bounds (`judge_options`). `limit`: judge the first `limit` samples of each log only.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise RescoreError(f"limit={limit!r} must be an integer >= 1. Fix: limit=N (or leave it out for all samples).")
    options = options or JudgeOptions()
    target = find_target(directory)
    logs = judged_logs(target)
    total = check_judgeable(logs, limit)
    model, release = judge_as_model(judge, options)
    scorer_args = options.scorer_args(judge if isinstance(judge, str) else None)
    try:
        with _progress(progress, total) as bar:
            judge_logs(logs, model, bar=bar, scorer_args=scorer_args, limit=limit)
    finally:
        release()
    written: list[Path] = []
    for job_dir in target.jobs:
        written += rewrite_job(job_dir).values()
    for sweep_dir in target.sweeps:
        written += rewrite_sweep(sweep_dir)
    overall = _overall_agreement(logs)
    for folder in target.agreement_dirs:
        if folder.is_dir() and folder / AGREEMENT_FILE not in written:
            write_csv(overall, folder / AGREEMENT_FILE)
            written.append(folder / AGREEMENT_FILE)
    return RescoreResult([entry.path for entry in logs], total, written, overall)


# ---------------------------------------------------------------------------------------------- command line
USAGE = """usage: python -m steer_hydra.rescore <dir> judge=<model> [limit=N] [key=value ...]

Judge finished concept-steering logs with a model judge, without generating again, then rewrite the tables.

  <dir>          a save_dir (holds inspect_logs/), a job's output directory (job_record.json) or a sweep
                 directory (multirun.yaml)
  judge=<model>  a served model: vllm/<model> or openai/<model> with judge_options.base_url=http://HOST:PORT/v1
                 (or VLLM_BASE_URL / OPENAI_BASE_URL); openai/gpt-4o-mini; steer_hydra/<model option>
                 (e.g. steer_hydra/smollm2, in this process); steer_hydra/scripted (offline, ratings from a
                 digest: for trying the path out)
  limit=N        judge only the first N samples of each log
  key=value      other overrides of the app's config: judge_options.max_tokens=N (the judge's token budget per
                 reply), judge_options.attempt_timeout / max_retries / timeout (the bounds of each call to a
                 network judge), progress=false, hydra.searchpath=[...] for your own model options

Writes the judged logs back in place, the tables (results.csv, samples.csv, results_table.csv, ...) of the jobs
and sweeps concerned, and agreement.csv (Spearman between each rule score and the judge's)."""


def parse_args(argv: Sequence[str]) -> tuple[Path, list[str], int | None]:
    """`(directory, overrides, limit)`; `SystemExit` with the usage for `--help` or a missing directory or judge."""
    args = list(argv)
    if not args or any(a in ("-h", "--help") for a in args):
        print(USAGE)
        raise SystemExit(0 if args else 2)
    positional = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a and not a.startswith("limit=")]
    limits = [a.partition("=")[2] for a in args if a.startswith("limit=")]
    if len(positional) != 1:
        raise SystemExit(f"steer_hydra.rescore: give one directory; got {positional}.\n\n{USAGE}")
    if not any(o.lstrip("+").startswith("judge=") for o in overrides):
        raise SystemExit(f"steer_hydra.rescore: judge=<model> is required.\n\n{USAGE}")
    limit = None
    if limits:
        if not limits[-1].isdigit() or int(limits[-1]) < 1:
            raise SystemExit(f"steer_hydra.rescore: limit={limits[-1]} must be an integer >= 1.\n\n{USAGE}")
        limit = int(limits[-1])
    return Path(positional[0]), overrides, limit


def compose_settings(overrides: Sequence[str]) -> tuple[str, bool, JudgeOptions]:
    """`(judge, progress, judge options)` from the app's config composed with `overrides` (Hydra validates them)."""
    from steer_hydra.app.compose import compose_config, to_plain

    cfg = compose_config(overrides, standalone=True)
    if not cfg.judge:
        raise RescoreError(f"judge is empty. Fix: judge=<model>.\n\n{USAGE}")
    return str(cfg.judge), bool(cfg.progress), JudgeOptions.from_config(to_plain(cfg.judge_options))


def main(argv: Sequence[str] | None = None) -> int:
    """The command: exit status 0 when every log was judged and the tables rewritten, 2 on bad input, 1 when
    judging failed (the logs judged before stay judged; a re-run judges the rest, cached replies cost nothing).

    Everything it prints goes through the app's redaction (`Redactor` of its arguments and the environment)."""
    from steer_hydra.app.redaction import install_log_redaction, redacted_console
    from steer_hydra.app.secrets import Redactor

    args = list(sys.argv[1:] if argv is None else argv)
    redactor = Redactor(args)
    install_log_redaction(redactor)
    with redacted_console(redactor):
        logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")
        return _main(args)


def _main(args: list[str]) -> int:
    from hydra.errors import HydraException

    directory, overrides, limit = parse_args(args)
    try:
        judge, progress, options = compose_settings(overrides)
        problems = judge_problems(judge, options)
        if problems:
            raise RescoreError(" ".join(problems))
        result = rescore(directory, judge, progress=progress, options=options, limit=limit)
    except (RescoreError, HydraException, ValueError) as error:
        print(f"steer_hydra.rescore: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - a judge call that failed past its bounds: one line, not a traceback
        print(
            f"steer_hydra.rescore: judging failed ({type(error).__name__}: {' '.join(str(error).split())[:500]}). "
            "The logs judged before it stay judged. Fix: check the judge (judge_options.attempt_timeout, max_retries "
            "and timeout bound each call), then re-run the command; replies already given come from the cache.",
            file=sys.stderr,
        )
        return 1
    shown = result.agreement.copy()
    shown["spearman"] = shown["spearman"].map(lambda v: f"{v:.3f}" if pd.notna(v) else "nan")
    print(f"\nJudged {result.samples} sample(s) in {len(result.logs)} log(s) with judge={judge}.")
    print("\nAgreement of the rule scores and the judge (Spearman over samples):")
    print(shown.to_string(index=False) if not shown.empty else "(no sample was judged)")
    folders = sorted({str(path.parent) for path in result.files})
    if folders:
        print("\nFiles written in:\n" + "\n".join(f"  {folder}" for folder in folders))
    return 0


__all__ = [
    "ProgressLines",
    "RescoreError",
    "RescoreResult",
    "agreement_table",
    "find_target",
    "judged_logs",
    "main",
    "rescore",
    "rewrite_job",
    "rewrite_sweep",
]
