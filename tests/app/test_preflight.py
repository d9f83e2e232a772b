"""Bad input is refused before any model loads, in one line that names the config key and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hydra.core.global_hydra import GlobalHydra

from steer_hydra.app import job as job_module
from steer_hydra.app import preflight as preflight_module
from steer_hydra.app.plan import ConfigError
from steer_hydra.app.preflight import model_context, preflight

BAD_COMMANDS = [
    (["model.device_map=cuda"], ["model.device_map", "CUDA", "Fix: model.device_map=cpu"]),
    (["+model.hf_model_kwargs.dtype=float99"], ["model.hf_model_kwargs.dtype='float99'", "not a torch dtype"]),
    (
        ["suite.tasks=[steer_hydra/short_answer,steer_hydra/no_such_task]"],
        ["suite.tasks[1]", "'steer_hydra/no_such_task'"],
    ),
    (["suite.tasks=[inspect_evals/gsm8k]"], ["inspect_evals/gsm8k", "steer_hydra[evals]"]),
    (["generate_defaults.temperature=-1"], ["generate_defaults.temperature=-1", "must be >= 0"]),
    (["suite.generate_overrides.max_tokens=-5"], ["suite.generate_overrides.max_tokens=-5", "integer >= 1"]),
    (["suite.generate_overrides.max_tokens=0"], ["suite.generate_overrides.max_tokens=0", "integer >= 1"]),
    (["suite.generate_overrides.max_tokens=100000000"], ["context window of 2048 tokens", "max_position_embeddings"]),
    (["+generate_defaults.bogus_key=1"], ["generate_defaults.bogus_key", "unknown generation setting 'bogus_key'"]),
    (["experiment_name=../../escape"], ["experiment_name='../../escape'", "one plain path component"]),
    (["model.name=a/b"], ["model.name='a/b'"]),
    (["model.model_name_or_path=/no/such/model/folder"], ["model.model_name_or_path", "no such local folder"]),
    (["model.model_name_or_path=made-up-org/made-up-model-xyz"], ["not in the Hugging Face cache", "HF_HUB_OFFLINE"]),
    (["model.model_name_or_path=steer_hydra:nope"], ["not a built-in model reference", "steer_hydra:tiny"]),
]


def _run_main(overrides, tmp_path, monkeypatch):
    """Run the real Hydra entry point in this process; returns the SystemExit code and whether a job started."""
    from steer_hydra import main as main_module

    started = []

    def no_job(*args, **kwargs):  # every model load happens inside run_job: reaching it means preflight passed
        started.append(True)
        raise AssertionError("run_job reached: the model would have loaded")

    monkeypatch.setattr(job_module, "run_job", no_job)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(
        sys, "argv", ["steer_hydra", "model=tiny", f"output_root={tmp_path}", "logger=none", *overrides]
    )
    GlobalHydra.instance().clear()
    began = time.monotonic()
    try:
        with pytest.raises(SystemExit) as info:
            main_module.main()
    finally:
        GlobalHydra.instance().clear()
    return info.value.code, bool(started), time.monotonic() - began


@pytest.mark.parametrize(("overrides", "expected"), BAD_COMMANDS, ids=[" ".join(c[0]) for c in BAD_COMMANDS])
def test_bad_command_fails_before_model_load_in_one_line(overrides, expected, tmp_path, monkeypatch):
    code, started, elapsed = _run_main(overrides, tmp_path, monkeypatch)
    assert not started, "the job started: the mistake was not caught up front"
    assert isinstance(code, str), code  # sys.exit(message): exit status 1 with the message, no traceback
    assert code.startswith("steer_hydra: invalid configuration: ") and "\n" not in code, code
    assert "Fix:" in code, code
    for text in expected:
        assert text in code, (text, code)
    assert elapsed < 60, f"preflight took {elapsed:.1f}s"  # generous: imports on a loaded 2-core machine
    assert not list(tmp_path.rglob("*.eval")) and not list(tmp_path.rglob("protocol"))


def test_the_default_command_passes_preflight(compose_cfg):
    preflight(compose_cfg())
    preflight(compose_cfg(["suite.generate_overrides.max_tokens=2047", "+generate_defaults.top_p=0.9"]))
    preflight(compose_cfg(["+generate_defaults.fail_on_error=0.5", "+generate_defaults.max_connections=2"]))


def test_several_problems_are_numbered_in_one_line(compose_cfg):
    cfg = compose_cfg(["generate_defaults.temperature=-1", "experiment_name=a/b", "model.device_map=cuda:0"])
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    message = str(info.value)
    if "CUDA" in message:  # on a GPU machine cuda:0 is fine
        assert message.startswith("3 problems: (1) ")
    assert "(2) " in message and "\n" not in message
    assert "generate_defaults.temperature" in message and "experiment_name='a/b'" in message


def test_reserved_and_ill_typed_generation_settings(compose_cfg):
    with pytest.raises(ConfigError, match="generate_defaults.log_dir is set by steer_hydra itself"):
        preflight(compose_cfg(["+generate_defaults.log_dir=/tmp/x"]))
    with pytest.raises(ConfigError, match=r"suite.generate_overrides.top_p=1.5: top_p must be in \(0, 1\]"):
        preflight(compose_cfg(["+suite.generate_overrides.top_p=1.5"]))
    with pytest.raises(ConfigError, match="temperature='hot'"):
        preflight(compose_cfg(["generate_defaults.temperature=hot"]))


def test_secrets_in_backend_or_model_options_are_refused_with_the_env_fix(compose_cfg):
    cfg = compose_cfg(
        ["backend=vllm_serve", "backend.options.base_url=http://127.0.0.1:1", "+backend.options.api_key=sk-SENTINEL"]
    )
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    message = str(info.value)
    assert "backend.options.api_key holds a secret" in message and "api_key_env" in message
    assert "sk-SENTINEL" not in message
    with pytest.raises(ConfigError, match=r"model.hf_model_kwargs.token holds a secret.*HF_TOKEN"):
        preflight(compose_cfg(["+model.hf_model_kwargs.token=hf_SENTINEL"]))


def test_vllm_serve_on_a_closed_port_is_refused_at_once(compose_cfg):
    cfg = compose_cfg(["backend=vllm_serve", "backend.options.base_url=http://127.0.0.1:1"])
    began = time.monotonic()
    with pytest.raises(ConfigError, match=r"backend.options.base_url='http://127.0.0.1:1': nothing accepts"):
        preflight(cfg)
    assert time.monotonic() - began < 5
    with pytest.raises(ConfigError, match=r"backend.options: backend=vllm_serve needs options.base_url"):
        preflight(compose_cfg(["backend=vllm_serve"]))


def test_context_window_comes_from_the_checkpoint_config_without_loading(compose_cfg, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    cfg = compose_cfg([f"model.model_name_or_path={folder}", "suite.generate_overrides.max_tokens=100"])
    assert model_context(preflight_module.to_plain(cfg)) == (64, f"max_position_embeddings of {folder}")
    with pytest.raises(ConfigError, match="max_tokens=100 is not below the model's context window of 64"):
        preflight(cfg)
    vllm = compose_cfg(["backend=vllm", "backend.options.max_model_len=512", "suite.generate_overrides.max_tokens=600"])
    assert model_context(preflight_module.to_plain(vllm))[0] == 512
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is a folder without config.json"):
        preflight(compose_cfg([f"model.model_name_or_path={tmp_path / 'empty'}"]))


def test_hub_id_online_is_looked_up_with_a_bounded_timeout(compose_cfg, monkeypatch):
    from huggingface_hub import HfApi

    seen = {}

    def unreachable(self, repo_id, *, timeout=None, **kwargs):
        seen["timeout"] = timeout
        raise OSError("network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(HfApi, "model_info", unreachable)
    with pytest.raises(ConfigError, match=r"not cached locally and the Hub did not answer within 5s \(OSError\)"):
        preflight(compose_cfg(["model.model_name_or_path=made-up-org/made-up-model-xyz"]))
    assert seen["timeout"] == preflight_module.HUB_TIMEOUT

    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(self, repo_id, **kwargs):
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its __init__ needs an HTTP response
        Exception.__init__(error, "404 Repository Not Found")
        raise error

    monkeypatch.setattr(HfApi, "model_info", missing)
    with pytest.raises(ConfigError, match="no such model on the Hub"):
        preflight(compose_cfg(["model.model_name_or_path=made-up-org/made-up-model-xyz"]))


def test_cli_prints_one_line_and_exits_1_quickly(run_app, tmp_path):
    began = time.monotonic()
    proc = run_app(
        "model.device_map=cuda", "model.model_name_or_path=made-up-org/made-up-xyz", env={"HF_HUB_OFFLINE": "1"}
    )
    elapsed = time.monotonic() - began
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("steer_hydra: invalid configuration: 2 problems:"), proc.stderr
    assert "Traceback" not in proc.stderr and "model.device_map" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    assert elapsed < 60, f"took {elapsed:.0f}s"  # the offline Hub lookup alone used to hang 68 s
    outputs = tmp_path / "outputs"
    assert not [p for p in outputs.rglob("*") if p.name in ("protocol", "wandb") or p.suffix == ".eval"]


PREFLIGHT_IMPORTS = """
import sys
from hydra import compose, initialize_config_module
from steer_hydra.app.preflight import preflight
from steer_hydra.app.schema import register_configs

register_configs()
with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
    for overrides in ([], ["model=tiny"]):  # the default job (SmolLM2) and the tiny model
        preflight(compose("config", overrides=overrides))
print(sorted(m for m in ("tokenizers", "transformers") if m in sys.modules))
"""


def test_checking_a_job_imports_neither_transformers_nor_tokenizers():
    # a bad command is refused before the heaviest imports (about 2 s of the time to the error line)
    proc = subprocess.run([sys.executable, "-c", PREFLIGHT_IMPORTS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
