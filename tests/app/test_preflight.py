"""Bad input is refused before any model loads, in one line that names the config key and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from steer_hydra.app import job as job_module
from steer_hydra.app import preflight as preflight_module
from steer_hydra.app.preflight import model_context, preflight
from steer_hydra.core.errors import ConfigError

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
    (["num_trials=0"], ["num_trials=0", "at least one", "Fix: num_trials=1"]),
    (["arm=caa", "arm.controls.caa.layer_id=40"], ["arm.controls.caa.layer_id=40 is out of range", "2 decoder layers"]),
    (["arm=pasta", "arm.controls.pasta.head_config=[0,7]"], ["arm.controls.pasta.head_config names layer 7"]),
    (
        ["arm=directional_ablation", "arm.controls.ablation.layers=[0,5]"],
        ["arm.controls.ablation.layers names layer 5", "2 decoder layers"],
    ),
    (
        ["arm=pasta", "~arm.controls.pasta.head_config", "+arm.controls.pasta.head_config={1:[0,9]}"],
        ["arm.controls.pasta.head_config names heads [9] of layer 1", "4 attention heads per layer"],
    ),
    (
        ["+suite.generate_overrides.fail_on_error=false"],
        ["suite.generate_overrides.fail_on_error=False", "re-running the command retries it", "suite.retry_on_error"],
    ),
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
    # fail_on_error other than true is refused (a re-run would not retry the failures); true is the suite's own
    preflight(compose_cfg(["+generate_defaults.fail_on_error=true", "+generate_defaults.max_connections=2"]))
    for arm in ("pasta", "caa", "actadd"):  # the packaged arms' layers fit the tiny model
        preflight(compose_cfg([f"arm={arm}"]))
    preflight(compose_cfg(["arm=pasta"], default_model=True))  # SmolLM2: arm_model/pasta_smollm2 picks layers 10-13


MORE_BAD_SETTINGS = [
    (["num_trials=-2"], ["num_trials=-2", "Fix: num_trials=1"]),
    (["arm=actadd", "arm.controls.actadd.layer_id=2"], ["arm.controls.actadd.layer_id=2", "(0..1; num_hidden_layers"]),
    (["+generate_defaults.fail_on_error=0.5"], ["generate_defaults.fail_on_error=0.5", "suite.retry_attempts=N"]),
    (["+suite.generate_overrides.continue_on_fail=false"], ["continue_on_fail=False", "Fix: remove"]),
    (["+suite.generate_overrides.retry_attempts=3"], ["Fix: suite.retry_attempts=3 instead"]),
    (["+suite.generate_overrides.max_tasks=3"], ["how the suite runs", "Fix: suite.max_tasks=3 instead"]),
]


@pytest.mark.parametrize(("overrides", "expected"), MORE_BAD_SETTINGS, ids=[" ".join(c[0]) for c in MORE_BAD_SETTINGS])
def test_more_bad_settings_are_refused_naming_the_key(overrides, expected, compose_cfg):
    with pytest.raises(ConfigError) as info:
        preflight(compose_cfg(overrides))
    assert "\n" not in str(info.value) and "Fix:" in str(info.value)
    for text in expected:
        assert text in str(info.value), (text, str(info.value))


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


def test_a_forced_vllm_v2_runner_is_refused_before_anything_loads(compose_cfg, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ConfigError, match=r"VLLM_USE_V2_MODEL_RUNNER=1 forces vLLM's V2 model runner.*Fix: unset"):
        preflight(compose_cfg(["backend=vllm"]))
    preflight(compose_cfg([]))  # other backends do not care
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    try:
        preflight(compose_cfg(["backend=vllm"]))
    except ConfigError as error:  # where vllm is not installed, that is refused; V2 is not
        assert "V2" not in str(error)


def test_a_control_the_backend_cannot_run_is_refused_in_one_line_before_wandb_or_a_model(run_main, monkeypatch):
    """PASTA edits attention in process, which no vLLM engine runs."""
    from steer_hydra.evaluation import runner as runner_module

    monkeypatch.setattr(preflight_module, "check_backend", lambda plain: [])  # as where vllm is installed
    monkeypatch.setattr(runner_module.PipelineFactory, "steered", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    code, out, err = run_main("arm=pasta", "backend=vllm", "model=tiny", "suite.limit=1", "progress=false")
    lines = [line for line in err.splitlines() if "invalid configuration" in line]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "pasta [" in lines[0] and "needs in_process_torch, which backend 'vllm' does not offer" in lines[0]
    assert "Fix: use backend=huggingface" in lines[0]
    assert not [p for p in Path("outputs").rglob("*") if p.name == "wandb"]  # refused before W&B started


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
    for overrides in ([], ["model=tiny"], ["model=tiny", "arm=pasta"]):  # SmolLM2, the tiny model, layer checks
        preflight(compose("config", overrides=overrides))
print(sorted(m for m in ("tokenizers", "transformers") if m in sys.modules))
"""


def test_checking_a_job_imports_neither_transformers_nor_tokenizers():
    # a bad command is refused before the heaviest imports (about 2 s of the time to the error line)
    proc = subprocess.run([sys.executable, "-c", PREFLIGHT_IMPORTS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------- directories
def _created(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_name_that_escapes_the_output_root_creates_no_directory(run_main, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(job_module, "run_job", lambda *a, **k: started.append(True))
    output_root = tmp_path / "a" / "b" / "outputs"
    code, out, err = run_main("logger=none", f"output_root={output_root}", "experiment_name=../../escape")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and not started
    assert lines == [lines[0]] and lines[0].startswith("steer_hydra: invalid configuration: experiment_name="), err
    assert "one plain path component" in lines[0] and "Fix: experiment_name=<name>" in lines[0]
    assert "Traceback" not in err + out
    assert _created(tmp_path) == [], "Hydra created its run directory (or main.log, .hydra/) before the check"


def test_a_swept_arm_name_that_escapes_creates_nothing_outside_the_output_root(run_main, tmp_path, monkeypatch):
    from steer_hydra.app import callbacks

    started, at_exit = [], []
    monkeypatch.setattr(job_module, "run_job", lambda *a, **k: started.append(True))
    monkeypatch.setattr(callbacks.atexit, "register", at_exit.append)  # the failed sweep's aggregation: run below
    output_root = tmp_path / "a" / "b" / "outputs"
    code, out, err = run_main(
        "--multirun", "model=tiny", "logger=none", f"output_root={output_root}", "arm.name=../../../../../../escape"
    )
    assert code == 1 and not started, (out, err)
    refusals = [line for line in err.splitlines() if line.startswith("steer_hydra: invalid configuration: ")]
    assert len(refusals) == 1 and "arm.name='../../../../../../escape'" in refusals[0], err
    assert "Traceback" not in err + out
    for hook in at_exit:
        hook()
    outside = [p for p in _created(tmp_path) if not p.startswith("a/b/outputs")]
    assert outside == ["a", "a/b"], outside  # the output root's own parents; nothing escaped
    assert not [p for p in tmp_path.rglob("*escape*")]
    assert not list(output_root.rglob("main.log")) and not list(output_root.rglob(".hydra"))


def test_the_directory_resolvers_refuse_in_one_line_naming_the_key(compose_cfg, tmp_path):
    from steer_hydra.app.schema import dir_name_problem, writable_dir_problem

    for bad in ("", "..", "a/b", "a\\b", "~x", ".", "x..y"):
        assert "Fix: arm.name=<name>" in dir_name_problem("arm.name", bad), bad
    assert dir_name_problem("arm.name", "pasta-v2.1_x") is None
    assert writable_dir_problem("output_root", tmp_path / "not" / "yet") is None  # creatable
    cfg = compose_cfg(["experiment_name=a/b"], return_hydra_config=True)
    with pytest.raises(SystemExit) as info:  # Hydra's own directories: exit with the line, before any mkdir
        str(cfg.hydra.run.dir)
    assert str(info.value.code).startswith("steer_hydra: invalid configuration: experiment_name='a/b'")
    with pytest.raises(Exception, match="experiment_name='a/b' becomes a directory name") as raised:
        str(compose_cfg(["experiment_name=a/b"]).save_dir)  # elsewhere: a ConfigError, which pre-flight reports
    assert isinstance(preflight_module._config_error_in(raised.value), ConfigError)


@pytest.mark.parametrize("key", ["output_root", "save_dir"])
def test_an_output_directory_under_a_file_is_refused_before_anything_is_written(key, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "sub"
    code, started, _ = _run_main([f"{key}={target}"], tmp_path, monkeypatch)
    assert not started and isinstance(code, str) and "\n" not in code, code
    assert code.startswith("steer_hydra: invalid configuration: ") and f"{key}='{target}' cannot be created" in code
    assert f"its parent '{tmp_path / 'afile'}' is a file, not a directory" in code and f"Fix: {key}=" in code
    # output_root is refused before Hydra's run directory exists; save_dir (created by the job) before any write
    created = [p.relative_to(tmp_path).parts for p in tmp_path.rglob("*") if p.name != "afile"]
    run_dir = [parts for parts in created if parts[:2] != ("default", "runs") and parts != ("default",)]
    assert (not run_dir) if key == "save_dir" else not created, created


def test_an_unwritable_save_dir_is_refused_naming_the_key(compose_cfg, tmp_path):
    """/proc refuses new entries even to root (for whom permission bits say everything is writable)."""
    target = "/proc/steer_hydra_check/results"
    cfg = compose_cfg([f"output_root={tmp_path / 'out'}", f"save_dir={target}"])
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    message = str(info.value)
    assert f"save_dir='{target}' is not writable: its nearest existing parent '/proc' refuses new entries" in message
    assert "Fix: save_dir=<a directory you can write to>" in message and "output_root" not in message
    assert not list((tmp_path).rglob("*"))  # nothing written, not even the output root


# ---------------------------------------------------------------------------------------------- catalog datasets
def test_uncached_catalog_data_offline_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    looked_up = []
    monkeypatch.setattr(preflight_module, "catalog_installed", lambda: True)
    monkeypatch.setattr(preflight_module, "_task_problem", lambda name: None)  # as if inspect_evals were installed
    monkeypatch.setattr(preflight_module, "dataset_cached", lambda repo_id: looked_up.append(repo_id) or False)
    code, started, elapsed = _run_main(["suite=capability"], tmp_path, monkeypatch)  # HF_HUB_OFFLINE=1
    assert not started and isinstance(code, str) and "\n" not in code, code
    assert code.startswith("steer_hydra: invalid configuration: suite.tasks: the task data is not in the local")
    for text in (
        "inspect_evals/gsm8k (openai/gsm8k), inspect_evals/mmlu_0_shot (cais/mmlu)",
        "HF_HUB_OFFLINE=1",
        "Fix: suite=capability_offline",
        "hf download --repo-type dataset openai/gsm8k",
        "hf download --repo-type dataset allenai/ai2_arc",
    ):
        assert text in code, (text, code)
    assert looked_up == ["openai/gsm8k", "cais/mmlu", "allenai/ai2_arc"] and elapsed < 60


def test_catalog_data_online_is_looked_up_once_with_a_bounded_timeout(compose_cfg, monkeypatch):
    from huggingface_hub import HfApi

    seen = []

    def unreachable(self, repo_id, *, timeout=None, **kwargs):
        seen.append((repo_id, timeout))
        raise OSError("network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(preflight_module, "catalog_installed", lambda: True)
    monkeypatch.setattr(preflight_module, "dataset_cached", lambda repo_id: repo_id == "cais/mmlu")
    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    plain = preflight_module.to_plain(compose_cfg(["suite=capability"]))
    (problem,) = preflight_module.check_datasets(plain)
    assert seen == [("openai/gsm8k", preflight_module.HUB_TIMEOUT)]  # no Hub: the other datasets are not tried
    listed = "inspect_evals/gsm8k (openai/gsm8k), inspect_evals/arc_challenge (allenai/ai2_arc): the Hub did not"
    assert listed in problem
    assert "within 5s (OSError)" in problem and "mmlu" not in problem  # a cached dataset is fine

    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kwargs: seen.append(repo_id))
    assert preflight_module.check_datasets(plain) == []  # the Hub answers: the run can download them


def test_the_dataset_check_costs_nothing_without_catalog_tasks(compose_cfg, monkeypatch):
    def never(*args):
        raise AssertionError("looked up a dataset for a suite without inspect_evals tasks")

    monkeypatch.setattr(preflight_module, "catalog_installed", never)
    monkeypatch.setattr(preflight_module, "catalog_datasets", never)
    assert preflight_module.check_datasets(preflight_module.to_plain(compose_cfg(["suite=capability_offline"]))) == []


def test_catalog_datasets_come_from_the_table_or_the_task_source(tmp_path, monkeypatch):
    assert preflight_module.catalog_datasets("inspect_evals/gsm8k") == ("openai/gsm8k",)
    folder = tmp_path / "some_eval"
    folder.mkdir()
    (folder / "task.py").write_text(
        'DATASET_PATH = "org/first"\\n'
        "def load():\\n"
        '    return hf_dataset(path="org/second", split="test", revision="abc")\\n'
        'other = load_dataset("org/third", "cfg")\\n'
        'not_a_dataset = "org/fourth"\\n'
    )
    assert preflight_module.datasets_in_source(folder) == ("org/second", "org/third", "org/first")


def test_a_dataset_counts_as_cached_in_the_hub_or_datasets_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert not preflight_module.dataset_cached("openai/gsm8k")
    (tmp_path / "hub" / "datasets--openai--gsm8k" / "snapshots" / "abc").mkdir(parents=True)
    assert preflight_module.dataset_cached("openai/gsm8k")
    (tmp_path / "datasets" / "cais___mmlu").mkdir(parents=True)
    assert preflight_module.dataset_cached("cais/mmlu") and not preflight_module.dataset_cached("allenai/ai2_arc")


def test_a_task_file_without_the_named_task_is_refused_naming_its_tasks(compose_cfg, tmp_path):
    tasks = tmp_path / "my_tasks.py"
    tasks.write_text(
        "from inspect_ai import Task, task\n\n\n@task\ndef arithmetic():\n    return Task()\n\n\n"
        "@task(name='x')\ndef trivia():\n    return Task()\n\n\ndef helper():\n    pass\n"
    )
    cfg = compose_cfg([f"suite.tasks=[{tasks}@aritmetic]"])
    with pytest.raises(ConfigError) as refused:
        preflight(cfg)
    message = str(refused.value)
    assert f"suite.tasks[0]='{tasks}@aritmetic': task file '{tasks}' has no task 'aritmetic'" in message
    assert "it defines ['arithmetic', 'trivia']" in message and "Fix:" in message
    preflight(compose_cfg([f"suite.tasks=[{tasks}@arithmetic]"]))  # the right name passes
    (tmp_path / "broken.py").write_text("def oops(:\n")
    with pytest.raises(ConfigError, match=r"cannot be read: it does not parse \(line 1"):
        preflight(compose_cfg([f"suite.tasks=[{tmp_path / 'broken.py'}@oops]"]))
