"""Shared save_dir files: atomic replacement, a file lock that excludes (and says when it waits), JSON errors that
name the file, CSV text, and telling whether the process a file names still runs."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from steer_hydra.core.files import (
    atomic_write_text,
    locked,
    on_this_host,
    process_gone,
    process_identity,
    read_json,
    write_csv,
    write_json,
)


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "protocol" / "smoke.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2, "b": [1, 2]})
    assert read_json(path) == {"a": 2, "b": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["smoke.json"]


def test_a_damaged_json_file_is_named_with_the_fix(tmp_path):
    path = tmp_path / "configs" / "abc.json"
    atomic_write_text(path, '{"arm": "pas')
    with pytest.raises(ValueError, match=r"configs/abc.json is not valid JSON.*Fix: delete it"):
        read_json(path)


def test_the_lock_excludes_a_second_holder_until_released(tmp_path):
    events = []

    def second():
        with locked(tmp_path / ".lock"):
            events.append("second")

    with locked(tmp_path / ".lock"):
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.3)
        events.append("first done")
    thread.join(5)
    assert events == ["first done", "second"]


def test_the_lock_says_once_when_it_waits_for_another_holder(tmp_path):
    waits = []
    with locked(tmp_path / ".lock", on_wait=waits.append):  # free: no wait
        pass
    assert waits == []

    def second():
        with locked(tmp_path / ".lock", on_wait=waits.append):
            pass

    with locked(tmp_path / ".lock"):
        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 5
        while not waits and time.monotonic() < deadline:
            time.sleep(0.01)
    thread.join(5)
    assert waits == [tmp_path / ".lock"] and not thread.is_alive()


def test_a_process_is_gone_when_its_pid_is_free_or_reused(tmp_path):
    me = process_identity()
    assert me["pid"] == os.getpid() and on_this_host(me) and not process_gone(me)
    assert not on_this_host({**me, "host": "elsewhere"})
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_gone({**me, "pid": proc.pid, "start_time": None})  # exited and reaped
    assert not process_gone({**me, "pid": 0}) and not process_gone({**me, "pid": None})  # nothing to check
    if Path(f"/proc/{os.getpid()}/stat").exists():  # a pid now used by another process than the recorded one
        assert me["start_time"] is not None
        assert process_gone({**me, "start_time": me["start_time"] - 1})


def test_samples_csv_round_trips_control_characters_quotes_and_emoji(tmp_path):
    texts = ["a\rb", "nul\x00inside", 'say "hi", then', "emoji 😀\nsecond line", "crlf\r\nend", "", "plain"]
    frame = pd.DataFrame({"sample_id": range(len(texts)), "completion": texts, "score": [1.0, 0.0, None, 1, 0, 1, 0]})
    write_csv(frame, tmp_path / "samples.csv")
    back = pd.read_csv(tmp_path / "samples.csv", keep_default_na=False)
    assert len(back) == len(texts) and back["completion"].tolist() == texts
    with open(tmp_path / "samples.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["completion"] for r in rows] == texts and [r["sample_id"] for r in rows] == [str(i) for i in range(7)]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask_as_open_does(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_csv(pd.DataFrame({"a": [1]}), tmp_path / "results.csv")
        write_json(tmp_path / "job_record.json", {"a": 1})
        with open(tmp_path / "plain.txt", "w") as handle:  # what a plot's writer gets
            handle.write("x")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"results.csv": expected, "job_record.json": expected, "plain.txt": expected}
