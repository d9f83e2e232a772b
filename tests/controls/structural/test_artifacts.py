"""The artifact cache: an entry exists only whole, an interrupted build leaves none (and its half-written output is
removed by the next build), a waiting process reuses what another built, and digests follow content."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from steer_hydra.controls.structural.artifacts import (
    build_artifact,
    folder_sha256,
    is_complete,
    read_record,
    weights_digest,
)
from steer_hydra.models import build_tiny_model


def test_an_interrupted_build_leaves_no_entry_and_the_next_build_starts_clean(tmp_path):
    calls = []

    def crashing(work, out):
        calls.append(sorted(p.name for p in out.iterdir()))
        (out / "half.bin").write_bytes(b"partial")
        (work / "resume.txt").write_text("step 3")
        raise KeyboardInterrupt  # a killed job

    with pytest.raises(KeyboardInterrupt):
        build_artifact("things", "k1", crashing, cache_dir=tmp_path)
    assert not (tmp_path / "things" / "k1").exists()

    def finishing(work, out):
        calls.append(sorted(p.name for p in out.iterdir()))
        assert (work / "resume.txt").read_text() == "step 3"  # what the builder kept for resuming survives
        (out / "whole.bin").write_bytes(b"done")

    entry, built = build_artifact("things", "k1", finishing, cache_dir=tmp_path, record={"note": 1})
    assert built and is_complete(entry) and calls == [[], []]  # the half-written output was removed first
    assert sorted(p.name for p in entry.iterdir()) == ["artifact.json", "whole.bin"]
    assert read_record(entry)["note"] == 1 and read_record(entry)["key"] == "k1"
    assert not (tmp_path / "things" / ".k1.partial").exists()
    again, built_again = build_artifact("things", "k1", crashing, cache_dir=tmp_path)  # never called: cached
    assert (again, built_again) == (entry, False)


def test_a_waiting_builder_reuses_the_entry_another_one_built(tmp_path):
    builds, results = [], []

    def slow(work, out):
        builds.append(threading.current_thread().name)
        time.sleep(0.5)
        (out / "x").write_text("x")

    threads = [
        threading.Thread(target=lambda: results.append(build_artifact("t", "k", slow, cache_dir=tmp_path)), name=n)
        for n in ("a", "b")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1  # the lock serialized them; the second found the finished entry
    assert sorted(built for _, built in results) == [False, True]


def test_folder_and_weights_digests_follow_content(tmp_path):
    model, _ = build_tiny_model()
    model.save_pretrained(tmp_path / "a")
    first = folder_sha256(tmp_path / "a", cache_dir=tmp_path / "cache")
    assert folder_sha256(tmp_path / "a", cache_dir=tmp_path / "cache") == first
    digest = weights_digest(model)
    with torch.no_grad():
        model.model.norm.weight[0] += 1.0
    assert weights_digest(model) != digest
    model.save_pretrained(tmp_path / "a")
    assert folder_sha256(tmp_path / "a", cache_dir=tmp_path / "cache") != first
    with pytest.raises(ValueError, match="holds no files"):
        folder_sha256(tmp_path / "cache")
