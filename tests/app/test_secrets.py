"""No secret is written: override values of secret-named keys stay out of every file, pickle, the console and W&B,
whatever fails; a sweep's jobs read them from the environment and still get the real values."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest
from app_helpers import files_holding, read_run, zip_members
from omegaconf import OmegaConf

from steer_hydra.app.redaction import install_log_redaction
from steer_hydra.app.secrets import (
    REDACTED,
    SECRET_ENV_PREFIX,
    Redactor,
    is_secret_override,
    move_to_environment,
    override_secrets,
    redact_overrides,
)

SWEEP_SECRETS = ("SENTINEL_sweep_aaa111", "SENTINEL_sweep_bbb222")
KEY_SECRET = "SENTINEL_apikey_ccc333"
ENV_SECRET = "hf_SENTINEL_env_ddd444"
SHORT = "zq9"  # shorter than Redactor.MIN_BARE: redacted as key=value only
JOB = ["model=tiny", "suite.limit=1", "suite.generate_overrides.max_tokens=4", "logger=none", "progress=false"]

# Test controls: building one records in $PROBE_DIR a digest of the job's resolved `secret_token` (the value the job
# really got) and whether its config reads it from the environment; FailingProbe's `steer()` then fails the job as a
# refused server would, quoting the token in its error.
PROBE = """
import hashlib
import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from steer_hydra.core import InputControl


class Probe(InputControl):
    supports_batching = True

    def _configure(self):  # built in every job, even one whose results are reused
        job = HydraConfig.get()
        config = job._get_parent()  # the job's whole config
        value = str(config.secret_token)  # resolved here
        reads_env = OmegaConf.is_interpolation(config, "secret_token")
        name = f"digest_{OmegaConf.select(job, 'job.num', default='run')}.txt"
        Path(os.environ["PROBE_DIR"], name).write_text(f"{hashlib.sha256(value.encode()).hexdigest()} {reads_env}")

    def adapt_messages(self, messages_batch, runtime_kwargs):
        return messages_batch


class FailingProbe(Probe):
    def steer(self, model, tokenizer=None, **kwargs):
        raise RuntimeError(f"the server refused token {HydraConfig.get()._get_parent().secret_token}")
"""


def _probe_arms(root: Path) -> tuple[str, Path]:
    """Arms `probe` and `failing_probe` in a user config dir; returns (the searchpath override, the digest dir)."""
    arms = root / "user_conf" / "arm"
    arms.mkdir(parents=True)
    for name, cls in (("probe", "Probe"), ("failing_probe", "FailingProbe")):
        (arms / f"{name}.yaml").write_text(
            f"# @package arm\nname: {name}\ncontrols:\n  p:\n    _target_: secret_probe.{cls}\n"
        )
    (root / "secret_probe.py").write_text(PROBE)
    (root / "digests").mkdir()
    return f"hydra.searchpath=[file://{root / 'user_conf'}]", root / "digests"


def _digest(value: str, reads_env: bool) -> str:
    """What a probe records for a job that got `value` (`reads_env`: through an `${oc.env:...}` interpolation)."""
    return f"{hashlib.sha256(value.encode()).hexdigest()} {reads_env}"


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


def test_a_secret_override_moves_to_the_environment_and_back_into_the_job_config():
    taken: set[str] = set()
    single = move_to_environment(f"+my.api_key={KEY_SECRET}", taken)
    sweep = move_to_environment(f"+secret_token={SWEEP_SECRETS[0]},{SWEEP_SECRETS[1]}", taken)
    assert single.environ == {f"{SECRET_ENV_PREFIX}MY_API_KEY": KEY_SECRET}
    assert single.reference == "${oc.env:" + SECRET_ENV_PREFIX + "MY_API_KEY}"
    assert list(sweep.environ.values()) == list(SWEEP_SECRETS) and sweep.reference is None
    assert not [s for s in (*SWEEP_SECRETS, KEY_SECRET) if s in single.line + sweep.line]
    # the override lines are inert text in a config (Hydra's escaped form), and parse back to the references
    lines = OmegaConf.create({"task": [single.line, sweep.line]})
    assert list(lines.task) == [single.line, sweep.line]
    assert Redactor([single.line, sweep.line], environ={**single.environ, **sweep.environ}).values >= {
        KEY_SECRET,
        *SWEEP_SECRETS,
    }
    assert move_to_environment("+api_token=${oc.env:MY_TOKEN}", taken) is None  # already read from the environment
    assert move_to_environment("arm=pasta", taken) is None and move_to_environment("~api_token", taken) is None


@pytest.mark.slow
def test_submitit_pickles_and_logs_hold_no_secret_and_the_job_gets_it(run_app, tmp_path):
    """submitit_local pickles each job's overrides and config, and a failed job's error, under `.submitit/`, and runs
    each job in its own process: the pickles hold only references to the environment, the job still resolves the
    real value, and the failing job's error (which quotes the token) is pickled redacted."""
    searchpath, digests = _probe_arms(tmp_path)
    env = {
        "HF_TOKEN": ENV_SECRET,
        "PROBE_DIR": str(digests),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    secrets = (SWEEP_SECRETS[0], KEY_SECRET, ENV_SECRET)
    sweep = run_app(
        "--multirun",
        "hydra/launcher=submitit_local",
        "arm=probe,failing_probe",
        searchpath,
        f"+secret_token={SWEEP_SECRETS[0]}",
        f"+my.api_key={KEY_SECRET}",
        *JOB,
        env=env,
        timeout=600,
    )
    console = sweep.stdout + sweep.stderr
    assert sweep.returncode != 0 and "the server refused token ***" in console, console[-3000:]
    outputs = tmp_path / "outputs"
    assert (digests / "digest_0.txt").read_text() == _digest(SWEEP_SECRETS[0], True)  # the job got the value
    assert (digests / "digest_1.txt").read_text() == _digest(SWEEP_SECRETS[0], True)
    results = list(outputs.rglob(".submitit/*/*_result.pkl"))
    assert len(results) == 2 and list(outputs.rglob(".submitit/*/*_submitted.pkl"))  # both jobs ran, one failed
    assert list(outputs.rglob(".submitit/*/*_log.out"))
    assert files_holding(outputs, secrets) == []
    assert not [s for s in secrets if s in console]
    reference = "+secret_token=$\\{oc.env\\:" + SECRET_ENV_PREFIX + "SECRET_TOKEN\\}"
    assert reference in console  # the launch line: what the job reads


def _secret_env_names() -> list[str]:
    return [name for name in os.environ if name.startswith(SECRET_ENV_PREFIX)]


def test_a_failed_job_or_a_refused_config_shows_and_writes_no_secret(run_main, tmp_path, monkeypatch):
    """Hydra prints a failed job's overrides (`Error executing job with overrides: [...]`) and its error, and a
    composition error quotes the override line; none of it shows a value."""
    secret = "SENTINEL_failed_run_eee555"
    searchpath, digests = _probe_arms(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PROBE_DIR", str(digests))
    code, out, err = run_main("arm=failing_probe", searchpath, f"+secret_token={secret}", *JOB)
    assert code == 1 and "Error executing job with overrides" in err, err[-3000:]
    assert f"+secret_token={REDACTED}" in err and f"the server refused token {REDACTED}" in err
    assert (digests / "digest_run.txt").read_text() == _digest(secret, False)  # the job had the value
    consoles = [out + err]

    code, out, err = run_main(f"api_token={secret}", *JOB)  # without `+`: Hydra says "use +api_token=<value>"
    assert code == 1 and f"+api_token={REDACTED}" in err, err[-3000:]
    consoles.append(out + err)
    code, out, err = run_main(
        "backend=vllm_serve", "backend.options.base_url=http://127.0.0.1:1", f"+backend.options.api_key={secret}"
    )
    assert code == 1 and "backend.options.api_key holds a secret" in err, err[-3000:]
    consoles.append(out + err)
    assert not [console for console in consoles if secret in console]
    assert files_holding(tmp_path / "outputs", (secret,)) == []


def test_a_sweep_hands_its_jobs_secrets_through_the_environment(run_main, tmp_path, monkeypatch):
    """Basic launcher: each job resolves its sweep value from the environment; no file, W&B record or console
    line holds a value."""
    searchpath, digests = _probe_arms(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PROBE_DIR", str(digests))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    secrets = (*SWEEP_SECRETS, KEY_SECRET, ENV_SECRET)
    code, out, err = run_main(
        "--multirun",
        "arm=probe",
        searchpath,
        f"+secret_token={SWEEP_SECRETS[0]},{SWEEP_SECRETS[1]}",
        f"+my.api_key={KEY_SECRET}",
        *[o for o in JOB if o != "logger=none"],
    )
    assert code == 0, err[-3000:]
    assert [(digests / f"digest_{n}.txt").read_text() for n in (0, 1)] == [_digest(s, True) for s in SWEEP_SECRETS]
    assert _secret_env_names() == []  # removed at the end of the sweep
    assert not [s for s in secrets if s in out + err]
    outputs = tmp_path / "outputs"
    members = [data for log in outputs.rglob("*.eval") for _, data in zip_members(log)]
    assert any(b"steer_hydra/short_answer" in data for data in members)  # the logs were really read
    assert files_holding(outputs, secrets) == []
    overrides = next(outputs.rglob("multiruns/*/0_*/.hydra/overrides.yaml")).read_text()
    assert f"+secret_token={REDACTED}" in overrides and f"+my.api_key={REDACTED}" in overrides
    records = list(outputs.rglob("run-*.wandb"))
    assert len(records) >= 3, err[-2000:]  # one per job and the sweep summary run, scanned like all files
    assert all(read_run(record)[0] for record in records)  # readable, and (checked above) free of the values


URL_PASSWORD = "SENTINEL_urlpass_hhh888"


def test_mask_url_credentials_keeps_the_user_and_host_and_hides_the_password():
    from steer_hydra.app.secrets import mask_url_credentials

    assert mask_url_credentials("http://me:pw123@host:8000/v1") == f"http://me:{REDACTED}@host:8000/v1"
    # as Hydra writes an override value, with its colons escaped
    assert mask_url_credentials(r"x=http\://me\:pw123@h\:1/v1") == rf"x=http\://me\:{REDACTED}@h\:1/v1"
    assert mask_url_credentials("mail me@host.org at http://host:80/v1") == "mail me@host.org at http://host:80/v1"
    assert redact_overrides(["backend.options.base_url=https://u:pw123@h/v1"]) == [
        f"backend.options.base_url=https://u:{REDACTED}@h/v1"
    ]


@pytest.mark.slow
def test_a_password_inside_a_url_reaches_no_file_and_no_console_line(run_app, tmp_path, tiny_server):
    """A sweep of two jobs on backend=vllm_serve whose base_url carries `user:password@`: one runs against the
    loopback server (every file a job writes, W&B's offline run), one is refused (the sweep's missing_cells.json and
    re-run lines)."""
    good = tiny_server.base_url.replace("http://", f"http://me:{URL_PASSWORD}@")
    down = f"http://me:{URL_PASSWORD}@127.0.0.1:1"
    done = run_app(
        "--multirun",
        "backend=vllm_serve",
        f'backend.options.base_url="{good}","{down}"',
        "backend.options.retry_backoff=0",
        *[o for o in JOB if o != "logger=none"],
    )
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 1, err[-3000:]  # the second job is refused
    outputs = tmp_path / "outputs"
    assert list(outputs.rglob("job_record.json")) and list(outputs.rglob("missing_cells.json"))  # both ran
    assert list(outputs.rglob("*.eval")) and list(outputs.rglob("main.log"))
    assert f"me:{REDACTED}@127.0.0.1" in out + err  # the URL is still shown, without its password
    assert URL_PASSWORD not in out + err
    assert files_holding(outputs, (URL_PASSWORD,)) == []


def test_the_sweeps_multirun_yaml_is_redacted_once_per_process_and_again_when_written_again(tmp_path, monkeypatch):
    from steer_hydra.app.redaction import RedactSecrets

    def write() -> None:
        saved = {"hydra": {"overrides": {"task": [f"+secret_token={KEY_SECRET}", "seed=1"], "hydra": []}}}
        OmegaConf.save(OmegaConf.create(saved), tmp_path / "multirun.yaml")

    loads = []
    original = OmegaConf.load
    monkeypatch.setattr(OmegaConf, "load", lambda path: loads.append(path) or original(path))
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback = RedactSecrets()
    write()
    callback._redact_multirun_yaml(config)  # the first job of the sweep
    assert KEY_SECRET not in (tmp_path / "multirun.yaml").read_text() and len(loads) == 1
    callback._redact_multirun_yaml(config)  # the next job of this process: the file is as it was left
    assert len(loads) == 1
    write()  # written again (a sweeper saving it anew): redacted again
    callback._redact_multirun_yaml(config)
    assert KEY_SECRET not in (tmp_path / "multirun.yaml").read_text() and len(loads) == 2
