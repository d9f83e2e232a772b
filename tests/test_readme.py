"""The README's fenced examples stay true: every command is run (offline ones, with the tiny model and small limits)
or composed (those that need a GPU, the Hub or a cluster), every arm YAML runs from a user's search path, and every
Python example's imports resolve."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SMALL = ["logger=none", "suite.limit=1", "suite.generate_overrides.max_tokens=4", "progress=false"]
# commands that need a GPU, the Hub, a cluster or a long time: composed and planned, not run
NOT_OFFLINE = ("llama", "qwen", "smollm2-135m", "suite=capability", "suite=instruction_following", "submitit_slurm",
               "backend=vllm", "experiment=concept_steering")  # fmt: skip


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """`(language, body)` of every fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def commands(body: str) -> list[list[str]]:
    """A bash block's commands as argument lists (continuation lines joined, comments dropped)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        args = shlex.split(line, comments=True)
        if args:
            out.append(args)
    return out


def _readme_commands() -> list[list[str]]:
    return [c for lang, body in fenced_blocks(README.read_text()) if lang == "bash" for c in commands(body)]


def kind(args: list[str]) -> str:
    """run | compose | view | aggregate | setup: what the test does with a README command."""
    if args[0].startswith("scripts/"):
        return "setup"
    if args[:2] == ["inspect", "view"]:
        return "view"
    if args[:3] == ["python", "-m", "steer_hydra.aggregate"]:
        return "aggregate"
    if args[:3] == ["python", "-m", "steer_hydra"]:
        return "compose" if any(marker in " ".join(args) for marker in NOT_OFFLINE) else "run"
    return "unknown"


def test_every_readme_command_is_one_the_test_knows():
    found = _readme_commands()
    assert len(found) >= 8
    unknown = [shlex.join(c) for c in found if kind(c) == "unknown"]
    assert not unknown, f"README commands this test cannot run or check: {unknown}. Fix: teach tests/test_readme.py"


def _small(args: list[str], number: int) -> list[str]:
    """The command with the tiny model, small limits, no W&B, its own experiment, and sweeps cut short: one seed,
    two values of other keys (a baseline and an arm), one job in all under a launcher that starts processes."""
    out = []
    one_job = any(a.startswith("hydra/launcher=") for a in args)
    for arg in args[3:]:
        key, _, value = arg.partition("=")
        if "," in value and "--multirun" in args and not value.startswith("["):
            arg = f"{key}={','.join(value.split(',')[: 1 if one_job or key == 'seed' else 2])}"
        out.append(arg)
    chosen = {a.split("=", 1)[0].lstrip("+~") for a in out}
    extra = ([] if "model" in chosen else ["model=tiny"]) + SMALL
    return [*out, *extra, *([] if number == 0 else [f"experiment_name=readme{number}"])]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _main_in_process(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> str:
    from hydra.core.global_hydra import GlobalHydra

    from steer_hydra import main as main_module

    monkeypatch.chdir(cwd)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", ["steer_hydra", *args])
    GlobalHydra.instance().clear()
    try:
        main_module.main()
    finally:
        GlobalHydra.instance().clear()
    return capsys.readouterr().out


@pytest.mark.slow
def test_offline_readme_commands_run_and_their_paths_exist(tmp_path, monkeypatch, capsys):
    found = _readme_commands()
    runs = [c for c in found if kind(c) == "run"]
    assert runs
    for number, args in enumerate(runs):
        small = _small(args, number)
        if "--multirun" in args or "--help" in args:  # a sweep and its launcher: the real command line
            proc = _run(["-m", "steer_hydra", *small], tmp_path)
            assert proc.returncode == 0, (shlex.join(args), proc.stderr[-3000:])
            out = proc.stdout
        else:  # one job: the same entry point in this process (no interpreter start per example)
            out = _main_in_process(small, tmp_path, monkeypatch, capsys)
        if "--help" not in args:
            assert "Inspect logs: inspect view --log-dir" in out or "Sweep" in out, (shlex.join(args), out[-2000:])
    for args in found:
        if kind(args) == "view":  # the README's path, for the model the test ran
            shown = Path(args[args.index("--log-dir") + 1])
            parts = list(shown.parts)
            parts[2] = "tiny"
            assert (tmp_path / Path(*parts)).is_dir(), f"{shown}: no such folder after the README's first command"
        elif kind(args) == "aggregate":
            sweep = sorted((tmp_path / "outputs").glob("*/multiruns/*"))[-1]
            proc = _run(["-m", "steer_hydra.aggregate", str(sweep), "--no-tracking"], tmp_path)
            assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_commands_that_need_a_gpu_or_the_hub_compose_and_plan():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from steer_hydra.app.plan import JobPlan
    from steer_hydra.app.schema import register_configs

    register_configs()
    checked = 0
    for args in _readme_commands():
        if kind(args) != "compose":
            continue
        overrides = [a.split(",")[0] if "," in a and not a.endswith("]") else a for a in args[3:]]
        overrides = [o for o in overrides if not o.startswith(("--", "hydra"))]
        GlobalHydra.instance().clear()
        try:
            with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
                cfg = compose("config", overrides=overrides)
            JobPlan.from_config(cfg)  # every config mistake that needs no model
        finally:
            GlobalHydra.instance().clear()
        checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_readme_arm_yaml_runs_from_a_search_path(tmp_path, monkeypatch, capsys):
    blocks = [body for lang, body in fenced_blocks(README.read_text()) if lang == "yaml" and "@package arm" in body]
    assert blocks
    for number, body in enumerate(blocks):
        name = re.search(r"^name: (\S+)", body, re.M).group(1)
        (tmp_path / "my_conf" / "arm").mkdir(parents=True, exist_ok=True)
        (tmp_path / "my_conf" / "arm" / f"{name}.yaml").write_text(body)
        args = [f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", f"arm={name}", "model=tiny", *SMALL]
        out = _main_in_process([*args, f"experiment_name=yaml{number}"], tmp_path, monkeypatch, capsys)
        assert f"{name} [" in out  # the job's table title names the arm


def test_readme_python_examples_parse_and_their_imports_resolve():
    blocks = [body for lang, body in fenced_blocks(README.read_text()) if lang == "python"]
    assert blocks
    for body in blocks:
        tree = ast.parse(body)
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(body=imports, type_ignores=[]), "README.md", "exec"), {})
