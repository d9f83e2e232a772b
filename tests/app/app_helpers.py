"""Helpers for the app tests: fast job overrides, user arms on a search path, the checks of a sweep of arms beside the
baseline, reading an offline W&B run's record file, finding a secret in files.

`read_run` reads an offline W&B run's record file (`run-*.wandb`) back: the config and summary W&B itself stored.

The file is a LevelDB-style log (32 KiB blocks, 7-byte chunk headers) of `wandb_internal_pb2.Record`
protobufs after a 7-byte `:W&B` header. wandb 0.31 writes no `config.yaml`/`wandb-summary.json` in offline
mode, so tests check what W&B recorded here.
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from wandb.proto import wandb_internal_pb2

# The tiny random model (the default job runs SmolLM2): jobs of a few seconds on CPU.
FAST = ["model=tiny", "suite.limit=2", "suite.generate_overrides.max_tokens=6", "progress=false"]
# A sweep of arms beside the baseline, one sample per task (the model is chosen by the test).
SMALL = ["suite.limit=1", "suite.generate_overrides.max_tokens=8", "logger=none", "progress=false"]

BLOCK = 32768
HEADER = 7


def _chunks(data: bytes) -> Iterator[bytes]:
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        start = pos
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
        elif kind == 0:  # zero padding: the rest of the block is empty
            pos = start + left


def read_run(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(config, summary)` as W&B recorded them (later updates win; summary keys joined with `/`)."""
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for chunk in _chunks(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        kind = record.WhichOneof("record_type")
        if kind == "config":
            for item in record.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "run":
            for item in record.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                key = "/".join(item.nested_key) if item.nested_key else item.key
                summary[key] = json.loads(item.value_json)
    return config, summary


def sweep_dir(root: Path) -> Path:
    """The one sweep folder under `root/outputs/default/multiruns`."""
    (sweep,) = (root / "outputs" / "default" / "multiruns").iterdir()
    return sweep


def job_records(sweep: Path) -> list[dict]:
    """The job records of a sweep, in job order."""
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/job_record.json"))]


def zip_members(path: Path) -> list[tuple[str, bytes]]:
    """Every member of a zip, decompressed (Inspect writes `.eval` members with zstd, which zipfile can't read)."""
    import zstandard

    members = []
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
            start = info.header_offset + 30 + name_len + extra_len
            data = raw[start : start + info.compress_size]
            if info.compress_type == zipfile.ZIP_DEFLATED:
                data = zlib.decompress(data, -15)
            elif info.compress_type == 93:  # zstd
                data = zstandard.ZstdDecompressor().stream_reader(data).read()
            members.append((info.filename, data))
    return members


def files_holding(root: Path, secrets: tuple[str, ...]) -> list[str]:
    """Every file under root (hidden folders such as `.submitit/` included, and every member of every readable
    `.eval` zip) whose bytes contain one of `secrets`."""
    hits = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        blobs = [(str(path), path.read_bytes())]
        if path.suffix == ".eval" and zipfile.is_zipfile(path):
            blobs += [(f"{path}!{name}", data) for name, data in zip_members(path)]
        hits += [where for where, data in blobs for s in secrets if s.encode() in data]
    return hits


def write_arms(root: Path, arms: dict[str, str]) -> str:
    """Write `{name: arm YAML body}` as arm files under `root/user_conf/arm`, as a user's own arms would be; returns
    the search-path override that finds them."""
    folder = root / "user_conf" / "arm"
    folder.mkdir(parents=True)
    for name, body in arms.items():
        (folder / f"{name}.yaml").write_text(f"# @package arm\n{body}\nname: {name}\n")
    return f"hydra.searchpath=[file://{root / 'user_conf'}]"


def check_arms_beside_baseline(sweep: Path, arms: list[str], out: str) -> tuple[dict[str, str], pd.DataFrame]:
    """A sweep of the baseline and `arms` that printed `out`: its results table names exactly those arms; each arm ran
    the baseline's samples and changed some completion against the baseline's on the same sample, and has a
    12-character config id and a row in `out`; the job records carry the same config ids. Returns `({arm: config
    id}, the results table)`."""
    samples = pd.read_csv(sweep / "aggregate" / "samples.csv", keep_default_na=False)  # an empty completion is ""
    keys = ["task", "sample_id", "trial_id"]
    base = samples[samples["arm"] == "baseline"].drop_duplicates(keys).set_index(keys)["completion"]
    table = pd.read_csv(sweep / "aggregate" / "results_table.csv")
    ids = dict(zip(table["arm"], table["config_id"], strict=False))
    assert set(ids) == {"baseline", *arms}
    for arm in arms:
        steered = samples[samples["arm"] == arm].drop_duplicates(keys).set_index(keys)["completion"]
        assert len(steered) > 0 and set(steered.index) == set(base.index), arm
        assert (steered != base.loc[steered.index]).any(), f"{arm} left every completion as the baseline's"
        assert len(ids[arm]) == 12 and f" {arm} " in out, arm
    assert {(r["arm"], r["config_id"]) for r in job_records(sweep)} == set(ids.items())
    return ids, table
