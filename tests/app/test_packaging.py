"""conf/ ships in the wheel, the app runs from any directory, and users add groups through Hydra's search path."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from steer_hydra.app.plan import JobPlan
from steer_hydra.app.schema import register_configs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_the_config_groups_the_concepts_and_the_inspect_entry_point(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(ROOT),
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("steer_hydra-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (
        "config.yaml",
        "arm/pasta.yaml",
        "control/caa.yaml",
        "backend/vllm_serve.yaml",
        "suite/smoke.yaml",
        "model/tiny.yaml",
        "logger/wandb.yaml",
        "experiment/pasta_vs_baseline.yaml",
    ):
        assert f"steer_hydra/conf/{path}" in names, path
    from steer_hydra.tasks.concepts import builtin_concepts

    for concept in builtin_concepts():
        assert f"steer_hydra/tasks/concept_data/{concept}.yaml" in names, concept
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[inspect_ai]" in text and "steer_hydra = steer_hydra.app.inspect_entry" in text


def test_the_app_composes_from_any_working_directory(run_app, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_app("arm=pasta", "--cfg", "job", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "_target_: steer_hydra.controls.state.PASTA" in proc.stdout


def test_user_groups_join_through_the_search_path(tmp_path):
    arm_dir = tmp_path / "my_conf" / "arm"
    arm_dir.mkdir(parents=True)
    (arm_dir / "mine.yaml").write_text(
        "# @package arm\ndefaults:\n  - /control@controls.sys: system_prompt\n\nname: mine\n"
        "controls:\n  sys:\n    text: Only answer in French.\n"
    )
    overrides = ["model=tiny", f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "arm=mine"]
    register_configs()
    GlobalHydra.instance().clear()
    # as in the app: the plan is built while Hydra (and so the user's search path) is initialized, which is how
    # the arm's YAML defaults are found for its display name
    try:
        with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            with open_dict(cfg):
                del cfg["hydra"]
            plan = JobPlan.from_config(cfg)
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
    assert plan.arm == "mine" and plan.controls[0].text == "Only answer in French."
