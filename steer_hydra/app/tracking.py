"""W&B tracking for one job: init (offline unless logged in), summary, tables, images, artifacts, always finished.

Every call is guarded: a W&B failure (unwritable dir, init error, upload error) logs a warning and turns the
tracker into a no-op, so the evaluation results on disk are never lost because of tracking.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MODES = ("auto", "online", "offline", "disabled")


def resolve_mode(mode: str | None) -> str:
    """`auto` means online when W&B has an API key configured (env or netrc), else offline; WANDB_MODE wins."""
    env_mode = os.environ.get("WANDB_MODE")
    if env_mode in ("online", "offline", "disabled", "dryrun"):
        return "offline" if env_mode == "dryrun" else env_mode
    mode = mode or "auto"
    if mode not in MODES:
        raise ValueError(f"logger.mode must be one of {MODES}; got {mode!r}.")
    if mode != "auto":
        return mode
    import wandb

    try:
        return "online" if wandb.login(verify=False, prompt=False) else "offline"
    except Exception:  # no key, no TTY: stay offline
        return "offline"


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
        self.run: Any = None
        self.logged_summary: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        return self.run is not None

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as error:  # tracking must never take the results down with it
            warnings.warn(f"W&B {what} failed ({type(error).__name__}: {error}); results stay on disk.", stacklevel=3)
            logger.warning("W&B %s failed: %s", what, error)
            return None

    def start(self) -> Tracker:
        def init() -> Any:
            import wandb

            mode = resolve_mode(self.mode)
            Path(self.init_kwargs["dir"]).mkdir(parents=True, exist_ok=True)
            return wandb.init(mode=mode, **self.init_kwargs)

        self.run = self._guard("init", init)
        return self

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
