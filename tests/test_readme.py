"""The README's and docs/'s fenced examples stay true: every bash command is run (offline ones, with the tiny model
and small limits) or composed and planned (those that need a GPU, the Hub or a cluster), every arm YAML runs from a
user's search path, every Python example's imports resolve, and every relative link points at a file and heading
that exist. A command that appears in several files is checked once."""

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
DOCS = ROOT / "docs"
SMALL = ["logger=none", "suite.limit=1", "suite.generate_overrides.max_tokens=4", "progress=false"]
# commands that need a GPU, the Hub, a cluster or a long time: composed and planned, not run
NOT_OFFLINE = ("llama", "qwen", "smollm2-135m", "suite=capability", "suite=instruction_following", "submitit_slurm",
               "hydra/launcher=ray", "backend=vllm", "experiment=concept_steering")  # fmt: skip
PYTHONS = ("python", "python3", ".venv/bin/python", ".venv-vllm/bin/python")


def documents() -> list[Path]:
    """The README first, then every page of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """`(language, body)` of every fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def _blocks(language: str) -> list[tuple[Path, str]]:
    """`(file, body)` of every block in `language`, identical bodies once."""
    seen: dict[str, Path] = {}
    for path in documents():
        for lang, body in fenced_blocks(path.read_text()):
            if lang == language:
                seen.setdefault(body, path)
    return [(path, body) for body, path in seen.items()]


def normalize(args: list[str]) -> list[str]:
    """The interpreter spelled `python` whatever its venv, without leading `NAME=value` environment assignments: the
    same command in two files is one command."""
    while args and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", args[0]):
        args = args[1:]
    return ["python", *args[1:]] if args[0] in PYTHONS else args


def commands(body: str) -> list[list[str]]:
    """A bash block's commands as argument lists (continuation lines joined, comments dropped, `a && b` split)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        args = shlex.split(line, comments=True)
        while args:
            cut = args.index("&&") if "&&" in args else len(args)
            out.append(normalize(args[:cut]))
            args = args[cut + 1 :]
    return out


def _doc_commands() -> list[list[str]]:
    """Every bash command of the README and docs/, each distinct one once, in order of first appearance."""
    found: dict[tuple[str, ...], list[str]] = {}
    for _, body in _blocks("bash"):
        for args in commands(body):
            found.setdefault(tuple(args), args)
    return list(found.values())


def kind(args: list[str]) -> str:
    """What the test does with a documented command: run | compose | view | inspect_eval | aggregate | study |
    rescore | setup | cluster (`ray start` on a cluster's nodes: the CLI must exist) | pytest (this suite itself:
    nothing) | unknown."""
    if args[0].startswith("scripts/"):
        return "setup"
    if args[:2] == ["ray", "start"]:
        return "cluster"
    if args[:2] == ["inspect", "view"]:
        return "view"
    if args[:2] == ["inspect", "eval"]:
        return "inspect_eval"
    if args[:3] == ["python", "-m", "pytest"]:
        return "pytest"
    if args[:3] == ["python", "-m", "steer_hydra.aggregate"]:
        return "aggregate"
    if args[:3] == ["python", "-m", "steer_hydra.study"]:
        return "study"
    if args[:3] == ["python", "-m", "steer_hydra.rescore"]:
        return "rescore"
    if args[:3] == ["python", "-m", "steer_hydra"]:
        return "compose" if any(marker in " ".join(args) for marker in NOT_OFFLINE) else "run"
    return "unknown"


def test_every_documented_command_is_one_the_test_knows():
    found = _doc_commands()
    assert len(found) >= 8
    unknown = [shlex.join(c) for c in found if kind(c) == "unknown"]
    assert not unknown, f"Documented commands this test cannot run or check: {unknown}. Fix: teach tests/test_readme.py"
    missing = [shlex.join(c) for c in found if kind(c) == "setup" and not os.access(ROOT / c[0], os.X_OK)]
    assert not missing, f"Documented scripts that are missing or not executable: {missing}"
    if any(kind(c) == "cluster" for c in found):  # the launchers extra installs the `ray` command beside Python
        assert Path(sys.executable).with_name("ray").exists(), "pip install 'steer_hydra[launchers]' installs ray"


def test_readme_starts_with_the_two_commands():
    lang, body = fenced_blocks(README.read_text())[0]
    assert lang == "bash"
    assert [shlex.join(c) for c in commands(body)] == [
        "scripts/setup.sh", "python -m steer_hydra", "scripts/setup.sh --dev", "scripts/test.sh",
    ]  # fmt: skip


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
    except SystemExit as exited:  # --help exits 0 after printing
        assert exited.code in (0, None), (args, exited.code)
    finally:
        GlobalHydra.instance().clear()
    return capsys.readouterr().out


def _inspect_eval_small(args: list[str], log_dir: Path) -> list[str]:
    """An `inspect eval` command with the tiny model, one sample, four tokens and its own log folder."""
    out = list(args[1:])  # from "eval" on
    for i, arg in enumerate(out[:-1]):
        if arg == "-M" and out[i + 1].startswith("base_model="):
            out[i + 1] = "base_model=tiny"
    assert "base_model=tiny" in out, f"{shlex.join(args)}: give the model as -M base_model=..."
    return [*out, "--limit", "1", "--max-tokens", "4", "--log-dir", str(log_dir), "--display", "none"]


@pytest.mark.slow
def test_offline_documented_commands_run_and_their_paths_exist(tmp_path, monkeypatch, capsys):
    found = _doc_commands()
    runs = [c for c in found if kind(c) == "run"]
    assert runs and runs[0] == ["python", "-m", "steer_hydra"], "the first command run must be the default job"
    for number, args in enumerate(runs):
        small = _small(args, number)
        if any(a.startswith("hydra/launcher=") for a in args):  # a launcher that starts processes: the real CLI
            proc = _run(["-m", "steer_hydra", *small], tmp_path)
            assert proc.returncode == 0, (shlex.join(args), proc.stderr[-3000:])
            out = proc.stdout
        else:  # the same entry point in this process (no interpreter start per example), sweeps included
            out = _main_in_process(small, tmp_path, monkeypatch, capsys)
        if "--help" not in args:
            assert "Inspect logs: inspect view --log-dir" in out or "Sweep" in out, (shlex.join(args), out[-2000:])
    for args in found:
        if kind(args) == "view":  # the documented path, for the model the test ran
            shown = Path(args[args.index("--log-dir") + 1])
            parts = list(shown.parts)
            parts[2] = "tiny"
            assert (tmp_path / Path(*parts)).is_dir(), f"{shown}: no such folder after the default job"
        elif kind(args) == "aggregate":  # its own entry point, in this process
            from steer_hydra.aggregate import main as aggregate_main

            sweep = sorted((tmp_path / "outputs").glob("*/multiruns/*"))[-1]
            assert aggregate_main([str(sweep), "--no-tracking"]) == 0, capsys.readouterr().err[-3000:]


@pytest.mark.slow
def test_documented_inspect_cli_commands_run(tmp_path, monkeypatch):
    from inspect_ai._cli.main import inspect as inspect_cli
    from inspect_ai.log import list_eval_logs, read_eval_log

    found = [c for c in _doc_commands() if kind(c) == "inspect_eval"]
    assert found
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for number, args in enumerate(found):
        log_dir = tmp_path / f"inspect_cli{number}"
        inspect_cli.main(args=_inspect_eval_small(args, log_dir), standalone_mode=False)
        logs = list_eval_logs(str(log_dir))
        assert len(logs) == 1, (shlex.join(args), logs)
        log = read_eval_log(logs[0], header_only=True)
        assert log.status == "success", (shlex.join(args), log.error)


def test_documented_study_commands_take_their_arguments(monkeypatch, capsys):
    """The after-the-fact study command exists and names the arguments the docs give it (its --help)."""
    import runpy

    found = [c for c in _doc_commands() if kind(c) == "study"]
    assert found
    for args in found:
        monkeypatch.setattr(sys, "argv", [args[2], "--help"])
        with pytest.raises(SystemExit) as exited:
            runpy.run_module(args[2], run_name="__main__", alter_sys=True)
        assert exited.value.code in (0, None), shlex.join(args)
        usage = capsys.readouterr().out.lower()
        for placeholder in args[3:]:
            name = placeholder.strip("<>").lower()
            assert name in usage, f"{shlex.join(args)}: {name!r} is not in its --help:\n{usage}"


def test_documented_rescore_commands_parse_and_name_a_judge():
    """The rescore commands the docs show parse, compose with the app's config and name a judge that can work (they
    need finished logs and a judge to run: `tests/app/test_rescore.py` runs the command on a job's save_dir)."""
    from steer_hydra.app.judge import check_judge
    from steer_hydra.app.rescore import compose_settings, parse_args
    from steer_hydra.tasks.judge import JUDGED_TASKS

    found = [c for c in _doc_commands() if kind(c) == "rescore"]
    assert found
    for args in found:
        _, overrides, _ = parse_args(args[3:])
        judge, _, _ = compose_settings(overrides)
        assert check_judge(judge, JUDGED_TASKS) == JUDGED_TASKS, shlex.join(args)


def test_documented_commands_that_need_a_gpu_or_the_hub_compose_and_plan():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from steer_hydra.app.plan import JobPlan
    from steer_hydra.app.schema import register_configs

    register_configs()
    checked = 0
    for args in _doc_commands():
        if kind(args) != "compose":
            continue
        overrides = [a.split(",")[0] if "," in a and not a.endswith("]") else a for a in args[3:]]
        overrides = [o for o in overrides if not o.startswith("--")]
        GlobalHydra.instance().clear()
        try:
            with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
                cfg = compose("config", overrides=overrides, return_hydra_config=True)  # the launcher's keys too
            with open_dict(cfg):
                del cfg["hydra"]
            JobPlan.from_config(cfg)  # every config mistake that needs no model
        except Exception as error:
            raise AssertionError(f"{shlex.join(args)}: {error}") from error
        finally:
            GlobalHydra.instance().clear()
        checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_documented_arm_yaml_runs_from_a_search_path(tmp_path, monkeypatch, capsys):
    blocks = [body for _, body in _blocks("yaml") if "@package arm" in body]
    assert blocks
    for number, body in enumerate(blocks):
        name = re.search(r"^name: (\S+)", body, re.M).group(1)
        (tmp_path / "my_conf" / "arm").mkdir(parents=True, exist_ok=True)
        (tmp_path / "my_conf" / "arm" / f"{name}.yaml").write_text(body)
        args = [f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", f"arm={name}", "model=tiny", *SMALL]
        out = _main_in_process([*args, f"experiment_name=yaml{number}"], tmp_path, monkeypatch, capsys)
        assert f"{name} [" in out  # the job's table title names the arm


def test_documented_python_examples_parse_and_their_imports_resolve():
    blocks = _blocks("python")
    assert blocks
    failures = []
    for path, body in blocks:
        tree = ast.parse(body)
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        try:
            exec(compile(ast.Module(body=imports, type_ignores=[]), str(path), "exec"), {})
        except ImportError as error:
            failures.append(f"{path.relative_to(ROOT)}: {error}")
    assert not failures, failures


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_point_at_files_and_headings_that_exist():
    broken = []
    for path in documents():
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                prose = re.sub(r"^```.*?^```", "", dest.read_text(), flags=re.M | re.S)
                headings = re.findall(r"^#+ (.+)$", prose, re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_every_docs_page_is_listed_and_opens_with_what_it_covers():
    index = (DOCS / "index.md").read_text()
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"docs/index.md does not link {page.name}"
        first = next(line for line in page.read_text().splitlines()[1:] if line.strip())
        assert first.startswith("This page "), f"{page.name} should open with what it covers; it opens {first!r}"
