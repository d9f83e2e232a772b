"""No secret is written: override values of secret-named keys stay out of every file, the console and W&B."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import pytest
from app_helpers import FAST, read_run

from steer_hydra.app.redaction import install_log_redaction
from steer_hydra.app.secrets import REDACTED, Redactor, is_secret_override, override_secrets, redact_overrides

SWEEP_SECRETS = ("SENTINEL_sweep_aaa111", "SENTINEL_sweep_bbb222")
KEY_SECRET = "SENTINEL_apikey_ccc333"
SHORT = "zq9"  # shorter than Redactor.MIN_BARE: redacted as key=value only


def test_override_secrets_cover_sweeps_and_nested_keys():
    lines = [f"+secret_token={SWEEP_SECRETS[0]},{SWEEP_SECRETS[1]}", f"+my.api_key={KEY_SECRET}", "arm=pasta"]
    found = override_secrets(lines)
    assert found["+secret_token"] >= set(SWEEP_SECRETS) and found["+my.api_key"] == {KEY_SECRET}
    assert redact_overrides(lines) == [f"+secret_token={REDACTED}", f"+my.api_key={REDACTED}", "arm=pasta"]
    assert not is_secret_override("model.hf_model_kwargs.pad_token=x") and not is_secret_override("arm=pasta")
    redactor = Redactor([*lines, f"+x_password={SHORT}"], environ={})
    dirname = f"+my.api_key={KEY_SECRET},+x_password={SHORT},arm=pasta"
    assert redactor.text(dirname) == f"+my.api_key={REDACTED},+x_password={REDACTED},arm=pasta"
    assert redactor.text(f"note {SWEEP_SECRETS[1]} and {SHORT}") == f"note {REDACTED} and {SHORT}"
    assert redactor.value({"secret_token": "x", "n": [f"+secret_token={SHORT}"]}) == {
        "secret_token": REDACTED,
        "n": [f"+secret_token={REDACTED}"],
    }


def test_log_lines_are_redacted_once_installed(caplog):
    install_log_redaction(Redactor([f"+secret_token={SWEEP_SECRETS[0]}"], environ={}))
    with caplog.at_level(logging.INFO):
        logging.getLogger("hydra.test").info("\t#0 : %s arm=pasta", f"+secret_token={SWEEP_SECRETS[0]}")
    assert caplog.messages == [f"\t#0 : +secret_token={REDACTED} arm=pasta"]


def _zip_members(path: Path) -> list[tuple[str, bytes]]:
    """Every member of a zip, decompressed (Inspect writes `.eval` members with zstd, which zipfile can't read)."""
    import struct
    import zlib

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


def _files_holding(root: Path, secrets: tuple[str, ...]) -> list[str]:
    """Every file under root (and every member of every .eval zip) whose bytes contain one of `secrets`."""
    hits = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        blobs = [(str(path), path.read_bytes())]
        if path.suffix == ".eval":
            blobs += [(f"{path}!{name}", data) for name, data in _zip_members(path)]
        hits += [where for where, data in blobs for s in secrets if s.encode() in data]
    return hits


@pytest.mark.slow
def test_sentinel_secrets_reach_no_file_console_or_wandb_record(run_app, tmp_path):
    env = {"WANDB_MODE": "offline", "HF_TOKEN": "hf_SENTINEL_env_ddd444"}
    secrets = (*SWEEP_SECRETS, KEY_SECRET, "hf_SENTINEL_env_ddd444")
    sweep = run_app(
        "--multirun",
        f"+secret_token={SWEEP_SECRETS[0]},{SWEEP_SECRETS[1]}",
        f"+my.api_key={KEY_SECRET}",
        *FAST,
        "suite.limit=1",
        env=env,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    refused = run_app(
        "backend=vllm_serve",
        "backend.options.base_url=http://127.0.0.1:1",
        f"+backend.options.api_key={KEY_SECRET}",
        env=env,
    )
    assert refused.returncode == 1 and "backend.options.api_key holds a secret" in refused.stderr

    outputs = tmp_path / "outputs"
    assert len(list(outputs.rglob("*.eval"))) >= 3 and len(list(outputs.rglob(".hydra/overrides.yaml"))) == 3
    members = [data for log in outputs.rglob("*.eval") for _, data in _zip_members(log)]
    assert any(b"steer_hydra/short_answer" in data for data in members)  # the logs were really read
    assert _files_holding(outputs, secrets) == []
    for proc in (sweep, refused):
        assert not [s for s in secrets if s in proc.stdout + proc.stderr]
    assert f"+secret_token={REDACTED}" in sweep.stdout + sweep.stderr  # the launch lines, redacted
    overrides = next(outputs.rglob("multiruns/*/0_*/.hydra/overrides.yaml")).read_text()
    assert f"+secret_token={REDACTED}" in overrides and f"+my.api_key={REDACTED}" in overrides
    records = list(outputs.rglob("run-*.wandb"))
    assert len(records) >= 2, sweep.stderr[-2000:]  # one per job (and the sweep summary run, scanned like all)
    for record in records:
        config, _ = read_run(record)
        assert config  # readable, and (checked above) free of the sentinels
