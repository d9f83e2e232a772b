"""Hydra callback that keeps secret override values out of `.hydra/`, the sweep's `multirun.yaml` and the console.

How it runs (Hydra 1.3.8):
- `hydra.output_subdir` is null in `config.yaml`, so Hydra itself writes no config copies; `on_job_start` writes
  `config.yaml`, `hydra.yaml` and `overrides.yaml` into `<job dir>/<output_subdir>` (default `.hydra`) with the
  values of secret-named overrides (`+api_token=...`), secret-named keys and secret env values replaced by
  `***`. A user who sets `hydra.output_subdir` back gets Hydra's copies overwritten the same way.
- A sweep's `multirun.yaml` is written by the launcher before any job: the first `on_job_start` of the sweep
  (and `on_multirun_end`) rewrites it redacted, atomically.
- `on_run_start` / `on_multirun_start` install a log-record factory that redacts those values from every log
  line, so the launcher's `#0 : +api_token=...` line prints `***`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from steer_hydra.app.secrets import Redactor

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


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


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


class RedactSecrets(Callback):
    """Writes the job's config copies redacted, redacts the sweep's multirun.yaml and the console lines."""

    def __init__(self, output_subdir: str = ".hydra") -> None:
        self.output_subdir = output_subdir

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        install_log_redaction(redactor_for(config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        install_log_redaction(redactor_for(config))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        redactor = redactor_for(config)
        install_log_redaction(redactor)
        out = Path(str(config.hydra.runtime.output_dir)) / str(config.hydra.output_subdir or self.output_subdir)
        task_cfg = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
        task_cfg.pop("hydra", None)
        write_atomic(out / "config.yaml", redacted_yaml(task_cfg, redactor))
        write_atomic(out / "hydra.yaml", redacted_yaml(OmegaConf.masked_copy(config, "hydra"), redactor))
        write_atomic(out / "overrides.yaml", redacted_yaml(config.hydra.overrides.task, redactor))
        mode = OmegaConf.select(config, "hydra.mode")
        if getattr(mode, "name", str(mode)) == "MULTIRUN":
            self._redact_multirun_yaml(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._redact_multirun_yaml(config)

    def _redact_multirun_yaml(self, config: DictConfig) -> None:
        path = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))) / "multirun.yaml"
        if not path.is_file():
            return
        saved = OmegaConf.load(path)
        redactor = Redactor(
            [str(o) for o in [*(OmegaConf.select(saved, "hydra.overrides.task") or []), *_hydra_overrides(saved)]]
        )
        text = redacted_yaml(saved, redactor)
        if text != path.read_text(encoding="utf-8"):
            write_atomic(path, text)
