"""Shared save_dir files: atomic replacement, a file lock that excludes, JSON errors that name the file, CSV text."""

from __future__ import annotations

import csv
import threading
import time

import pandas as pd
import pytest

from steer_hydra.core.files import atomic_write_text, locked, read_json, write_csv, write_json


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


def test_samples_csv_round_trips_control_characters_quotes_and_emoji(tmp_path):
    texts = ["a\rb", "nul\x00inside", 'say "hi", then', "emoji 😀\nsecond line", "crlf\r\nend", "", "plain"]
    frame = pd.DataFrame({"sample_id": range(len(texts)), "completion": texts, "score": [1.0, 0.0, None, 1, 0, 1, 0]})
    write_csv(frame, tmp_path / "samples.csv")
    back = pd.read_csv(tmp_path / "samples.csv", keep_default_na=False)
    assert len(back) == len(texts) and back["completion"].tolist() == texts
    with open(tmp_path / "samples.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["completion"] for r in rows] == texts and [r["sample_id"] for r in rows] == [str(i) for i in range(7)]
