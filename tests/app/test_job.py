"""One job end to end: the README's default command, W&B records and provenance, secrets, failures."""

from __future__ import annotations

import csv
import json
import os
import re

import pytest
import yaml
from app_helpers import FAST, read_run

from steer_hydra.app import job as job_module
from steer_hydra.app import tracking
from steer_hydra.app.compose import to_plain
from steer_hydra.app.plan import JobPlan
from steer_hydra.app.secrets import REDACTED, redact
from steer_hydra.core.errors import ConfigError

SECRET = "hf_supersecret_value_0123456789"


def _only(paths):
    paths = list(paths)
    assert len(paths) == 1, paths
    return paths[0]


@pytest.mark.slow
def test_default_command_leaves_results_plots_and_an_offline_wandb_run(run_app, tmp_path):
    env = {"HOME": str(tmp_path / "home"), "HF_TOKEN": SECRET, "WANDB_API_KEY": ""}
    env_without_mode = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
    # the default command (with the tiny model and 4 samples per task: its real time is a benchmark, not a test)
    proc = run_app("suite.limit=4", env={**env_without_mode, **env, "WANDB_MODE": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _only((tmp_path / "outputs" / "default" / "runs").iterdir())
    rows = list(csv.DictReader((run_dir / "results.csv").open()))
    tasks = {r["task"] for r in rows}
    assert tasks == {"steer_hydra/short_answer", "steer_hydra/mcqa", "steer_hydra/instruction_following"}
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert (run_dir / "samples.csv").exists()

    wandb_run = _only((run_dir / "wandb").glob("offline-run-*"))  # offline: nobody is logged in
    config, summary = read_run(_only(wandb_run.glob("run-*.wandb")))
    provenance = config["provenance"]
    if isinstance(provenance, dict) and "value" in provenance:
        provenance = provenance["value"]
    for key in (
        "git_commit",
        "config_id",
        "trial_seeds",
        "prompt_path",
        "batch_ceiling",
        "inert_static_runtime_kwargs",
        "steering_vector_hashes",
        "inspect_ai_version",
        "model_fingerprint",
    ):
        assert key in provenance, key
    assert provenance["config_id"] == "baseline" and provenance["prompt_path"] == "messages"
    assert provenance["batching"] == "refill"  # the default ("auto") on a pipeline that can refill
    accuracy = next(
        float(r["value"]) for r in rows if r["task"] == "steer_hydra/short_answer" and r["metric"] == "accuracy"
    )
    assert summary["smoke/steer_hydra.short_answer/includes/accuracy"] == accuracy
    assert "objective" in summary
    local_config = yaml.safe_load((wandb_run / "files" / "config.yaml").read_text())
    assert local_config["provenance"]["config_id"] == "baseline" and local_config["arm"]["name"] == "baseline"
    assert json.loads((wandb_run / "files" / "wandb-summary.json").read_text())["objective"] == summary["objective"]
    for path in [*wandb_run.rglob("*"), run_dir / "job_record.json"]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_redaction_of_secret_keys_and_env_values(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    cleaned = redact(
        {
            "model": {"hf_model_kwargs": {"token": "x" * 8, "dtype": "bf16"}},
            "note": f"key={SECRET}",
            "max_new_tokens": 5,
            "api_key_env": "VLLM_API_KEY",
            "pad_token": "<pad>",
        }
    )
    assert cleaned["model"]["hf_model_kwargs"] == {"token": REDACTED, "dtype": "bf16"}
    assert cleaned["note"] == f"key={REDACTED}"
    assert (
        cleaned["max_new_tokens"] == 5 and cleaned["api_key_env"] == "VLLM_API_KEY" and cleaned["pad_token"] == "<pad>"
    )


def test_tracker_config_is_redacted(compose_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    cfg = compose_cfg([f"+model.hf_model_kwargs.token={SECRET}", f"experiment_name={SECRET}"])
    monkeypatch.setattr(tracking.Tracker, "start", lambda self: self)  # no W&B: the run's init arguments only
    with tracking.wandb_run(
        cfg, directory=tmp_path, name="job", job_type="arm", tags=[], run_config=to_plain(cfg)
    ) as run:
        text = json.dumps(run.init_kwargs["config"])
    assert SECRET not in text and REDACTED in text


def test_wandb_failure_warns_and_keeps_the_results(compose_cfg, monkeypatch, tmp_path, caplog):
    import logging

    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("offline dir not writable")

    monkeypatch.setattr(wandb, "init", broken_init)
    cfg = compose_cfg([*FAST, f"output_root={tmp_path}", "logger.mode=offline", "residency=false"])
    out = tmp_path / "job"
    alive_before = job_module.memory_report()["live_models"]  # models an earlier test on this worker still holds
    with caplog.at_level(logging.WARNING):
        job_module.run_job(cfg, out)  # a job logs its warnings once each (console.job_console)
    warned = [r.getMessage() for r in caplog.records if r.name == "steer_hydra.warnings"]
    assert any(
        re.search("UserWarning: W&B init failed .*offline dir not writable.*results stay on disk", w) for w in warned
    )
    assert (out / "results.csv").exists() and (out / "job_record.json").exists()
    record = json.loads((out / "job_record.json").read_text())
    assert record["memory_after_release"]["live_models"] == alive_before  # released (residency=false keeps nothing)
    assert record["memory_after_release"]["resident"] is None


def test_protocol_guard_refuses_a_changed_protocol_in_the_same_save_dir(compose_cfg, tmp_path):
    plan = JobPlan.from_config(compose_cfg([f"output_root={tmp_path}"]))
    plan.claim_protocol()
    JobPlan.from_config(compose_cfg([f"output_root={tmp_path}", "arm=pasta"])).check_protocol()  # arms may differ
    changed = JobPlan.from_config(compose_cfg([f"output_root={tmp_path}", "generate_defaults.temperature=0.7"]))
    with pytest.raises(
        ConfigError, match=r"smoke.json; changed: generate_defaults.temperature: 0 -> 0.7\).*experiment"
    ):
        changed.check_protocol()
    with pytest.raises(ConfigError, match="another protocol"):
        changed.claim_protocol()  # the claim checks again, under the lock
    plan.release_claim()
    assert plan.protocol_path.exists() is False  # nothing was evaluated under it: no claim remains


def test_a_job_that_evaluated_nothing_leaves_no_claim_and_a_later_protocol_runs(compose_cfg, tmp_path, monkeypatch):
    from steer_hydra.evaluation.suite import InspectSuite

    original = InspectSuite.run

    def broken(self, *args, **kwargs):
        raise RuntimeError("No inspect tasks were found")

    monkeypatch.setattr(InspectSuite, "run", broken)
    with pytest.raises(RuntimeError, match="No inspect tasks"):
        job_module.run_job(compose_cfg([f"output_root={tmp_path}", "suite.limit=1", "logger=none"]), tmp_path / "a")
    save_dir = tmp_path / "default" / "tiny" / "seed_0"
    assert not (save_dir / "protocol" / "smoke.json").exists()
    monkeypatch.setattr(InspectSuite, "run", original)
    job_module.run_job(compose_cfg([*FAST, f"output_root={tmp_path}", "logger=none"]), tmp_path / "b")
    assert (save_dir / "protocol" / "smoke.json").exists()


def test_a_job_whose_cells_are_complete_loads_no_model_and_plots_only_when_asked(compose_cfg, tmp_path, monkeypatch):
    from steer_hydra.evaluation import runner as runner_module

    cfg = compose_cfg([*FAST, f"output_root={tmp_path}", "logger=none", "arm=system_prompt"])
    job_module.run_job(cfg, tmp_path / "first")
    first = json.loads((tmp_path / "first" / "job_record.json").read_text())
    assert first["results_reused"] is False

    def no_model(self, controls):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(runner_module.PipelineFactory, "steered", no_model)
    job_module.run_job(cfg, tmp_path / "again")
    again = json.loads((tmp_path / "again" / "job_record.json").read_text())
    assert again["results_reused"] is True and again["metrics"] == first["metrics"]
    assert (tmp_path / "again" / "results.csv").read_text() == (tmp_path / "first" / "results.csv").read_text()
    assert [p.name for p in (tmp_path / "first").glob("*.png")] == ["metrics.png"]  # no baseline here: no deltas

    # plots=false (a study's jobs): the same cells and tables, no plots
    job_module.run_job(
        compose_cfg([*FAST, f"output_root={tmp_path}", "logger=none", "arm=system_prompt", "plots=false"]),
        tmp_path / "bare",
    )
    assert (tmp_path / "bare" / "results.csv").read_text() == (tmp_path / "first" / "results.csv").read_text()
    assert (tmp_path / "bare" / "results_table.csv").is_file() and not list((tmp_path / "bare").glob("*.png"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["arm=nope"], ["Could not find 'arm/nope'", "Available options in 'arm'", "baseline", "pasta"]),
        (["arm=pasta", "arm.controls.pasta.alpha=-1"], ["invalid configuration", "arm.controls.pasta", "alpha"]),
        (["suite.limit=abc"], ["'abc'", "suite.limit"]),
    ],
)
def test_bad_overrides_fail_fast_and_write_no_results(run_main, tmp_path, overrides, expected):
    code, _, stderr = run_main(*overrides, "logger.mode=offline")
    assert code != 0
    for text in expected:
        assert text in stderr, (text, stderr[-2000:])
    outputs = tmp_path / "outputs"
    written = [p for p in outputs.rglob("*") if p.is_file()] if outputs.exists() else []
    assert not [p for p in written if p.name in ("results.csv", "job_record.json") or p.suffix == ".eval"]
    assert not [p for p in written if "wandb" in p.parts]


def test_the_protocol_records_the_served_model_not_how_the_suite_runs(compose_cfg, tmp_path):
    from types import SimpleNamespace

    def served(name):
        return SimpleNamespace(backend_identity=lambda: {"kind": "vllm_serve", "served_model": name})

    plan = JobPlan.from_config(compose_cfg([f"output_root={tmp_path}"]))
    assert not {"retry_attempts", "retry_on_error", "max_tasks"} & set(plan.protocol()["suite"])
    plan.claim_protocol("c", 0, "smoke", pipeline=served("model-a"))
    assert json.loads(plan.protocol_path.read_text())["backend"]["identity"]["served_model"] == "model-a"
    retried = JobPlan.from_config(
        compose_cfg([f"output_root={tmp_path}", "suite.retry_attempts=3", "suite.max_tasks=3"])
    )
    retried.check_protocol()  # before load the identity is unknown: only the rest is compared
    retried.claim_protocol("c", 0, "smoke", pipeline=served("model-a"))  # same served model: joins
    other = JobPlan.from_config(compose_cfg([f"output_root={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"backend.identity.served_model: '?model-a'? -> '?model-b'?"):
        other.claim_protocol("c", 0, "smoke", pipeline=served("model-b"))
    retried.release_claim()
    plan.release_claim()
