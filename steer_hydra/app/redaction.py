"""Hydra callback and console guard that keep secret values out of files, pickles and the console.

How it runs (Hydra 1.3.8):
- `hydra.output_subdir` is null in `config.yaml`, so Hydra itself writes no config copies; `on_job_start` writes
  `config.yaml`, `hydra.yaml` and `overrides.yaml` into `<job dir>/<output_subdir>` (default `.hydra`) with the
  values of secret-named overrides (`+api_token=...`), secret-named keys and secret env values replaced by
  `***`. A user who sets `hydra.output_subdir` back gets Hydra's copies overwritten the same way.
- `on_multirun_start` runs before the sweeper reads `hydra.overrides.task`: each secret-named override's value
  moves into an environment variable of this process (`STEER_HYDRA_SECRET_<KEY>`, inherited by the processes
  and cluster jobs the launcher starts) and the override, the sweep config's node and `override_dirname` become
  `${oc.env:STEER_HYDRA_SECRET_<KEY>}`. Every launcher then pickles and records only the reference (submitit's
  `.submitit/*.pkl`); the job resolves it in memory. `on_multirun_end` removes the variables. Ray's workers
  inherit their node's environment instead, so on its launcher the variables also travel in the sweep's Ray
  runtime environment (`forward_environment_to_ray`).
- A sweep's `multirun.yaml` is written by the launcher before any job: the first `on_job_start` of the sweep
  (and `on_multirun_end`) rewrites it redacted, atomically.
- `on_run_start` / `on_multirun_start` / `on_job_start` install a log-record factory that redacts those values
  from every log line, so the launcher's `#0 : +api_token=...` line prints no value.
- `on_job_end` runs before Hydra reads the job's result: it redacts the overrides Hydra prints with a failed job
  (`Error executing job with overrides: [...]`, and the same list in submitit's result pickle) and the secret
  values in the failed job's exception messages.
- `redacted_console` (used by `steer_hydra.main`) redacts what Python writes to stdout and stderr while the app
  runs: Hydra's own error messages (a composition error quotes the override line), tracebacks, `--cfg` output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from steer_hydra.app.secrets import Redactor, move_to_environment
from steer_hydra.core.files import atomic_write_text

logger = logging.getLogger(__name__)

_LOG_REDACTORS: list[Redactor] = []
_BASE_FACTORY: Any = None


def redactor_for(config: DictConfig) -> Redactor:
    """The secrets of a (job or sweep) config: its task and hydra overrides, and the environment."""
    overrides = [*(OmegaConf.select(config, "hydra.overrides.task") or []), *(_hydra_overrides(config))]
    return Redactor([str(o) for o in overrides])


def _hydra_overrides(config: DictConfig) -> list[str]:
    return list(OmegaConf.select(config, "hydra.overrides.hydra") or [])


def redacted_yaml(node: Any, redactor: Redactor) -> str:
    """YAML of a config node (interpolations kept, as Hydra writes it) with every secret replaced."""
    if OmegaConf.is_config(node):
        node = OmegaConf.to_container(node, resolve=False, enum_to_str=True)
    return OmegaConf.to_yaml(OmegaConf.create(redactor.value(node)))


def install_log_redaction(redactor: Redactor) -> None:
    """Redact `redactor`'s secrets from every log record created from now on in this process (idempotent)."""
    global _BASE_FACTORY
    if not redactor or any(r.pairs == redactor.pairs and r.values == redactor.values for r in _LOG_REDACTORS):
        return
    _LOG_REDACTORS.append(redactor)
    if _BASE_FACTORY is not None:
        return
    _BASE_FACTORY = logging.getLogRecordFactory()
    base = _BASE_FACTORY

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return record
        cleaned = message
        for each in _LOG_REDACTORS:
            cleaned = each.text(cleaned)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return record

    logging.setLogRecordFactory(factory)


class _RedactingStream:
    """A text stream that writes through `redactor`; every other attribute is the wrapped stream's."""

    def __init__(self, stream: Any, redactor: Redactor) -> None:
        self._stream = stream
        self._redactor = redactor

    def write(self, text: Any) -> Any:
        if not isinstance(text, str):
            return self._stream.write(text)
        self._stream.write(self._redactor.text(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_console(redactor: Redactor) -> Iterator[None]:
    """Redact `redactor`'s secrets from what Python writes to `sys.stdout` and `sys.stderr` inside the block (output
    written straight to the file descriptors, by C code or child processes, is not seen)."""
    if not redactor:
        yield
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _RedactingStream(sys.stdout, redactor), _RedactingStream(sys.stderr, redactor)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def move_secrets_to_environment(config: DictConfig) -> list[str]:
    """Move the values of the sweep config's secret-named overrides into environment variables of this process.

    Each such override in `hydra.overrides.task` / `hydra.overrides.hydra` becomes one that reads
    `${oc.env:STEER_HYDRA_SECRET_<KEY>}` (a sweep: one variable per value), and so do the config node it set and
    `hydra.job.override_dirname`. Returns the names of the variables set.
    """
    names: list[str] = []
    taken: set[str] = set()
    dirname_key = "hydra.job.override_dirname"
    kv_sep = str(OmegaConf.select(config, "hydra.job.config.override_dirname.kv_sep", default="="))
    for group in ("task", "hydra"):
        lines = OmegaConf.select(config, f"hydra.overrides.{group}")
        if lines is None:
            continue
        for index, line in enumerate(OmegaConf.to_container(lines, resolve=False)):
            moved = move_to_environment(str(line), taken)
            if moved is None:
                continue
            os.environ.update(moved.environ)
            names += list(moved.environ)
            with read_write(lines):
                lines[index] = moved.line
            dirname = OmegaConf.select(config, dirname_key)
            if isinstance(dirname, str):
                _set(config, dirname_key, dirname.replace(line.replace("=", kv_sep), moved.line.replace("=", kv_sep)))
            if moved.reference is not None and _holds(config, moved.key):
                _set(config, moved.key, moved.reference)
    return names


def forward_environment_to_ray(config: DictConfig, names: list[str]) -> None:
    """On Ray's launcher, give the jobs the variables `names` too: a Ray worker inherits its node's `ray start`
    environment, not this process's. Each becomes `hydra.launcher.ray.init.runtime_env.env_vars.<NAME>:
    ${oc.env:NAME}`, resolved by the launcher in this process when it connects, so no file holds the value."""
    if not names or not OmegaConf.is_dict(OmegaConf.select(config, "hydra.launcher.ray.init", default=None)):
        return  # not a Ray launcher (those are configured by `ray.init` / `ray.remote`)
    with read_write(config.hydra), open_dict(config.hydra):
        for name in names:
            key = f"hydra.launcher.ray.init.runtime_env.env_vars.{name}"
            OmegaConf.update(config, key, f"${{oc.env:{name}}}", force_add=True)


def _holds(config: DictConfig, key: str) -> bool:
    return OmegaConf.select(config, key, throw_on_resolution_failure=False) is not None


def _set(config: DictConfig, key: str, value: Any) -> None:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    with read_write(parent), open_dict(parent):
        parent[leaf] = value


class RedactSecrets(Callback):
    """Writes the job's config copies redacted, redacts the sweep's multirun.yaml and the console lines."""

    def __init__(self, output_subdir: str = ".hydra") -> None:
        self.output_subdir = output_subdir
        self.environ_names: list[str] = []  # the variables this sweep's secrets moved into (names only)
        self._multirun_seen: tuple[str, int, int] | None = None  # multirun.yaml as last redacted: path, mtime, size

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        install_log_redaction(redactor_for(config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        install_log_redaction(redactor_for(config))
        self.environ_names = move_secrets_to_environment(config)
        forward_environment_to_ray(config, self.environ_names)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        redactor = redactor_for(config)
        install_log_redaction(redactor)
        out = Path(str(config.hydra.runtime.output_dir)) / str(config.hydra.output_subdir or self.output_subdir)
        task_cfg = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
        task_cfg.pop("hydra", None)
        atomic_write_text(out / "config.yaml", redacted_yaml(task_cfg, redactor))
        atomic_write_text(out / "hydra.yaml", redacted_yaml(OmegaConf.masked_copy(config, "hydra"), redactor))
        atomic_write_text(out / "overrides.yaml", redacted_yaml(config.hydra.overrides.task, redactor))
        mode = OmegaConf.select(config, "hydra.mode")
        if getattr(mode, "name", str(mode)) == "MULTIRUN":
            self._redact_multirun_yaml(config)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        redactor = redactor_for(config)
        if getattr(job_return, "overrides", None) is not None:
            job_return.overrides = redactor.argv([str(o) for o in job_return.overrides])
        error = getattr(job_return, "_return_value", None)  # read without `return_value`, which prints the overrides
        if isinstance(error, BaseException):
            redactor.exception(error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._redact_multirun_yaml(config)
        for name in self.environ_names:
            os.environ.pop(name, None)
        self.environ_names = []

    def _redact_multirun_yaml(self, config: DictConfig) -> None:
        path = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))) / "multirun.yaml"
        if not path.is_file():
            return
        if _stamp(path) == self._multirun_seen:  # redacted by an earlier job of this process
            return
        saved = OmegaConf.load(path)
        redactor = Redactor(
            [str(o) for o in [*(OmegaConf.select(saved, "hydra.overrides.task") or []), *_hydra_overrides(saved)]]
        )
        text = redacted_yaml(saved, redactor)
        if text != path.read_text(encoding="utf-8"):
            atomic_write_text(path, text)
        self._multirun_seen = _stamp(path)


def _stamp(path: Path) -> tuple[str, int, int]:
    """A file as last seen: its path, modification time and size (a rewrite changes one of them)."""
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size
