"""W&B tracking: init (offline unless asked for online), summary, tables, images, artifacts, finished; `wandb_run`
is the one place a job, a sweep summary or a study opens a run from the app config.

Every call is guarded: a W&B failure (unwritable dir, init error, upload error) logs a warning and turns the
tracker into a no-op, so the evaluation results on disk are never lost because of tracking.

Mode: `auto` (the default) is offline unless `WANDB_MODE` says otherwise; an API key in the environment or in
netrc does not switch it online: ask with `logger.mode=online`. An online init that fails (no network, a bad
key, a server that does not answer) gives up after `init_timeout` seconds and falls back to an offline run,
with a warning that says how to upload it (`wandb sync`).

Secrets: W&B records the command line (`sys.argv`) in its run metadata; `start()` hands it a copy with the
values of secret-named overrides (`+api_token=...`) and of secret env vars replaced by `***`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from steer_hydra.app.compose import to_plain
from steer_hydra.app.secrets import Redactor, redact

logger = logging.getLogger(__name__)

MODES = ("auto", "online", "offline", "disabled")
DEFAULT_INIT_TIMEOUT = 30.0  # seconds an online init may take before falling back to offline
SECTIONS = ("delta", "delta_ci_low", "delta_ci_high", "plots", "tables", "pages")


def wandb_key(section: str | None, *parts: Any) -> str:
    """The one builder of W&B keys, the same in job and sweep runs.

    Metrics: `wandb_key(None, suite, task, scorer, metric)` -> `<suite>/<task>/<scorer>/<metric>`; paired deltas
    and their 95% CI bounds: `wandb_key("delta" | "delta_ci_low" | "delta_ci_high", suite, task, scorer, metric)`;
    media: `wandb_key("plots" | "tables" | "pages", name)`. A part's own `/` (a registry task name such as
    `steer_hydra/mcqa`) becomes `.`, so every key has a fixed number of parts.
    """
    if section is not None and section not in SECTIONS:
        raise ValueError(f"wandb_key: section must be None or one of {SECTIONS}; got {section!r}.")
    if not parts:
        raise ValueError("wandb_key needs at least one part.")
    cleaned = [str(part).replace("/", ".") for part in parts]
    return "/".join([section, *cleaned] if section else cleaned)


def resolve_mode(mode: str | None) -> str:
    """`auto` means offline unless `WANDB_MODE` names a mode; WANDB_MODE wins over every mode (tests set it)."""
    env_mode = os.environ.get("WANDB_MODE")
    if env_mode in ("online", "offline", "disabled", "dryrun"):
        return "offline" if env_mode == "dryrun" else env_mode
    mode = mode or "auto"
    if mode not in MODES:
        raise ValueError(f"logger.mode must be one of {MODES}; got {mode!r}.")
    return "offline" if mode == "auto" else mode


@contextlib.contextmanager
def init_environment(init_timeout: float) -> Iterator[None]:
    """For one `wandb.init`: `sys.argv` with secret override values replaced (W&B records the command line at
    init), `WANDB_INIT_TIMEOUT` set, and an empty `WANDB_MODE` (which wandb 0.31 rejects) unset."""
    saved = {name: os.environ.get(name) for name in ("WANDB_INIT_TIMEOUT", "WANDB_MODE")}
    original = sys.argv
    sys.argv = Redactor(original[1:]).argv(original)
    os.environ["WANDB_INIT_TIMEOUT"] = f"{init_timeout:g}"
    if saved["WANDB_MODE"] == "":
        del os.environ["WANDB_MODE"]
    try:
        yield
    finally:
        sys.argv = original
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Tracker:
    """One W&B run. Construct, `start()`, log, `finish()`; every method is safe after a failure."""

    def __init__(
        self,
        *,
        project: str,
        entity: str | None,
        mode: str | None,
        directory: str | os.PathLike,
        name: str | None = None,
        group: str | None = None,
        job_type: str | None = None,
        tags: Sequence[str] = (),
        config: Mapping[str, Any] | None = None,
        init_timeout: float | None = None,
    ) -> None:
        self.init_kwargs = {
            "project": project,
            "entity": entity,
            "dir": str(directory),
            "name": name,
            "group": group,
            "job_type": job_type,
            "tags": [str(t)[:64] for t in tags],
            "config": dict(config or {}),
            "reinit": "finish_previous",
        }
        self.mode = mode
        if init_timeout is None:  # the job hands its whole (redacted) config: use its logger.init_timeout
            init_timeout = ((config or {}).get("logger") or {}).get("init_timeout")
        self.init_timeout = float(init_timeout if init_timeout is not None else DEFAULT_INIT_TIMEOUT)
        self.fell_back_offline = False
        self.run: Any = None
        self.logged_summary: dict[str, Any] = {}

    @classmethod
    def from_logger(cls, logger_cfg: Mapping[str, Any], *, directory: str | os.PathLike, **run: Any) -> Tracker:
        """A tracker from the `logger` config group (project, entity, mode, init_timeout) plus the run's fields
        (`name`, `group`, `job_type`, `tags`, `config`): the one place a logger config becomes a W&B run."""
        return cls(
            project=logger_cfg["project"],
            entity=logger_cfg.get("entity"),
            mode=logger_cfg.get("mode"),
            directory=directory,
            init_timeout=logger_cfg.get("init_timeout"),
            **run,
        )

    @property
    def active(self) -> bool:
        return self.run is not None

    @property
    def run_id(self) -> str | None:
        """The W&B run id (None before `start()` or after a failed init)."""
        return getattr(self.run, "id", None)

    def where(self) -> str | None:
        """Where the run can be seen: its URL online, else its offline folder and the upload command.

        W&B's own banner is silenced (`Settings(silent=True)`), so the job's report prints this line instead.
        """
        run = self.run
        if run is None:
            return None
        if run.settings.mode == "offline":
            return f"W&B offline run; upload: wandb sync {Path(run.dir).parent}"
        return f"W&B run {getattr(run, 'url', None) or run.id}"

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as error:  # tracking must never take the results down with it
            warnings.warn(f"W&B {what} failed ({type(error).__name__}: {error}); results stay on disk.", stacklevel=3)
            logger.warning("W&B %s failed: %s", what, error)
            return None

    def start(self) -> Tracker:
        self.run = self._guard("init", self._init)
        if self.run is not None:
            _silence_terminal()
        return self

    def _init(self) -> Any:
        import wandb

        mode = resolve_mode(self.mode)
        Path(self.init_kwargs["dir"]).mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        try:
            if mode == "online":
                self._probe_server()
            with init_environment(self.init_timeout):
                return wandb.init(mode=mode, settings=_quiet_settings(), **self.init_kwargs)
        except Exception as error:
            if mode != "online":
                raise
            failure, elapsed = error, time.monotonic() - began
        with contextlib.suppress(Exception):  # a half-started online run must not linger
            wandb.finish(exit_code=1)
        message = (
            f"W&B online init failed after {elapsed:.1f}s (limit logger.init_timeout={self.init_timeout:g}s; "
            f"{type(failure).__name__}: {_first_line(failure)}); logging this run offline under "
            f"{self.init_kwargs['dir']}/wandb. Upload it later with `wandb sync <that offline-run-* folder>`."
        )
        warnings.warn(message, stacklevel=3)
        logger.warning(message)
        self.fell_back_offline = True
        with init_environment(self.init_timeout):
            return wandb.init(mode="offline", settings=_quiet_settings(), **self.init_kwargs)

    def _probe_server(self) -> None:
        """Raise ConnectionError when the W&B server does not answer an HTTP request within `init_timeout`.

        wandb.init itself retries for much longer than its `init_timeout` when the server is unreachable or
        accepts connections without answering; one bounded request tells that case apart in seconds.
        """
        import httpx
        import wandb

        url = str(wandb.setup().settings.base_url)  # env, settings files, then the default
        try:
            httpx.get(url, timeout=self.init_timeout, follow_redirects=False)
        except httpx.HTTPError as error:
            raise ConnectionError(f"the W&B server {url} did not answer ({type(error).__name__}: {error})") from error

    def summary(self, metrics: Mapping[str, Any]) -> None:
        if self.run is not None:
            self._guard("summary", lambda: self.run.summary.update(dict(metrics)))
            self.logged_summary.update(metrics)

    def config(self, values: Mapping[str, Any]) -> None:
        if self.run is not None:
            self._guard("config", lambda: self.run.config.update(dict(values), allow_val_change=True))
            self.init_kwargs["config"].update(values)

    def table(self, key: str, frame: Any) -> None:
        if self.run is None or frame is None or len(frame) == 0:
            return

        def log() -> None:
            import wandb

            self.run.log({key: wandb.Table(dataframe=frame.astype(object).where(frame.notna(), None))})

        self._guard("table", log)

    def images(self, paths: Mapping[str, str | os.PathLike]) -> None:
        if self.run is None or not paths:
            return

        def log() -> None:
            import wandb

            self.run.log({key: wandb.Image(str(path)) for key, path in paths.items()})

        self._guard("images", log)

    def html(self, key: str, path: str | os.PathLike) -> None:
        """Log the HTML page at `path` (a `.html` file) as `wandb.Html`."""
        if self.run is None or not Path(path).is_file():
            return

        def log() -> None:
            import wandb

            self.run.log({key: wandb.Html(str(path))})

        self._guard("html", log)

    def artifact(self, name: str, kind: str, directory: str | os.PathLike) -> None:
        if self.run is None or not Path(directory).exists():
            return

        def log() -> None:
            import wandb

            artifact = wandb.Artifact(name=re.sub(r"[^\w.-]", "-", name)[:128], type=kind)
            artifact.add_dir(str(directory))
            self.run.log_artifact(artifact)

        self._guard("artifact", log)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            if run.settings.mode == "offline":
                self._guard("local copies", lambda: self._write_local_copies(Path(run.dir)))
            self._guard("finish", lambda: run.finish(exit_code=exit_code))

    def _write_local_copies(self, files_dir: Path) -> None:
        """Offline runs: readable `config.yaml` and `wandb-summary.json` next to the record file (wandb 0.31
        writes these only when it uploads); `wandb sync` still uploads from the record file."""
        import yaml

        files_dir.mkdir(parents=True, exist_ok=True)
        (files_dir / "config.yaml").write_text(
            yaml.safe_dump(json.loads(json.dumps(self.init_kwargs["config"], default=str)), sort_keys=True)
        )
        (files_dir / "wandb-summary.json").write_text(json.dumps(self.logged_summary, indent=1, default=str))


def _quiet_settings() -> Any:
    """W&B settings without its banner and run summary (the job's report says where the run is)."""
    import wandb

    return wandb.Settings(silent=True, quiet=True)


def _silence_terminal() -> None:
    """Artifact and finish messages print through wandb's process-wide terminal setup (made by `wandb.setup`, not
    by the run's settings): make it silent too, once the run exists."""
    import wandb

    with contextlib.suppress(Exception):
        wandb.termsetup(_quiet_settings(), None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


@contextlib.contextmanager
def wandb_run(
    config: Any,
    *,
    directory: str | os.PathLike,
    name: str,
    job_type: str,
    tags: Sequence[str],
    run_config: Mapping[str, Any],
) -> Iterator[Tracker | None]:
    """A W&B run of the app config `config` (a job's, or a sweep's `multirun.yaml`): its `logger` group (None for
    `logger=none`), group `experiment_name`, `tags` plus the config's `tags`, `run_config` redacted; started on
    entry and finished on exit, with exit code 1 when the body raised."""
    from omegaconf import OmegaConf

    logger_cfg = to_plain(OmegaConf.select(config, "logger") or {"kind": "none"})
    if logger_cfg.get("kind") == "none":
        yield None
        return
    tracker = Tracker.from_logger(
        logger_cfg,
        directory=directory,
        name=name,
        group=str(OmegaConf.select(config, "experiment_name")),
        job_type=job_type,
        tags=[*tags, *map(str, OmegaConf.select(config, "tags") or [])],
        config=redact(dict(run_config)),
    ).start()
    exit_code = 1
    try:
        yield tracker
        exit_code = 0
    finally:
        tracker.finish(exit_code)
