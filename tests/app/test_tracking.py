"""W&B mode: offline unless asked for online; a failing online init falls back to offline in bounded time."""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest
import wandb
from app_helpers import read_run

from steer_hydra.app import tracking
from steer_hydra.app.tracking import Tracker, resolve_mode

SENTINEL = "SENTINEL_token_5a1b2c3d4e"


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """No WANDB_MODE from the test session, a key in the environment, wandb settings isolated under tmp_path."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return monkeypatch


def _only(paths):
    paths = list(paths)
    assert len(paths) == 1, paths
    return paths[0]


def test_auto_is_offline_even_with_a_key_and_wandb_mode_wins(wandb_env):
    assert resolve_mode("auto") == "offline" and resolve_mode(None) == "offline"
    assert resolve_mode("online") == "online" and resolve_mode("disabled") == "disabled"
    with pytest.raises(ValueError, match="logger.mode must be one of"):
        resolve_mode("sometimes")
    wandb_env.setenv("WANDB_MODE", "online")
    assert resolve_mode("auto") == "online"
    wandb_env.setenv("WANDB_MODE", "dryrun")
    assert resolve_mode("online") == "offline"


def test_init_timeout_comes_from_the_argument_the_logger_config_or_the_default(tmp_path):
    base = {"project": "p", "entity": None, "mode": "offline", "directory": tmp_path}
    assert Tracker(**base, init_timeout=3).init_timeout == 3.0
    assert Tracker(**base, config={"logger": {"init_timeout": 7}}).init_timeout == 7.0
    assert Tracker(**base).init_timeout == tracking.DEFAULT_INIT_TIMEOUT


def _frozen_server() -> socket.socket:
    """Accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


@pytest.mark.parametrize("server", ["frozen", "closed"])
def test_online_init_that_fails_falls_back_to_offline_within_the_timeout(wandb_env, tmp_path, server):
    sock = _frozen_server()
    port = sock.getsockname()[1]
    if server == "closed":
        sock.close()
    wandb_env.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    tracker = Tracker(project="p", entity=None, mode="online", directory=tmp_path, init_timeout=2, config={"a": 1})
    began = time.monotonic()
    try:
        with pytest.warns(
            UserWarning, match=r"W&B online init failed after .*init_timeout=2s.*logging this run offline"
        ) as caught:
            tracker.start()
        elapsed = time.monotonic() - began
        assert tracker.active and tracker.fell_back_offline and tracker.run.settings.mode == "offline"
        tracker.summary({"objective": 0.5})
        tracker.finish()
        wandb.teardown()  # the service writes the record file asynchronously; teardown flushes it
    finally:
        sock.close()
    gave_up = float(re.search(r"failed after ([\d.]+)s", str(caught[0].message)).group(1))
    assert gave_up <= 2 + 5, f"the online attempt lasted {gave_up}s"  # init_timeout + CPU slack (was 90-100 s)
    assert elapsed < 2 + 60, f"fallback took {elapsed:.1f}s"  # plus one offline init (slow on a loaded machine)
    record = _only((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    config, summary = read_run(record)
    assert config["a"] in (1, {"value": 1}) and summary["objective"] == 0.5


def test_wandb_records_no_secret_from_the_command_line(wandb_env, tmp_path):
    wandb_env.setenv("HF_TOKEN", "hf_" + SENTINEL)
    argv = [sys.argv[0], f"+secret_token={SENTINEL}", "arm=pasta", f"note=hf_{SENTINEL}"]
    wandb_env.setattr(sys, "argv", argv)
    tracker = Tracker(project="p", entity=None, mode="offline", directory=tmp_path, config={"arm": "pasta"}).start()
    assert sys.argv == argv  # restored after init
    tracker.finish()
    wandb.teardown()  # the service writes the record file asynchronously; teardown flushes it
    files = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    record = _only(p for p in files if p.suffix == ".wandb")
    assert b"arm=pasta" in record.read_bytes()  # the command line is recorded, redacted
    for path in files:
        assert SENTINEL.encode() not in path.read_bytes(), path


def test_an_empty_wandb_mode_is_the_default_offline_run(wandb_env, tmp_path):
    wandb_env.setenv("WANDB_MODE", "")
    tracker = Tracker(project="p", entity=None, mode="auto", directory=tmp_path, init_timeout=4).start()
    try:
        assert tracker.active and tracker.run.settings.mode == "offline" and not tracker.fell_back_offline
    finally:
        tracker.finish()
    assert "WANDB_INIT_TIMEOUT" not in os.environ  # set for the init only


def test_from_logger_takes_project_entity_mode_and_init_timeout_from_the_logger_group(tmp_path):
    logger_cfg = {"kind": "wandb", "project": "proj", "entity": "team", "mode": "offline", "init_timeout": 4}
    tracker = Tracker.from_logger(logger_cfg, directory=tmp_path, name="n", job_type="study_selection", tags=["t"])
    assert tracker.init_timeout == 4.0 and tracker.mode == "offline"
    assert {k: tracker.init_kwargs[k] for k in ("project", "entity", "name", "job_type", "tags")} == {
        "project": "proj",
        "entity": "team",
        "name": "n",
        "job_type": "study_selection",
        "tags": ["t"],
    }
